// tsar::Error: message formatting per the grammar in ../shared STYLE and spec section 6.
#include "tsar/error.h"

#include <cstdio>

namespace tsar {
namespace {

std::string Compose(const std::string& path, std::optional<uint64_t> offset,
                    const std::string& message) {
  std::string out = path.empty() ? std::string() : path + ": ";
  if (offset) {
    char buf[64];
    std::snprintf(buf, sizeof(buf),
                  "offset %llu (0x%llx): ", static_cast<unsigned long long>(*offset),
                  static_cast<unsigned long long>(*offset));
    out += buf;
  }
  return out + message;
}

}  // namespace

const char* ErrorCodeName(ErrorCode code) noexcept {
  switch (code) {
    case ErrorCode::kIo:
      return "io";
    case ErrorCode::kNotFound:
      return "not_found";
    case ErrorCode::kInvalidArgument:
      return "invalid_argument";
    case ErrorCode::kTruncated:
      return "truncated";
    case ErrorCode::kBadMagic:
      return "bad_magic";
    case ErrorCode::kUnsupportedVersion:
      return "unsupported_version";
    case ErrorCode::kReservedNonZero:
      return "reserved_non_zero";
    case ErrorCode::kOutOfBounds:
      return "out_of_bounds";
    case ErrorCode::kOverlap:
      return "overlap";
    case ErrorCode::kMisaligned:
      return "misaligned";
    case ErrorCode::kOverflow:
      return "overflow";
    case ErrorCode::kBadDtype:
      return "bad_dtype";
    case ErrorCode::kBadShape:
      return "bad_shape";
    case ErrorCode::kDuplicateName:
      return "duplicate_name";
    case ErrorCode::kChecksumMismatch:
      return "checksum_mismatch";
    case ErrorCode::kInvalidValue:
      return "invalid_value";
    case ErrorCode::kBadInput:
      return "bad_input";
    case ErrorCode::kUnsupported:
      return "unsupported";
    case ErrorCode::kBindMismatch:
      return "bind_mismatch";
    case ErrorCode::kBaseMismatch:
      return "base_mismatch";
  }
  return "unknown";
}

Error::Error(ErrorCode code, std::string path, std::optional<uint64_t> offset,
             const std::string& message)
    : std::runtime_error(Compose(path, offset, message)),
      code_(code),
      path_(std::move(path)),
      offset_(offset) {}

Error Error::Field(ErrorCode code, const std::string& path, uint64_t offset,
                   const std::string& field, const std::string& expected,
                   const std::string& found) {
  return Error(code, path, offset, field + ": expected " + expected + ", found " + found);
}

}  // namespace tsar
