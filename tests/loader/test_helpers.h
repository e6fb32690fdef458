// Helpers for loader/writer tests: temp dirs, fixture paths, /proc readers.
#pragma once

// AddressSanitizer builds (GCC defines __SANITIZE_ADDRESS__, clang answers
// __has_feature): ASan handles SIGSEGV itself, before any handler of ours.
#if defined(__SANITIZE_ADDRESS__)
#define TSAR_UNDER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define TSAR_UNDER_ASAN 1
#endif
#endif
#ifndef TSAR_UNDER_ASAN
#define TSAR_UNDER_ASAN 0
#endif

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "tests/test_env.h"
#include "tsar/error.h"

namespace tsar::testing {

inline std::string TempDir() {
  char tmpl[] = "/tmp/tsar-test-XXXXXX";
  const char* d = mkdtemp(tmpl);
  if (!d) std::abort();
  return d;
}

// A test with a temporary directory of its own, removed afterwards.
class TempDirTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = TempDir(); }
  void TearDown() override { std::system(("rm -rf " + dir_).c_str()); }
  std::string Path(const std::string& name) const { return dir_ + "/" + name; }
  std::string dir_;
};

inline std::string Fixture(const std::string& name) {
  return std::string(TSAR_FIXTURES_DIR) + "/" + name;
}

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
    if (line.size() < want.size() ||
        line.compare(line.size() - want.size(), want.size(), want) != 0)
      continue;
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
    if (!line.empty() && std::isxdigit(static_cast<unsigned char>(line[0])) &&
        line.find('-') < 17) {
      inside = line.size() >= path.size() &&
               line.compare(line.size() - path.size(), path.size(), path) == 0;
      continue;
    }
    if (inside && line.rfind(field + ":", 0) == 0)
      sum += std::strtoull(line.c_str() + field.size() + 1, nullptr, 10);
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

// --- child processes --------------------------------------------------------

// The exit code and output of a shell command.
struct Result {
  int code;
  std::string out, err;
};

inline Result Sh(const std::string& cmd) {
  const std::string dir = TempDir();
  const std::string full = "(" + cmd + ") > " + dir + "/out 2> " + dir + "/err";
  const int status = std::system(full.c_str());
  Result r{WIFEXITED(status) ? WEXITSTATUS(status) : -1, ReadAll(dir + "/out"),
           ReadAll(dir + "/err")};
  std::system(("rm -rf " + dir).c_str());
  return r;
}

// The CLI's error convention: one line on stderr, prefixed "tsar: ", naming `needle`.
inline ::testing::AssertionResult OneErrorLine(const Result& r, const std::string& needle) {
  if (r.err.rfind("tsar: ", 0) != 0) return ::testing::AssertionFailure() << "stderr: " << r.err;
  if (std::count(r.err.begin(), r.err.end(), '\n') != 1) {
    return ::testing::AssertionFailure() << "not one line: " << r.err;
  }
  if (r.err.find(needle) == std::string::npos) {
    return ::testing::AssertionFailure() << "lacks " << needle << ": " << r.err;
  }
  return ::testing::AssertionSuccess();
}

// A child process with a pipe to its stdin and one from its stdout (e.g.
// tsar_test_worker --hold, which keeps its mapping until stdin closes).
struct Worker {
  pid_t pid = -1;
  int to_child = -1;
  FILE* from_child = nullptr;
};

// Starts argv[0] with `argv`, optionally as user `uid` (needs root).
inline Worker Start(const std::vector<std::string>& argv, uid_t uid = 0) {
  int in[2], out[2];
  // Close-on-exec, so a later child does not hold an earlier child's stdin open.
  if (pipe2(in, O_CLOEXEC) != 0 || pipe2(out, O_CLOEXEC) != 0) std::abort();
  Worker w;
  w.pid = fork();
  if (w.pid == 0) {
    dup2(in[0], 0);
    dup2(out[1], 1);
    if (uid != 0 && (setgid(uid) != 0 || setuid(uid) != 0)) _exit(125);
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execv(args[0], args.data());
    _exit(127);
  }
  close(in[0]);
  close(out[1]);
  w.to_child = in[1];
  w.from_child = fdopen(out[0], "r");
  return w;
}

// The child's next line of output ("" at end of file).
inline std::string Line(Worker& w) {
  char buf[256] = {0};
  if (!std::fgets(buf, sizeof buf, w.from_child)) return "";
  return buf;
}

// Closes the child's stdin and waits; its exit code, or -1 if killed.
inline int Finish(Worker& w) {
  close(w.to_child);
  fclose(w.from_child);
  int status = 0;
  waitpid(w.pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

}  // namespace tsar::testing
