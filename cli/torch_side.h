// The commands whose work needs LibTorch today (pack, export): their parsed
// arguments, and the entry points that do the work. The `tsar` executable
// parses and validates their command lines like any other, then hands the
// same command line to tsar-torch (cli/forward.cc), which links LibTorch and
// runs them (cli/pack_run.cc, cli/export_run.cc): `tsar inspect` and the
// other commands never load LibTorch.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tsar::cli {

struct PackArgs {
  std::vector<std::string> inputs;
  std::vector<std::string> entries;  // NAME=FILE
  std::vector<std::string> meta;     // KEY=VALUE
  std::vector<std::string> only, exclude;
  std::string strip_prefix;
  std::string dtype;  // "" = as they are
  std::string arch;   // --arch FILE
  std::string output;
  uint32_t align = 4096;
  bool strict = false;
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

// The command line of this process (set by main()), for the forward to
// tsar-torch.
void SetCommandLine(int argc, char** argv);
const std::vector<std::string>& CommandLine();

}  // namespace tsar::cli
