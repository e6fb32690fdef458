// The index checksum fix-up shared by the fuzz harnesses (no LibTorch, so
// the format-only decode fuzzer uses it too).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "format/checksum.h"
#include "format/endian.h"
#include "format/spec.h"

namespace tsar::fuzz {

// `data` with its header's index checksum recomputed, or empty when the
// header's index range does not lie in the file. A random mutation almost
// never keeps the checksum right: without this the fuzzer stops at R15.
inline std::vector<uint8_t> WithIndexChecksum(const uint8_t* data, size_t size) {
  namespace f = tsar::format;
  if (size < f::kHeaderSize) return {};
  const uint64_t index_offset = f::LoadU64(data + f::kOffIndexOffset);
  const uint64_t index_size = f::LoadU64(data + f::kOffIndexSize);
  if (index_offset < f::kOffIndexXxh3 + 8 || index_offset > size ||
      index_size > size - index_offset) {
    return {};
  }
  std::vector<uint8_t> fixed(data, data + size);
  f::StoreU64(fixed.data() + f::kOffIndexXxh3,
              f::IndexChecksum(fixed.data(), index_offset + index_size));
  return fixed;
}

}  // namespace tsar::fuzz
