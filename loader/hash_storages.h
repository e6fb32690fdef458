// XXH3-64 of many byte ranges (an archive's storages) on up to one thread per
// core, for verify: one core hashes page-cache bytes at about half of what a
// two-core memcpy moves. No LibTorch.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "loader/byte_range.h"

namespace tsar {

// The hash of each range, in order. Threads take whole ranges from a shared
// counter, so they stay busy whatever the sizes; the result does not depend on
// the thread count.
// `progress(done)` (bytes hashed so far) is called on the calling thread only.
std::vector<uint64_t> HashRanges(const std::vector<ByteRange>& ranges,
                                 const std::function<void(uint64_t)>& progress = {});

}  // namespace tsar
