// XXH3-64 wrappers over libxxhash (spec/FORMAT.md §4.1, §4.4).
#include "format/checksum.h"

#include <xxhash.h>
// libxxhash's own runtime dispatch (Debian's build exports it): XXH3 with
// AVX2 or AVX-512 where the CPU has them, about twice the SSE2 rate the
// library's plain entry points are compiled for. Not with XXH_INLINE_ALL
// (scripts/gpu-deps.sh's header-only build), which compiles XXH3 for the
// build's own target.
#if defined(__x86_64__) && !defined(XXH_INLINE_ALL) && __has_include(<xxh_x86dispatch.h>)
#include <xxh_x86dispatch.h>
#endif

#include <new>

#include "format/spec.h"

namespace tsar::format {

uint64_t Xxh3(const void* data, size_t size) { return XXH3_64bits(data, size); }

Hash128 Xxh3x128(const void* data, size_t size) {
  const XXH128_hash_t h = XXH3_128bits(data, size);
  return {h.low64, h.high64};
}

uint64_t IndexChecksum(const uint8_t* head, uint64_t index_end) {
  Xxh3Stream s;
  s.Update(head, kOffIndexXxh3);
  s.Update(head + kOffIndexXxh3 + 8, static_cast<size_t>(index_end - (kOffIndexXxh3 + 8)));
  return s.Digest();
}

Xxh3Stream::Xxh3Stream() : state_(XXH3_createState()) {
  if (state_ == nullptr) throw std::bad_alloc();
  XXH3_64bits_reset(static_cast<XXH3_state_t*>(state_));
}
Xxh3Stream::~Xxh3Stream() { XXH3_freeState(static_cast<XXH3_state_t*>(state_)); }
void Xxh3Stream::Update(const void* data, size_t size) {
  XXH3_64bits_update(static_cast<XXH3_state_t*>(state_), data, size);
}
uint64_t Xxh3Stream::Digest() const {
  return XXH3_64bits_digest(static_cast<const XXH3_state_t*>(state_));
}

}  // namespace tsar::format
