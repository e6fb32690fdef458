// The per-format halves of writer/exporter.h.
#pragma once

#include <string>
#include <vector>

#include "writer/exporter.h"

namespace tsar::exporter {

std::vector<std::string> ExportTorchSave(const Archive& archive, const std::string& path);
std::vector<std::string> ExportSafetensors(const Archive& archive, const std::string& path,
                                           const ExportOptions& options);
std::vector<std::string> ExportHdf5(const Archive& archive, const std::string& path);

// The name a tensor gets in a flat namespace: "name" when the archive has one
// entry, "entry/name" otherwise.
std::string FlatName(const Archive& archive, const TensorInfo& t);

}  // namespace tsar::exporter
