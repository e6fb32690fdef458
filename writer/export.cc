// Format selection and dispatch of the exporters (writer/exporter.h).
#include <unordered_set>

#include "format/reader.h"
#include "writer/export_internal.h"

namespace tsar::exporter {
namespace {
bool EndsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}
}  // namespace

Format FormatFromName(const std::string& name) {
  if (name == "pt" || name == "pth" || name == "torch") return Format::kTorchSave;
  if (name == "safetensors") return Format::kSafetensors;
  if (name == "h5" || name == "hdf5") return Format::kHdf5;
  throw Error(ErrorCode::kInvalidArgument, "", std::nullopt,
              "--format: expected pt, safetensors or h5, found " + format::Quote(name));
}

Format FormatFromPath(const std::string& path) {
  for (const char* ext : {".pt", ".pth", ".bin"}) {
    if (EndsWith(path, ext)) return Format::kTorchSave;
  }
  if (EndsWith(path, ".safetensors")) return Format::kSafetensors;
  if (EndsWith(path, ".h5") || EndsWith(path, ".hdf5")) return Format::kHdf5;
  throw Error(
      ErrorCode::kInvalidArgument, path, std::nullopt,
      "output: expected an extension .pt, .pth, .bin, .safetensors, .h5 or .hdf5 (or --format)");
}

std::optional<uint64_t> ContiguousBytes(const TensorInfo& t) {
  uint64_t n = ElementSize(t.dtype);
  for (int64_t d : t.sizes) {
    if (d == 0) return 0;
  }
  for (int64_t d : t.sizes) {
    if (!format::CheckedMul(n, static_cast<uint64_t>(d), &n)) return std::nullopt;
  }
  return n;
}

std::vector<std::string> Export(const ArchiveFile& archive, const std::string& path, Format format,
                                const ExportOptions& options) {
  // Tensor groups (spec §4.13): safetensors in torchao's layout, which
  // transformers' from_pretrained reads (ExportSafetensors); torch.save
  // files as torch.save pickles the torchao tensor (ExportTorchSave); HDF5
  // refuses them.
  std::unordered_set<std::string> members;  // "entry\0name"
  std::string groups;
  for (const auto& e : archive.entries()) {
    for (const auto& g : archive.groups(e)) {
      groups += (groups.empty() ? "" : ", ") + format::Quote(g.name);
      for (const auto& m : g.members) members.insert(e + '\0' + m);
    }
  }
  if (!groups.empty() && format == Format::kHdf5) {
    throw Error(ErrorCode::kUnsupported, archive.path(), std::nullopt,
                "the archive holds tensor groups (torchao quantized tensors: " + groups +
                    "), which HDF5 cannot express; export to .safetensors or .pt");
  }
  // Sparse tensors: torch.save files get their component tensors (with a
  // note); safetensors and HDF5 have no way to say they belong together.
  std::string components;
  const FlatNames flat(archive);
  for (const auto& t : archive.infos()) {
    if (t.role == Role::kSparseComponent && !members.count(t.entry + '\0' + t.name)) {
      components += (components.empty() ? "" : ", ") + format::Quote(flat(t));
    }
  }
  if (!components.empty() && format != Format::kTorchSave) {
    throw Error(ErrorCode::kUnsupported, archive.path(), std::nullopt,
                "the archive holds sparse tensors (components " + components +
                    "), which this format cannot express; export to .pt");
  }
  switch (format) {
    case Format::kTorchSave: {
      if (!options.torch_save) {
        throw Error(ErrorCode::kUnsupported, path, std::nullopt,
                    "a torch.save file is written with LibTorch's zip writer, and none was "
                    "given (ExportOptions::torch_save); export to .safetensors or .h5");
      }
      std::vector<std::string> notes = options.torch_save(archive, path);
      if (!components.empty()) {
        notes.push_back("sparse tensors written as their component tensors: " + components);
      }
      return notes;
    }
    case Format::kSafetensors:
      return ExportSafetensors(archive, path, options);
    case Format::kHdf5:
      return ExportHdf5(archive, path);
  }
  return {};
}

}  // namespace tsar::exporter
