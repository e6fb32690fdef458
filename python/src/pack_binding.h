// tsar.pack's C++ side (python/tsar/_save.py), bound into the module `m`
// with the LibTorch support it has: `pack(sources, dst, entry, strict,
// alignment, metadata, dtype, only, exclude, strip_prefix, architecture, base,
// tp, shard, follow_symlinks, torch_hooks)` -> (tensors, entries, nbytes,
// notes). No LibTorch here: tsar._tsar_pack (pack_module.cc) gives
// LibTorch's TorchScript reader and --arch writer, tsar._tsar_pack_portable
// (pack_portable.cc) none; `torch_hooks`, when not None, replaces them with
// Python's (python/src/portable_torchscript.h).
#pragma once

#include <pybind11/pybind11.h>

#include "writer/pack_files.h"

namespace tsar::python {

void DefPack(pybind11::module_& m, TorchSupport torch);

}  // namespace tsar::python
