// `tsar export`: an archive back to torch.save (.pt), safetensors or HDF5.
// `tsar` writes safetensors and HDF5 itself, without LibTorch; a .pt goes to
// tsar-torch (cli/torch_side.h), whose zip writer is LibTorch's.
#include "cli/common.h"
#include "cli/describe.h"
#include "cli/torch_side.h"
#include "tsar/archive_file.h"
#include "writer/exporter.h"

namespace tsar::cli {

int RunExport(const ExportArgs& a) {
  const exporter::Format f =
      a.format.empty() ? exporter::FormatFromPath(a.output) : exporter::FormatFromName(a.format);
  exporter::ExportOptions o;
  o.materialize_shared = a.materialize_shared;
  if (f == exporter::Format::kTorchSave) {
    const TorchSide* torch = LinkedTorchSide();
    if (!torch) ForwardToTorchSide("export", "writing a torch.save file");
    o.torch_save = torch->export_torch_save;
  }
  const ArchiveFile archive = OpenArchive(a.archive);
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

}  // namespace tsar::cli
