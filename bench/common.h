// Shared helpers of the benchmark harness (bench/README.md): the sample
// recorder, timing, page-cache eviction, child processes and /proc readers.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

namespace tsar::bench {

// Appends one CSV row per measurement: bench,case,variant,unit,run,value.
// Every field is quoted, so names may hold commas.
class Recorder {
 public:
  explicit Recorder(const std::string& path);
  ~Recorder();
  Recorder(const Recorder&) = delete;
  Recorder& operator=(const Recorder&) = delete;

  void Add(const std::string& bench, const std::string& kase, const std::string& variant,
           const std::string& unit, int run, double value);
  // A fact about the run (file sizes, checksums, eviction checks): bench "info".
  void Info(const std::string& key, const std::string& value);

 private:
  void Row(const std::vector<std::string>& fields);
  std::FILE* out_;
};

// Everything a benchmark needs to know about its surroundings.
struct Context {
  std::string data;    // temp dir holding the generated inputs
  std::string self;    // this executable, for child processes
  std::string tsar;    // the tsar CLI
  double scale = 1.0;  // multiplies repetition counts (--quick uses less)
  Recorder* rec = nullptr;
  std::string Path(const std::string& name) const { return data + "/" + name; }
  int Runs(int n) const { return n * scale < 1 ? 1 : static_cast<int>(n * scale + 0.5); }
};

class Stopwatch {
 public:
  Stopwatch() : t0_(std::chrono::steady_clock::now()) {}
  double Ms() const {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0_)
        .count();
  }
  double Seconds() const { return Ms() / 1000.0; }

 private:
  std::chrono::steady_clock::time_point t0_;
};

constexpr double kMiB = 1024.0 * 1024.0;
constexpr double kGB = 1e9;

uint64_t FileSize(const std::string& path);
// The whole file, read with read(2) into a vector (what a C++ caller of
// torch::pickle_load does before calling it).
std::vector<char> ReadFile(const std::string& path);
void FsyncFile(const std::string& path);

// Pages of the file now in the page cache (mincore on a fresh mapping, which
// reads nothing).
uint64_t ResidentPages(const std::string& path);
uint64_t PageCount(const std::string& path);
// Drops the file from the page cache: sync, then POSIX_FADV_DONTNEED (which
// only drops clean pages), then, if pages remain and we are root,
// drop_caches. Returns the pages still resident (0 on success).
uint64_t EvictFile(const std::string& path);

// Bytes read with 64-bit loads so every byte of [p, p+n) is touched.
uint64_t TouchEveryByte(const void* p, uint64_t n);

// A child process with its stdin and stdout on pipes (or /dev/null).
class Child {
 public:
  // argv[0] is the program path. stdout_to_null: discard its output.
  explicit Child(const std::vector<std::string>& argv, bool stdout_to_null = false);
  ~Child();
  Child(Child&& o) noexcept;
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;

  pid_t pid() const { return pid_; }
  // Next line of its stdout, without the newline; "" at EOF.
  std::string ReadLine();
  // Closes its stdin (our children exit on EOF) and waits. Returns the exit
  // status (128 + signal when killed).
  int Finish();

 private:
  pid_t pid_ = -1;
  int in_ = -1;               // our end of its stdin
  std::FILE* out_ = nullptr;  // our end of its stdout
};

// Runs argv to completion; returns its exit status. Output goes to /dev/null
// unless keep_output.
int RunCommand(const std::vector<std::string>& argv, bool keep_output = false);
// The same, sampling the child's RssAnon (/proc/PID/status) every millisecond:
// *peak_anon_kb is the largest seen, the anonymous memory it used beyond the
// file pages it mapped (a short peak between two samples can be missed).
int RunCommandPeakAnon(const std::vector<std::string>& argv, uint64_t* peak_anon_kb);

// Fields of /proc/PID/smaps_rollup in kB ("Pss", "Rss", "Private_Dirty"...).
std::map<std::string, uint64_t> SmapsRollup(pid_t pid);

// Summed Pss (kB) of the mappings in process pid (/proc/PID/smaps) of files
// whose path starts with `prefix`.
uint64_t MappingPss(pid_t pid, const std::string& prefix);

// "key value" lines into a map (what our child processes print).
std::map<std::string, std::string> ParseKeyValues(const std::string& text);

[[noreturn]] void Die(const std::string& what);

}  // namespace tsar::bench
