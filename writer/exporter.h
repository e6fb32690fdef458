// Exporters of `tsar export`: an archive back to the formats people exchange
// (torch.save zip, safetensors, HDF5 as h5py lays it out). Each writes
// atomically (writer/atomic_file.h) and round-trips exactly.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "tsar/archive_file.h"

namespace tsar::exporter {

enum class Format { kTorchSave, kSafetensors, kHdf5 };

struct ExportOptions {
  // safetensors forbids shared storage: write each aliasing tensor as its own
  // copy instead of refusing.
  bool materialize_shared = false;
  // Writes a torch.save zip: it needs LibTorch's zip writer, so it is
  // ExportTorchSave (below) where LibTorch is linked (tsar-torch, the Python
  // package) and unset elsewhere, where Format::kTorchSave is kUnsupported.
  std::function<std::vector<std::string>(const ArchiveFile&, const std::string&)> torch_save;
};

// Picks the format from the extension (.pt .pth .bin / .safetensors / .h5
// .hdf5); kInvalidArgument otherwise.
Format FormatFromPath(const std::string& path);
Format FormatFromName(const std::string& name);  // "pt", "safetensors", "h5"

// Writes `archive` to `path`. Returns notes (one line each) on what could not
// be represented and was left out. Throws kUnsupported naming the tensor when
// the target format cannot hold it (e.g. bfloat16 in HDF5), kInvalidArgument
// for aliasing tensors in safetensors without materialize_shared, kIo.
std::vector<std::string> Export(const ArchiveFile& archive, const std::string& path, Format format,
                                const ExportOptions& options = {});

// The torch.save exporter (export_pt.cc, with LibTorch): for
// ExportOptions::torch_save.
std::vector<std::string> ExportTorchSave(const ArchiveFile& archive, const std::string& path);

}  // namespace tsar::exporter
