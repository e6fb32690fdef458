// Helpers for loader/writer tests: temp dirs, fixture paths, /proc readers.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <climits>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "tsar/error.h"

namespace tsar::testing {

inline std::string TempDir() {
  char tmpl[] = "/tmp/tsar-test-XXXXXX";
  const char* d = mkdtemp(tmpl);
  if (!d) std::abort();
  return d;
}

inline std::string Fixture(const std::string& name) { return std::string(TSAR_FIXTURES_DIR) + "/" + name; }

inline std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

inline void WriteAll(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

inline std::vector<float> ReadFloats(const std::string& path) {
  const std::string b = ReadAll(path);
  std::vector<float> v(b.size() / 4);
  std::memcpy(v.data(), b.data(), v.size() * 4);
  return v;
}

// Address ranges of this process's mappings of `path` (from /proc/self/maps).
inline std::vector<std::pair<uintptr_t, uintptr_t>> MappedRanges(const std::string& path) {
  std::ifstream maps("/proc/self/maps");
  std::vector<std::pair<uintptr_t, uintptr_t>> out;
  std::string line;
  char real[PATH_MAX];
  const std::string want = realpath(path.c_str(), real) ? real : path;
  while (std::getline(maps, line)) {
    if (line.size() < want.size() || line.compare(line.size() - want.size(), want.size(), want) != 0) continue;
    uintptr_t lo = 0, hi = 0;
    std::sscanf(line.c_str(), "%lx-%lx", &lo, &hi);
    out.emplace_back(lo, hi);
  }
  return out;
}

inline bool InRanges(const void* p, const std::vector<std::pair<uintptr_t, uintptr_t>>& r) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  for (const auto& [lo, hi] : r) {
    if (a >= lo && a < hi) return true;
  }
  return false;
}

// Sums a field (kB) of /proc/PID/smaps over mappings of `path`.
inline uint64_t SmapsField(pid_t pid, const std::string& path, const std::string& field) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/smaps");
  std::string line;
  bool inside = false;
  uint64_t sum = 0;
  while (std::getline(in, line)) {
    if (!line.empty() && std::isxdigit(static_cast<unsigned char>(line[0])) && line.find('-') < 17) {
      inside = line.size() >= path.size() && line.compare(line.size() - path.size(), path.size(), path) == 0;
      continue;
    }
    if (inside && line.rfind(field + ":", 0) == 0) sum += std::strtoull(line.c_str() + field.size() + 1, nullptr, 10);
  }
  return sum;
}

template <typename F>
::testing::AssertionResult Throws(F&& f, ErrorCode code, const std::string& needle = "") {
  try {
    f();
  } catch (const Error& e) {
    if (e.code() != code) {
      return ::testing::AssertionFailure() << "code " << ErrorCodeName(e.code()) << " (wanted "
                                           << ErrorCodeName(code) << "): " << e.what();
    }
    if (!needle.empty() && std::string(e.what()).find(needle) == std::string::npos) {
      return ::testing::AssertionFailure() << "message lacks \"" << needle << "\": " << e.what();
    }
    return ::testing::AssertionSuccess();
  }
  return ::testing::AssertionFailure() << "no tsar::Error";
}

}  // namespace tsar::testing
