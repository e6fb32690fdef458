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
  kTransformers,  // a directory transformers' save_pretrained wrote (config.json and
                  // model.safetensors or model.safetensors.index.json)
};
// "torch.save", "TorchScript", "safetensors", "safetensors index", "HDF5",
// "tsar", "TensorDict memmap", "transformers", "unknown".
const char* InputKindName(InputKind kind);

// What the first bytes say; every zip is kTorchSave here. A directory with a
// meta.json is kTensorDict; one with a config.json and the weights
// TransformersWeights finds is kTransformers. Throws kNotFound / kIo when the
// file cannot be read, kBadInput when it is neither a regular file nor such a
// directory (a directory: naming what it holds and the layouts tsar reads).
InputKind DetectByBytes(const std::string& path);

// The weights file of a transformers save_pretrained directory `dir`, in the
// order transformers' from_pretrained looks for them: "model.safetensors",
// else "model.safetensors.index.json" (regular files, or symbolic links to
// them as in the Hugging Face cache); "" when there is neither or `dir` has
// no config.json (of any type: the transformers importer refuses one that is
// not a regular file it can read). Throws nothing.
std::string TransformersWeights(const std::string& dir);

// A zip whose central directory names TorchScript's records.
bool IsTorchScript(const zip::Reader& zip);

// DetectByBytes, and for a zip whether it is TorchScript (its central
// directory read through a read-only mapping).
InputKind Detect(const std::string& path);

}  // namespace tsar::importer
