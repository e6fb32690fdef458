// A bounds-checked view of file bytes that raises tsar::Error naming the file,
// the absolute offset and the spec field. All decoding goes through it.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "format/endian.h"
#include "tsar/error.h"

namespace tsar::format {

class ByteReader {
 public:
  // `data` holds the file's bytes [0, size); offsets are absolute file offsets.
  ByteReader(const uint8_t* data, uint64_t size, const std::string& path)
      : data_(data), size_(size), path_(path) {}

  uint64_t size() const { return size_; }
  const std::string& path() const { return path_; }
  const uint8_t* data() const { return data_; }

  // Throws kTruncated unless [off, off + n) lies inside the bytes.
  void Require(uint64_t off, uint64_t n, const std::string& field) const {
    if (off > size_ || n > size_ - off) {
      throw Error::Field(ErrorCode::kTruncated, path_, off, field, std::to_string(n) + " bytes",
                         Available(off));
    }
  }
  uint8_t U8(uint64_t off, const std::string& field) const {
    Require(off, 1, field);
    return data_[off];
  }
  uint16_t U16(uint64_t off, const std::string& field) const {
    Require(off, 2, field);
    return LoadU16(data_ + off);
  }
  uint32_t U32(uint64_t off, const std::string& field) const {
    Require(off, 4, field);
    return LoadU32(data_ + off);
  }
  uint64_t U64(uint64_t off, const std::string& field) const {
    Require(off, 8, field);
    return LoadU64(data_ + off);
  }

  // The one way to raise a decode error: "<path>: offset <off>: <field>:
  // expected <expected>, found <found>".
  [[noreturn]] void Fail(ErrorCode code, uint64_t off, const std::string& field,
                         const std::string& expected, const std::string& found) const {
    throw Error::Field(code, path_, off, field, expected, found);
  }

 private:
  std::string Available(uint64_t off) const {
    return off >= size_ ? std::string("end of data") : std::to_string(size_ - off) + " bytes";
  }

  const uint8_t* data_;
  uint64_t size_;
  const std::string& path_;
};

// Checked 64-bit arithmetic on values read from a file (§6.1; R50-R52 use it).
inline bool CheckedAdd(uint64_t a, uint64_t b, uint64_t* out) {
  return !__builtin_add_overflow(a, b, out);
}
inline bool CheckedMul(uint64_t a, uint64_t b, uint64_t* out) {
  return !__builtin_mul_overflow(a, b, out);
}

// Hex dump of up to 16 bytes, "89 54 53 ...", for messages about raw bytes.
std::string HexBytes(const uint8_t* p, size_t n);
// A name quoted for messages: printable ASCII kept, other bytes as \xNN, cut at 80.
std::string Quote(std::string_view s);
// A byte count for people: "812 B", "1.5 MiB" (1024-based units up to ZiB).
std::string HumanBytes(uint64_t n);
std::string HumanBytes(double n);  // for sizes past 2^64 (logical bytes of broadcast views)
// True when s is well-formed UTF-8 (no overlongs, no surrogates, <= U+10FFFF).
bool IsValidUtf8(std::string_view s);
// §4.11 R97: '/'-separated names, none empty, no NUL, not starting with '/'.
bool IsRelativePath(std::string_view s);

}  // namespace tsar::format
