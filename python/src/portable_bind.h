// load_into on the portable path, in C++ over the Python C API (no
// LibTorch): the loop tsar/_portable_bind.py runs in Python, for the common
// case, at a few microseconds a tensor.
//
// FastBind walks the module (python/src/module_walk.h), matches each slot
// against the entry's records, checks dtype, shape, device and layout, binds
// ties, and rebinds every slot in place through torch's Python API: a tensor
// whose storage is its own in the archive comes through torch's DLPack
// import (one call); the tensors of a shared storage (views, ties) are
// `as_strided` views of its flat tensor, the one PortableArchive keeps in
// _first (imported through DLPack if none is kept yet), or, in another dtype
// than that flat's or one DLPack lacks, come from PortableArchive.view
// (`view_of`): views and ties still share one torch storage. A CPU tensor
// takes its view with `.data =`, a meta one by torch._C._swap_tensor_impl.
//
// It returns None, having changed nothing, wherever the answer is not a
// plain success: a mismatch, strict with names left over, a meta tensor left
// unbound, another device or layout, tensor parallelism, ties the archive
// holds as different records, a module that needs its own state_dict(). The
// caller then runs tsar/_portable_bind.py, which holds the rules' words
// (the accelerator's messages, tested equal).
#pragma once

#include <Python.h>

#include <string>

#include "tsar/archive_file.h"

namespace tsar::python {

struct FastBindArgs {
  std::string entry;           // "" for bind's default entry
  std::string archive_prefix;  // load_into's prefixes
  std::string module_prefix;
  bool strict = true;
  bool allow_training = false;
  // Tensor parallelism: rank `rank` of `world`, bound only where `world` is
  // the archive's tp_world (each sharded tensor's slice is one block).
  int64_t rank = 0;
  int64_t world = 0;
  // torch's Python API, borrowed (tsar/_portable.py's _API).
  PyTypeObject* tensor_type = nullptr;  // torch.Tensor
  PyObject* dtypes = nullptr;           // {dtype name: torch.dtype}
  PyObject* strided = nullptr;          // torch.strided
  PyObject* from_dlpack = nullptr;      // torch._C._from_dlpack
  PyObject* swap = nullptr;             // torch._C._swap_tensor_impl
  PyObject* make_subclass = nullptr;    // torch.Tensor._make_subclass
  PyObject* view_of = nullptr;          // (entry, archive name) -> the archive's view
  PyObject* first = nullptr;            // {storage: flat tensor}: PortableArchive._first
  PyObject* plain_cache = nullptr;      // WalkModule's
  PyObject* plain = nullptr;
};

// `module` (walked here), or when it is None `items` [(name, tensor)] with
// `training` and `loose` [(name, tensor)] (the non-persistent buffers), as
// tsar._bind._state_items lists them. Returns a new reference: (bound,
// missing, unexpected, mismatched, tied), or None; nullptr with a Python
// error set. Throws tsar::Error for an entry that does not exist.
PyObject* FastBind(const ArchiveFile& file, PyObject* module, PyObject* items, bool training,
                   PyObject* loose, const FastBindArgs& args);

// Archive.state_dict() on the portable path, as PortableArchive.view makes
// each tensor, in C++: a list with one item per tensor of `entry` in
// entry_table's order, or None where Python makes it (sparse tensors, a
// dtype DLPack lacks, a storage first made in another dtype or whose size is
// no whole number of elements). One torch storage per archive storage,
// whoever makes it first, kept in first[storage] (PortableArchive._first):
// - a storage that is one tensor's alone and all of it: that tensor through
//   DLPack (one call into torch);
// - any other: its flat tensor through DLPack, then `as_strided`;
// - a storage made before: `as_strided` of its tensor.
// No requires_grad. `dtypes`: torch's dtype objects by tsar's names. nullptr
// with a Python error set.
PyObject* DLPackTensors(const ArchiveFile& file, const std::string& entry, PyObject* from_dlpack,
                        PyObject* first, PyObject* dtypes);

}  // namespace tsar::python
