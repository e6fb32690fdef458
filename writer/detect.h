// What kind of input of `tsar pack` a file is, by content, without LibTorch
// (the `tsar` command uses it to say what a file is that is not an archive).
#pragma once

#include <string>

namespace tsar::zip {
class Reader;
}

namespace tsar::importer {

enum class InputKind {
  kUnknown,
  kTorchSave,
  kTorchScript,
  kSafetensors,
  kSafetensorsIndex,
  kHdf5,
  kTsar,        // a tsar archive: repacked (flattened, rebased, converted)
  kTensorDict,  // a directory TensorDict's memmap() wrote (meta.json, KEY.memmap)
};
// "torch.save", "TorchScript", "safetensors", "safetensors index", "HDF5",
// "tsar", "TensorDict memmap", "unknown".
const char* InputKindName(InputKind kind);

// What the first bytes say; every zip is kTorchSave here. A directory with a
// meta.json is kTensorDict. Throws kNotFound / kIo when the file cannot be
// read, kBadInput when it is neither a regular file nor such a directory.
InputKind DetectByBytes(const std::string& path);

// A zip whose central directory names TorchScript's records.
bool IsTorchScript(const zip::Reader& zip);

// DetectByBytes, and for a zip whether it is TorchScript (its central
// directory read through a read-only mapping).
InputKind Detect(const std::string& path);

}  // namespace tsar::importer
