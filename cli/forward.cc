// The lean `tsar`'s way to LibTorch: none linked (LinkedTorchSide() is null),
// so a pack or export that needs it hands its command line, unchanged, to
// tsar-torch (cli/torch_side.h). tsar-torch lies next to this executable (the
// build tree), or in PREFIX/libexec/tsar/ when installed in PREFIX/bin/.
#include <limits.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
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

#if defined(TSAR_WHEEL_TORCH_DIR) && defined(TSAR_BUILT_FOR_TORCH)
// The torch.__version__ of the torch package at `torch_dir` (its version.py:
// `__version__ = '2.7.1+cu126'`), or "" where there is none to read.
std::string TorchVersionAt(const std::string& torch_dir) {
  std::ifstream in(torch_dir + "/version.py");
  std::string line;
  while (in && line.size() < 4096 && std::getline(in, line)) {
    if (line.rfind("__version__", 0) != 0) continue;
    const size_t open = line.find_first_of("'\"");
    if (open == std::string::npos) return "";
    const size_t close = line.find(line[open], open + 1);
    return close == std::string::npos ? "" : line.substr(open + 1, close - open - 1);
  }
  return "";
}
#endif

// In a wheel, tsar-torch finds LibTorch through a run path into the torch
// package of the environment it is installed in (python/CMakeLists.txt),
// whatever torch that is. Built for another one, it would crash at its first
// call into LibTorch: refused here instead, saying what to do
// (TSAR_WHEEL_TORCH_DIR, relative to the environment, and the version tsar was
// built against are compiled in for a wheel only).
void CheckTheTorchBeside(const std::string& dir, const std::string& command,
                         const std::string& why) {
#if defined(TSAR_WHEEL_TORCH_DIR) && defined(TSAR_BUILT_FOR_TORCH)
  const std::string here = TorchVersionAt(dir + "/../" + TSAR_WHEEL_TORCH_DIR);
  const std::string built = TSAR_BUILT_FOR_TORCH;
  if (here.empty() || here == built) return;
  // The way round that fits the command run: pack reads TorchScript, export
  // writes a torch.save file; the Python package does either with this torch.
  const std::string instead =
      command == "export"
          ? ", or export to .safetensors, which this tsar writes without LibTorch; the "
            "Python package saves the weights as a .pt with this torch: python -c 'import "
            "tsar, torch; torch.save(tsar.load(\"IN.tsar\"), \"OUT.pt\")' (the first "
            "entry's state_dict)"
          : ", or save the weights with torch.save(model.state_dict()) and pack that file; the "
            "Python package packs TorchScript and --arch with this torch: python -c 'import "
            "tsar; tsar.pack(\"IN.pt\", \"OUT.tsar\")' (arch=\"ARCH.pt\" for --arch)";
  throw Error(ErrorCode::kUnsupported, "", std::nullopt,
              "tsar " + command + ": " + why +
                  " runs in tsar-torch, the part of tsar that links LibTorch, built for torch " +
                  built + ", and this environment has torch " + here +
                  ": rebuild tsar here (pip install --force-reinstall --no-deps <tsar source>), "
                  "install torch " +
                  built.substr(0, built.find('+')) + instead);
#else
  (void)dir, (void)command, (void)why;
#endif
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
  CheckTheTorchBeside(dir, command, why);
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
