// What `tsar pack` needs LibTorch for: reading TorchScript archives
// (torch::jit::load) and writing --arch files (writer/architecture.h). Linked
// into tsar-torch and the Python package only; the rest of the packer is
// Torch-free and reaches these through PackFilesOptions::torch.
#pragma once

#include <string>

#include "writer/importer.h"
#include "writer/pack_files.h"

namespace tsar::writer {

// The parameters and buffers of a TorchScript module, in state_dict() order,
// as one entry (options.default_entry). Throws kBadInput for a file that
// torch::jit::load cannot read or a module without weights.
importer::Imported ImportTorchScript(const std::string& path,
                                     const importer::ImportOptions& options);

// Both of the above, for PackFilesOptions::torch.
TorchSupport LibTorchSupport();

}  // namespace tsar::writer
