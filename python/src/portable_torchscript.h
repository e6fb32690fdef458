// tsar.pack's TorchScript input and arch= on the portable path (issue 43):
// the pack's LibTorch hooks (TorchSupport, writer/pack_files.h) as calls into
// Python, where this process's torch reads the TorchScript file
// (python/tsar/_portable_torchscript.py). No LibTorch here.
#pragma once

#include <pybind11/pybind11.h>

#include "writer/pack_files.h"

namespace tsar::python {

// `hooks` has tensors(path) -> (items, keep) and architecture(path) -> bytes.
// The hooks are called from PackFiles with the GIL released; each takes it.
TorchSupport PythonTorchSupport(const pybind11::object& hooks);

}  // namespace tsar::python
