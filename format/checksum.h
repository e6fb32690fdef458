// XXH3-64 (seed 0) as used by spec/FORMAT.md §4.1 (index_xxh3) and §4.4 (storage xxh3).
#pragma once

#include <cstddef>
#include <cstdint>

namespace tsar::format {

uint64_t Xxh3(const void* data, size_t size);

// XXH3-128 (seed 0): the identity of a layer's base (§4.11), over its head.
struct Hash128 {
  uint64_t low = 0;
  uint64_t high = 0;
};
Hash128 Xxh3x128(const void* data, size_t size);

// The index checksum of §4.1: XXH3-64 over bytes [0, 56) followed by bytes
// [64, index_end) of the file; `head` holds at least index_end bytes.
uint64_t IndexChecksum(const uint8_t* head, uint64_t index_end);

// Incremental XXH3-64 for storages written or verified in chunks.
class Xxh3Stream {
 public:
  Xxh3Stream();
  ~Xxh3Stream();
  Xxh3Stream(const Xxh3Stream&) = delete;
  Xxh3Stream& operator=(const Xxh3Stream&) = delete;
  void Update(const void* data, size_t size);
  uint64_t Digest() const;

 private:
  void* state_;
};

}  // namespace tsar::format
