// `tsar export ARCHIVE -o OUT`: back to torch.save (.pt), safetensors or HDF5.
#include "cli/commands.h"
#include "cli/common.h"
#include "cli/describe.h"
#include "writer/exporter.h"

namespace tsar::cli {
namespace {

struct ExportArgs {
  std::string archive, output, format;
  bool materialize_shared = false;
  bool no_verify = false;
  bool quiet = false;
};

int RunExport(const ExportArgs& a) {
  const exporter::Format f =
      a.format.empty() ? exporter::FormatFromPath(a.output) : exporter::FormatFromName(a.format);
  exporter::ExportOptions o;
  o.materialize_shared = a.materialize_shared;
  const Archive archive = OpenArchive(a.archive);
  if (!a.no_verify) {
    // A damaged archive would be exported as it is, and the new file's own
    // checksums (or none) would then vouch for the damage.
    try {
      archive.verify();
    } catch (const Error& e) {
      throw Error(e.code(), "", std::nullopt,
                  std::string(e.what()) + " (export --no-verify writes it as it is)");
    }
  }
  const auto notes = exporter::Export(archive, a.output, f, o);
  if (!a.quiet) {
    for (const auto& n : notes) std::fprintf(stderr, "tsar: note: %s\n", n.c_str());
    std::printf("exported %zu tensors to %s\n", archive.infos().size(), a.output.c_str());
  }
  return kExitOk;
}

}  // namespace

Run AddExport(CLI::App& app) {
  auto args = std::make_shared<ExportArgs>();
  CLI::App* sub =
      app.add_subcommand("export", "Write an archive as torch.save (.pt), safetensors or HDF5");
  sub->add_option("archive", args->archive, "The .tsar file")->required();
  sub->add_option("-o,--output", args->output, "Output file; its extension picks the format")
      ->required();
  sub->add_option("--format", args->format, "pt, safetensors or h5 (overrides the extension)");
  sub->add_flag("--materialize-shared", args->materialize_shared,
                "safetensors only: write tensors that share storage as separate copies\n(default: "
                "refuse, naming them)");
  sub->add_flag("--no-verify", args->no_verify,
                "Skip checking every storage's checksum first (default: a damaged archive is\n"
                "refused, naming the damaged tensors)");
  sub->add_flag("-q,--quiet", args->quiet, "No notes or summary");
  sub->footer(
      "Formats:\n"
      "  .pt/.pth/.bin  torch.load reads it; shared storages stay shared; one entry gives a\n"
      "                 state_dict (OrderedDict with _metadata), several a dict of them + "
      "metadata\n"
      "  .safetensors   one flat namespace (entry/name with several entries); string metadata\n"
      "  .h5/.hdf5      h5py layout: dotted names as groups, metadata as attributes\n"
      "Examples:\n"
      "  tsar export model.tsar -o model.pt\n"
      "  tsar export model.tsar -o model.safetensors --materialize-shared");
  return [args] { return RunExport(*args); };
}

}  // namespace tsar::cli
