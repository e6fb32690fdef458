// `tsar export` on the LibTorch side (tsar-torch): an archive back to
// torch.save (.pt), safetensors or HDF5.
#include <c10/util/Exception.h>

#include "cli/common.h"
#include "cli/describe.h"
#include "cli/torch_side.h"
#include "tsar/archive.h"
#include "writer/exporter.h"

namespace tsar::cli {
namespace {

int Export(const ExportArgs& a) {
  const exporter::Format f =
      a.format.empty() ? exporter::FormatFromPath(a.output) : exporter::FormatFromName(a.format);
  exporter::ExportOptions o;
  o.materialize_shared = a.materialize_shared;
  const Archive archive = OpenAs<Archive>(a.archive);
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

int RunExport(const ExportArgs& a) {
  try {
    return Export(a);
  } catch (const c10::Error& e) {
    throw Error(ErrorCode::kBadInput, "", std::nullopt, e.what_without_backtrace());
  }
}

}  // namespace tsar::cli
