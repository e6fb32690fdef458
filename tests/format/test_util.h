// Helpers shared by the format tests: parse bytes, assert an error's code and offset.
#pragma once

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "format/index.h"
#include "tsar/error.h"

namespace tsar::testing {

inline format::Index ParseString(const std::string& bytes, const std::string& path = "t.tsar") {
  return format::Index::ParseBytes(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(),
                                   path);
}

// Runs `f` and checks it throws tsar::Error with `code` (and `offset`, if given).
template <typename F>
::testing::AssertionResult ThrowsTsar(F&& f, ErrorCode code, std::optional<uint64_t> offset = {}) {
  try {
    f();
  } catch (const Error& e) {
    if (e.code() != code) {
      return ::testing::AssertionFailure() << "code " << ErrorCodeName(e.code()) << ", wanted "
                                           << ErrorCodeName(code) << ": " << e.what();
    }
    if (offset && e.offset() != offset) {
      return ::testing::AssertionFailure() << "offset " << e.offset().value_or(UINT64_MAX)
                                           << ", wanted " << *offset << ": " << e.what();
    }
    return ::testing::AssertionSuccess();
  }
  return ::testing::AssertionFailure() << "no tsar::Error thrown";
}

}  // namespace tsar::testing
