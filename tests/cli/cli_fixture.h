// The fixture of the CLI suites: a temporary directory per test and the tsar
// executable run through the shell, with a guard that turns a hang into a
// failure (exit 124) instead of a stuck suite.
#pragma once

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstdlib>
#include <string>

#include "tests/loader/test_helpers.h"

namespace tsar::testing {

class CliFixture : public TempDirTest {
 protected:
  Result Tsar(const std::string& args) const {
    return Sh("timeout 120 " + std::string(TSAR_CLI) + " " + args);
  }
  bool Exists(const std::string& p) const {
    struct stat st;
    return stat(p.c_str(), &st) == 0;
  }
};

}  // namespace tsar::testing
