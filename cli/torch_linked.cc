// tsar-torch's LibTorch side of pack and export (cli/torch_side.h): the
// TorchScript importer, --arch and the torch.save exporter, linked in.
#include <cstdio>
#include <cstdlib>

#include "cli/torch_side.h"
#include "writer/torchscript.h"

namespace tsar::cli {

const TorchSide* LinkedTorchSide() {
  static const TorchSide side{writer::LibTorchSupport(), exporter::ExportTorchSave};
  return &side;
}

void ForwardToTorchSide(const std::string& command, const std::string& why) {
  // Unreachable: with LibTorch linked, nothing is forwarded.
  std::fprintf(stderr, "tsar-torch %s: asked to forward (%s)\n", command.c_str(), why.c_str());
  std::abort();
}

}  // namespace tsar::cli
