// Dispatch by content for `tsar pack` (writer/importer.h; detection: writer/detect.cc).
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "format/endian.h"
#include "format/spec.h"
#include "loader/open_file.h"
#include "writer/import_transformers.h"
#include "writer/importer.h"
#include "writer/zip_reader.h"

namespace tsar::importer {

std::string FirstLine(const std::exception& e) {
  std::string s = e.what();
  const size_t nl = s.find('\n');
  return nl == std::string::npos ? s : s.substr(0, nl);
}

Imported Import(const std::string& path, const ImportOptions& options) {
  const InputKind kind = DetectByBytes(path);
  if (kind == InputKind::kTorchSave) {
    // The central directory is read once, to tell TorchScript from torch.save
    // and to import (100,000 records take a tenth of a second).
    const auto input = MappedInput::Open(path);
    const zip::Reader zip(input->data(), input->size(), path);
    if (!IsTorchScript(zip)) return ImportTorchSave(path, input, zip, options);
    if (!options.torchscript) {
      throw Error(ErrorCode::kUnsupported, path, std::nullopt,
                  "a TorchScript archive: only LibTorch reads one, and no TorchScript reader was "
                  "given (ImportOptions::torchscript); save the weights with "
                  "torch.save(model.state_dict(), ...) or as safetensors instead");
    }
    Imported out = options.torchscript(path, options);
    // Whichever reader (LibTorch's, or Python's torch on the portable path).
    if (out.entries.empty() || out.entries.front().tensors.empty()) {
      throw Error(ErrorCode::kBadInput, path, std::nullopt,
                  "expected parameters or buffers in the TorchScript module, found none");
    }
    return out;
  }
  // TensorDict's meta.json, named as such, stands for its directory; so does
  // the config.json of a transformers directory.
  const size_t slash = path.rfind('/');
  const size_t base = slash == std::string::npos ? 0 : slash + 1;
  if (kind == InputKind::kSafetensorsIndex &&
      path.compare(base, std::string::npos, "meta.json") == 0) {
    return ImportTensorDict(path, options);
  }
  if (kind == InputKind::kSafetensorsIndex &&
      path.compare(base, std::string::npos, "config.json") == 0 &&
      !TransformersWeights(DirOf(path)).empty()) {
    return ImportTransformers(path, options);
  }
  switch (kind) {
    case InputKind::kTorchSave:
    case InputKind::kTorchScript:
      break;  // above; DetectByBytes calls every zip torch.save
    case InputKind::kSafetensors:
      return ImportSafetensors(path, options);
    case InputKind::kSafetensorsIndex:
      return ImportSafetensorsIndex(path, options);
    case InputKind::kHdf5:
      return ImportHdf5(path, options);
    case InputKind::kTsar:
      return ImportTsar(path, options);
    case InputKind::kTensorDict:
      return ImportTensorDict(path, options);
    case InputKind::kTransformers:
      return ImportTransformers(path, options);
    case InputKind::kUnknown:
      break;
  }
  uint8_t b[8] = {0};
  struct stat st;
  const int fd = OpenRegularFile(path, &st, ErrorCode::kBadInput);
  const ssize_t n = pread(fd, b, sizeof b, 0);
  if (fd >= 0) close(fd);
  std::string hint;
  if (n >= 5 && std::memcmp(b, format::kMagic, 5) == 0) hint = " (a damaged tsar archive?)";
  if (n >= 2 && b[0] == 0x80 && b[1] <= 5) {
    hint =
        " (it looks like a legacy torch.save file from before PyTorch 1.6: re-save it with "
        "torch.save(obj, f, _use_new_zipfile_serialization=True))";
  }
  throw Error(ErrorCode::kBadInput, path, std::nullopt,
              "expected a torch.save zip, a TorchScript archive, a safetensors file or index, an "
              "HDF5 file, a tsar archive, or a directory (transformers' save_pretrained, "
              "TensorDict's memmap()), found none of them" +
                  hint);
}

}  // namespace tsar::importer
