// The per-format halves of writer/exporter.h.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "writer/exporter.h"

namespace tsar::exporter {

std::vector<std::string> ExportSafetensors(const ArchiveFile& archive, const std::string& path,
                                           const ExportOptions& options);
std::vector<std::string> ExportHdf5(const ArchiveFile& archive, const std::string& path);

// The name a tensor gets in a flat namespace: "name" when the archive has one
// entry, "entry/name" otherwise. Counts the entries once, not per name.
class FlatNames {
 public:
  explicit FlatNames(const ArchiveFile& archive) : single_(archive.entries().size() == 1) {}
  std::string operator()(const TensorInfo& t) const {
    return single_ ? t.name : t.entry + "/" + t.name;
  }

 private:
  bool single_;
};

// Bytes of a tensor's contiguous copy (numel x element size), or nullopt
// past 2^64 - 1 (a broadcast view can be that large; its storage is not).
std::optional<uint64_t> ContiguousBytes(const TensorInfo& t);

}  // namespace tsar::exporter
