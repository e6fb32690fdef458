// `tsar export ARCHIVE -o OUT`: its command line (RunExport, in
// cli/export_run.cc, writes torch.save (.pt), safetensors or HDF5).
#include "cli/commands.h"
#include "cli/torch_side.h"

namespace tsar::cli {

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
      "torchao quantized tensors (tensor groups) go to .safetensors in torchao's layout\n"
      "(what transformers' save_pretrained writes with TorchAoConfig) and to .pt as\n"
      "torch.save pickles them; .h5 refuses them.\n"
      "Examples:\n"
      "  tsar export model.tsar -o model.pt\n"
      "  tsar export model.tsar -o model.safetensors --materialize-shared");
  return [args] { return RunExport(*args); };
}

}  // namespace tsar::cli
