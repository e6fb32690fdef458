// pack and export, the commands whose work may need LibTorch: their parsed
// arguments and the entry points that do the work (cli/pack_run.cc,
// cli/export_run.cc, in both executables). Most of it needs no LibTorch and
// runs in `tsar` itself; what does (a TorchScript input, --arch, export to
// .pt) comes from LinkedTorchSide() in tsar-torch (cli/torch_linked.cc). In
// `tsar` there is none (cli/forward.cc), and such a command hands its whole
// command line to tsar-torch with ForwardToTorchSide.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "writer/exporter.h"
#include "writer/pack_files.h"

namespace tsar::cli {

struct PackArgs {
  std::vector<std::string> inputs;
  std::vector<std::string> entries;  // NAME=FILE
  std::vector<std::string> meta;     // KEY=VALUE
  std::vector<std::string> only, exclude;
  std::string strip_prefix;
  std::string dtype;  // "" = as they are
  std::string arch;   // --arch FILE
  std::string base;   // --base FILE: write a layer over it
  uint32_t tp = 0;                  // --tp W
  std::vector<std::string> shard;   // --shard PATTERN=DIM
  std::string shard_plan;           // --shard-plan FILE
  bool flatten = false;
  std::string output;
  uint32_t align = 4096;
  bool strict = false;
  bool follow_symlinks = false;  // --follow-symlinks
  bool quiet = false;
};

struct ExportArgs {
  std::string archive, output, format;
  bool materialize_shared = false;
  bool no_verify = false;
  bool quiet = false;
};

int RunPack(const PackArgs& args);
int RunExport(const ExportArgs& args);

// What LibTorch does for pack and export, where it is linked.
struct TorchSide {
  TorchSupport pack;
  std::function<std::vector<std::string>(const ArchiveFile&, const std::string&)> export_torch_save;
};
// tsar-torch: its TorchSide. tsar: nullptr.
const TorchSide* LinkedTorchSide();
// tsar: runs this process's command line in tsar-torch instead (execv; never
// returns), or throws (kUnsupported in a build without LibTorch, kIo when
// tsar-torch cannot be started). `why` says what needs LibTorch.
[[noreturn]] void ForwardToTorchSide(const std::string& command, const std::string& why);

// The command line of this process (set by main()), for the forward to
// tsar-torch.
void SetCommandLine(int argc, char** argv);
const std::vector<std::string>& CommandLine();

}  // namespace tsar::cli
