// A run of bytes in memory (an archive's mapping): what verify hashes and
// read-ahead reads.
#pragma once

#include <cstdint>

namespace tsar {

struct ByteRange {
  const uint8_t* data;
  uint64_t size;
};

}  // namespace tsar
