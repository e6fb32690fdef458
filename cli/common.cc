// Exit codes, errors, sizes and the progress bar of the tsar command line.
#include "cli/common.h"

#include <unistd.h>

#include <chrono>

#include "cli/torch_side.h"

namespace tsar::cli {
namespace {
double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
}  // namespace

void PrintError(const std::string& what) { std::fprintf(stderr, "tsar: %s\n", what.c_str()); }

int ExitCodeFor(const Error& e) {
  return e.code() == ErrorCode::kInvalidArgument ? kExitUsage : kExitBadInput;
}

Progress::Progress(std::string label, uint64_t total, bool enabled)
    : label_(std::move(label)),
      total_(total),
      enabled_(enabled && isatty(STDERR_FILENO) && total >= (64u << 20)),
      start_(Now()) {}

Progress::~Progress() { Done(); }

void Progress::Update(uint64_t done) {
  if (!enabled_ || total_ == 0) return;
  const int permille = static_cast<int>(done * 1000 / total_);
  if (permille == last_permille_) return;
  last_permille_ = permille;
  const int width = 30, filled = permille * width / 1000;
  const double secs = Now() - start_;
  const double rate = secs > 0 ? static_cast<double>(done) / secs : 0;
  std::fprintf(stderr, "\r%s [%.*s%*s] %5.1f%% %s/s ", label_.c_str(), filled,
               "##############################", width - filled, "", permille / 10.0,
               HumanBytes(static_cast<uint64_t>(rate)).c_str());
  std::fflush(stderr);
}

void Progress::Done() {
  if (enabled_ && last_permille_ >= 0) {
    std::fprintf(stderr, "\r\033[K");
    std::fflush(stderr);
  }
  enabled_ = false;
}

namespace {
std::vector<std::string>& Args() {
  static std::vector<std::string> args;
  return args;
}
}  // namespace

void SetCommandLine(int argc, char** argv) { Args().assign(argv, argv + argc); }
const std::vector<std::string>& CommandLine() { return Args(); }

}  // namespace tsar::cli
