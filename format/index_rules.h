// The index decoder's shared rules (format/index.cc, format/index_extensions.cc):
// the messages' field names, string references (§2.5, R21-R24) and reserved
// bytes. Internal to the decoder.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>

#include "format/reader.h"
#include "format/spec.h"

namespace tsar::format::detail {

inline std::string Dec(uint64_t v) { return std::to_string(v); }
inline std::string TensorField(uint32_t i, std::string_view name, const char* field) {
  return "tensor #" + Dec(i) + (name.empty() ? "" : " " + Quote(name)) + " " + field;
}

// A field name for messages, built only when a message needs it: `f` is a
// string or a callable returning one.
template <typename F>
std::string Name(const F& f) {
  if constexpr (std::is_invocable_v<const F&>) {
    return f();
  } else {
    return std::string(f);
  }
}

// Reads a string reference (§2.5) into the blob at `off`: R21-R24. `field`
// names the record and the string ("tensor #3 name", "metadata #0 key"); the
// reference's own fields are `field`_offset and `field`_length, as in §4. The
// reference lies inside its record, which R19/R20 proved inside the index.
template <typename F>
std::string_view BlobString(const ByteReader& r, uint64_t off, uint64_t blob_offset,
                            uint64_t blob_size, const F& field, bool utf8) {
  const uint64_t o = LoadU32(r.data() + off);
  const uint64_t n = LoadU32(r.data() + off + 4);
  if (o > blob_size || n > blob_size - o) {  // R21
    r.Fail(ErrorCode::kOutOfBounds, off, Name(field) + "_offset",
           "a range inside the blob of " + Dec(blob_size) + " bytes",
           "offset " + Dec(o) + " length " + Dec(n));
  }
  if (n == 0) {  // R22
    r.Fail(ErrorCode::kInvalidValue, off + 4, Name(field) + "_length", "at least 1", "0");
  }
  if (n > kMaxNameLength) {  // R23
    r.Fail(ErrorCode::kInvalidValue, off + 4, Name(field) + "_length",
           "at most " + Dec(kMaxNameLength), Dec(n));
  }
  std::string_view s(reinterpret_cast<const char*>(r.data() + blob_offset + o), n);
  if (utf8 && !IsValidUtf8(s)) {  // R24
    r.Fail(ErrorCode::kInvalidValue, off, Name(field), "valid UTF-8", Quote(s));
  }
  return s;
}

template <typename F>
void RequireZero(const ByteReader& r, uint64_t off, uint64_t n, const F& field) {
  if (off > r.size() || n > r.size() - off) r.Require(off, n, Name(field));
  for (uint64_t i = 0; i < n; ++i) {
    if (r.data()[off + i] != 0) {
      r.Fail(ErrorCode::kReservedNonZero, off + i, Name(field), "0",
             "0x" + HexBytes(r.data() + off + i, 1));
    }
  }
}

}  // namespace tsar::format::detail
