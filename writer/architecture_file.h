// An architecture file (`tsar pack --arch`, `tsar.pack(arch=)`): the bytes of
// a TorchScript module without its weights, written next to their
// destination and published with the archive. Without LibTorch: the bytes
// come from writer/architecture.h (LibTorch) or, on the Python package's
// portable path, from torch's own Python API (python/tsar/_portable_torchscript.py).
#pragma once

#include <functional>
#include <string>
#include <string_view>

namespace tsar::writer {

// Writes `bytes` to a temporary file next to `output` (AtomicFile: nothing at
// `output` until published, the temporary removed if never published) and
// returns the function that publishes it (durably when given true). Throws
// kInvalidArgument (an output that cannot be replaced), kIo (no space, a
// failed write).
std::function<void(bool)> WriteArchitecture(const std::string& output, std::string_view bytes);

}  // namespace tsar::writer
