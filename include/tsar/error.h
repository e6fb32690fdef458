// tsar::Error, the one exception type of the library, and its pinned error codes.
// The codes are listed with the reader-validation rules in spec/FORMAT.md section 6.
#pragma once

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>

namespace tsar {

// Stable error codes. Values are pinned: new codes are appended, none is
// renumbered or reused (spec/FORMAT.md section 6 names them by value).
enum class ErrorCode : int {
  kIo = 1,                  // a system call failed (open, read, mmap, write, rename...)
  kNotFound = 2,            // a named tensor, entry or key does not exist
  kInvalidArgument = 3,     // the caller passed something unusable
  kTruncated = 4,           // the file is shorter than its header says
  kBadMagic = 5,            // not a tsar archive
  kUnsupportedVersion = 6,  // a major version this reader does not know
  kReservedNonZero = 7,     // a reserved field or flag bit is not zero
  kOutOfBounds = 8,         // an offset or length points outside its region
  kOverlap = 9,             // two regions that must be disjoint overlap
  kMisaligned = 10,         // an offset is not on its required boundary
  kOverflow = 11,           // arithmetic on file values overflows 64 bits
  kBadDtype = 12,           // an unknown or unsupported dtype code
  kBadShape = 13,           // a shape, stride or rank that cannot be valid
  kDuplicateName = 14,      // a name appears twice in one scope
  kChecksumMismatch = 15,   // an XXH3-64 checksum does not match the bytes
  kInvalidValue = 16,       // a field holds a value outside its enumeration or rules
  kBadInput = 17,           // a packer input file (.pt, .h5, .safetensors) is malformed
  kUnsupported = 18,        // valid, but not supported by this build (e.g. CUDA)
  kBindMismatch = 19,       // bind(): module and archive do not match
  kBaseMismatch = 20,       // a layer's base file is not the base it was packed against
};

// Short stable name of a code, e.g. "kTruncated" -> "truncated".
const char* ErrorCodeName(ErrorCode code) noexcept;

// The one exception type thrown by tsar. what() is a complete one-line
// message: "<path>: offset <dec> (0x<hex>): <field>: expected <x>, found <y>"
// for errors tied to a byte of a file, "<path>: <message>" otherwise.
class Error : public std::runtime_error {
 public:
  Error(ErrorCode code, std::string path, std::optional<uint64_t> offset,
        const std::string& message);

  // "<path>: offset <o>: <field>: expected <expected>, found <found>".
  static Error Field(ErrorCode code, const std::string& path, uint64_t offset,
                     const std::string& field, const std::string& expected,
                     const std::string& found);

  ErrorCode code() const noexcept { return code_; }
  const std::string& path() const noexcept { return path_; }
  // The absolute file offset the error is about, when it is about one.
  std::optional<uint64_t> offset() const noexcept { return offset_; }

 private:
  ErrorCode code_;
  std::string path_;
  std::optional<uint64_t> offset_;
};

}  // namespace tsar
