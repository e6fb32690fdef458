// `tsar`: pack, inspect and verify tensor archives. Parses the command line,
// runs one subcommand, and maps errors to the documented exit codes. The
// same main() is tsar (no LibTorch: pack and export are handed to tsar-torch,
// cli/forward.cc) and tsar-torch (cli/pack_run.cc, cli/export_run.cc).
#include <algorithm>
#include <map>

#include "cli/commands.h"
#include "cli/common.h"
#include "cli/suggest.h"
#include "cli/torch_side.h"
#include "tsar/version.h"

int main(int argc, char** argv) {
  using namespace tsar::cli;
  SetCommandLine(argc, argv);
  CLI::App app{
      "tsar: the tensor archive. Packs PyTorch weights into one read-only, page-aligned,\n"
      "checksummed file that model servers map zero-copy and share through the page cache.",
      "tsar"};
  app.set_version_flag("--version", "tsar " TSAR_VERSION_STRING " (format " +
                                        std::to_string(TSAR_FORMAT_MAJOR) + "." +
                                        std::to_string(TSAR_FORMAT_MINOR) + ")");
  app.require_subcommand(1, 1);
  app.footer(
      "Examples:\n"
      "  tsar pack model.pt -o model.tsar      # torch.save, TorchScript, safetensors or HDF5 in\n"
      "  tsar inspect model.tsar               # what is inside\n"
      "  tsar verify model.tsar                # check every checksum\n"
      "  tsar export model.tsar -o model.safetensors   # or .pt, .h5\n"
      "  tsar diff old.tsar new.tsar           # same tensors, same bytes?\n"
      "  tsar residency model.tsar             # page cache and the processes sharing it\n"
      "Run `tsar help COMMAND` or `tsar COMMAND --help` for details. Exit codes: 0 ok, 1 check "
      "failed,\n"
      "2 usage, 3 bad or unreadable input.");
  std::map<CLI::App*, Run> runs;
  auto add = [&](Run (*f)(CLI::App&)) {
    const size_t before = app.get_subcommands({}).size();
    Run r = f(app);
    runs[app.get_subcommands({})[before]] = std::move(r);
  };
  add(&AddPack);
  add(&AddInspect);
  add(&AddVerify);
  add(&AddExport);
  add(&AddDiff);
  add(&AddResidency);

  std::vector<std::string> args(argv + 1, argv + argc);
  if (const std::string typo = CheckCommandLine(app, args); !typo.empty()) {
    PrintError(typo);
    return kExitUsage;
  }
  std::reverse(args.begin(), args.end());  // CLI11 takes them last first
  try {
    app.parse(args);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::string help = "tsar --help";
    for (const CLI::App* sub : app.get_subcommands({})) {
      if (sub->parsed()) help = "tsar " + sub->get_name() + " --help";
    }
    PrintError(std::string(e.what()) + " (see `" + help + "`)");
    return kExitUsage;
  }
  try {
    for (CLI::App* sub : app.get_subcommands()) return runs.at(sub)();
  } catch (const tsar::Error& e) {
    PrintError(e.what());
    return ExitCodeFor(e);
  } catch (const std::exception& e) {
    PrintError(e.what());
    return kExitBadInput;
  }
  return kExitUsage;
}
