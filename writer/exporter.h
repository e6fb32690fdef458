// Exporters of `tsar export`: an archive back to the formats people exchange
// (torch.save zip, safetensors, HDF5 as h5py lays it out). Each writes
// atomically (writer/atomic_file.h) and round-trips exactly.
#pragma once

#include <string>
#include <vector>

#include "tsar/archive.h"

namespace tsar::exporter {

enum class Format { kTorchSave, kSafetensors, kHdf5 };

struct ExportOptions {
  // safetensors forbids shared storage: write each aliasing tensor as its own
  // copy instead of refusing.
  bool materialize_shared = false;
};

// Picks the format from the extension (.pt .pth .bin / .safetensors / .h5
// .hdf5); kInvalidArgument otherwise.
Format FormatFromPath(const std::string& path);
Format FormatFromName(const std::string& name);  // "pt", "safetensors", "h5"

// Writes `archive` to `path`. Returns notes (one line each) on what could not
// be represented and was left out. Throws kUnsupported naming the tensor when
// the target format cannot hold it (e.g. bfloat16 in HDF5), kInvalidArgument
// for aliasing tensors in safetensors without materialize_shared, kIo.
std::vector<std::string> Export(const Archive& archive, const std::string& path, Format format,
                                const ExportOptions& options = {});

}  // namespace tsar::exporter
