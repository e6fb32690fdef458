// The lean `tsar`'s way to LibTorch: none linked (LinkedTorchSide() is null),
// so a pack or export that needs it hands its command line, unchanged, to
// tsar-torch (cli/torch_side.h). tsar-torch lies next to this executable (the
// build tree), or in PREFIX/libexec/tsar/ when installed in PREFIX/bin/.
#include <limits.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

#include "cli/common.h"
#include "cli/torch_side.h"
#include "tsar/error.h"

namespace tsar::cli {
namespace {

std::string SelfDirectory() {
  char buf[PATH_MAX];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) return ".";
  const std::string self(buf, static_cast<size_t>(n));
  return self.substr(0, self.rfind('/'));
}

}  // namespace

const TorchSide* LinkedTorchSide() { return nullptr; }

void ForwardToTorchSide(const std::string& command, const std::string& why) {
#ifdef TSAR_NO_TORCH_SIDE
  throw Error(ErrorCode::kUnsupported, "", std::nullopt,
              "tsar " + command + ": " + why +
                  " needs LibTorch, and this tsar was built without it (-DTSAR_WITH_TORCH=OFF)");
#endif
  const std::string dir = SelfDirectory();
  const std::vector<std::string> candidates = {dir + "/tsar-torch",
                                               dir + "/../libexec/tsar/tsar-torch"};
  std::vector<char*> argv;
  for (const std::string& a : CommandLine()) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  std::fflush(stdout);
  std::fflush(stderr);
  int err = ENOENT;
  for (const std::string& path : candidates) {
    execv(path.c_str(), argv.data());  // returns only on failure
    if (errno != ENOENT) err = errno;
  }
  throw Error(ErrorCode::kIo, "", std::nullopt,
              "tsar " + command + ": " + why +
                  " runs in tsar-torch, the part of tsar that links LibTorch, and it could not "
                  "be started (" +
                  std::strerror(err) + "; looked for " + candidates[0] + " and " + candidates[1] +
                  "): is tsar installed completely?");
}

}  // namespace tsar::cli
