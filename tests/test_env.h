// Paths the C++ tests need (the tsar command, the fixtures, the source tree),
// read when the tests run from tsar_test_paths.txt beside the test program
// (written by CMake: tests/torch_tests.cmake, tests/CMakeLists.txt), or from
// the environment variable of the same name, which wins. Not compiled in: a
// path in a translation unit is part of its ccache key, and CI builds in a new
// folder each run, so every LibTorch test source would compile again.
#pragma once

#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <map>
#include <string>

namespace tsar::testing {

// NAME=VALUE lines of tsar_test_paths.txt in the folder of this program.
inline const std::map<std::string, std::string>& TestPaths() {
  static const std::map<std::string, std::string> paths = [] {
    std::map<std::string, std::string> out;
    char exe[4096];
    const ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
    if (n <= 0) return out;
    std::string dir(exe, static_cast<size_t>(n));
    dir.resize(dir.rfind('/') + 1);
    std::ifstream in(dir + "tsar_test_paths.txt");
    for (std::string line; std::getline(in, line);) {
      const size_t eq = line.find('=');
      if (eq != std::string::npos) out[line.substr(0, eq)] = line.substr(eq + 1);
    }
    return out;
  }();
  return paths;
}

// $name, else its line in tsar_test_paths.txt, else a path that names what
// is missing (a test then fails on a file that says so).
inline const char* EnvPath(const char* name, const char* unset) {
  const char* v = std::getenv(name);
  if (v != nullptr && *v != '\0') return v;
  const auto& paths = TestPaths();
  const auto it = paths.find(name);
  return it != paths.end() ? it->second.c_str() : unset;
}

}  // namespace tsar::testing

#define TSAR_TEST_ENV_PATH(name) \
  ::tsar::testing::EnvPath(#name, "/nonexistent/" #name "-not-in-tsar_test_paths.txt")
#define TSAR_FIXTURES_DIR TSAR_TEST_ENV_PATH(TSAR_FIXTURES_DIR)
#define TSAR_TEST_WORKER TSAR_TEST_ENV_PATH(TSAR_TEST_WORKER)
#define TSAR_SAMPLE_WORKER TSAR_TEST_ENV_PATH(TSAR_SAMPLE_WORKER)
#define TSAR_REFUSE_MMAP TSAR_TEST_ENV_PATH(TSAR_REFUSE_MMAP)
#define TSAR_SOURCE_DIR TSAR_TEST_ENV_PATH(TSAR_SOURCE_DIR)
#define TSAR_IMPORT_FIXTURES_DIR TSAR_TEST_ENV_PATH(TSAR_IMPORT_FIXTURES_DIR)
#define TSAR_CLI TSAR_TEST_ENV_PATH(TSAR_CLI)
#define TSAR_PYTHON_EXE TSAR_TEST_ENV_PATH(TSAR_PYTHON_EXE)
#define TSAR_SAMPLES_DIR TSAR_TEST_ENV_PATH(TSAR_SAMPLES_DIR)
