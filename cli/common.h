// Shared pieces of the tsar command line: exit codes, error printing,
// human-readable sizes and the terminal progress bar.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "format/reader.h"
#include "tsar/error.h"

namespace tsar::cli {

// Exit codes (docs/cli.md, "Exit codes of tsar"): stable for scripts.
inline constexpr int kExitOk = 0;
inline constexpr int kExitCheckFailed = 1;  // verify found damage, diff found differences
inline constexpr int kExitUsage = 2;        // bad command line
inline constexpr int kExitBadInput = 3;     // unreadable or invalid input, I/O errors

using format::HumanBytes;  // "1.5 MiB", "812 B" (format/reader.h)
// Prints "tsar: <what>" on one line to stderr.
void PrintError(const std::string& what);
// The exit code for an error: 2 for kInvalidArgument, else 3.
int ExitCodeFor(const Error& e);

// A one-line progress bar on stderr, drawn only when stderr is a terminal
// and the job is large enough to be worth watching; silent otherwise.
class Progress {
 public:
  Progress(std::string label, uint64_t total, bool enabled);
  ~Progress();
  void Update(uint64_t done);
  void Done();

 private:
  std::string label_;
  uint64_t total_;
  bool enabled_;
  int last_permille_ = -1;
  double start_;
};

}  // namespace tsar::cli
