// The slots of a torch.nn.Module, read in C++ through the Python C API alone
// (no LibTorch): what load_into binds, on both of tsar's paths. The
// accelerator (python/src/module.cc) turns each tensor into its TensorImpl,
// the portable path (python/src/portable_bind.cc) works on the objects.
#pragma once

#include <Python.h>

#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace tsar::python {

struct WalkedTensor {
  std::string name;  // as state_dict() names it
  PyObject* tensor;  // borrowed: the module holds it through the bind
};

struct WalkedModule {
  std::vector<WalkedTensor> slots;  // state_dict(keep_vars=True) order
  bool training = false;            // any submodule in training mode
  // The non-persistent buffers (not in state_dict(), so in no archive): a
  // bind refuses to leave one on the meta device.
  std::vector<WalkedTensor> non_persistent;
};

// The names and tensors of module.state_dict(keep_vars=True), in its order,
// read straight from each module's _parameters, _buffers and _modules dicts
// (tsar._bind._state_items does the same walk in Python, at about twice the
// cost: attribute lookups, a tuple and a name string per tensor, then their
// conversion). A tensor is an instance of `tensor_type` (torch._C.TensorBase).
// nullopt where state_dict() must run itself: a module with state_dict hooks,
// one whose class changes state_dict (`plain(type)` false; `plain_cache` is a
// dict {type: bool} that `plain` fills), or containers that are not plain
// dicts. Needs the GIL; raises nothing (a Python error is cleared, nullopt).
std::optional<WalkedModule> WalkModule(PyObject* module, PyObject* plain_cache, PyObject* plain,
                                       PyTypeObject* tensor_type);

// The same walk handing each tensor to `sink` in that order (name, the
// tensor borrowed, whether state_dict() lists it) instead of collecting
// them: the accelerator reads each TensorImpl there, no second pass over the
// slots (one cost it about a tenth of its bind of 100,000 tensors). Returns
// whether any submodule is training, or nullopt (the sink may have been
// called: discard what it gathered). Declines (nullopt) a module tree
// deeper than Python's nesting limit: a module that contains itself.
using TensorSink = std::function<void(std::string&& name, PyObject* tensor, bool persistent)>;
std::optional<bool> WalkModule(PyObject* module, PyObject* plain_cache, PyObject* plain,
                               PyTypeObject* tensor_type, const TensorSink& sink);

}  // namespace tsar::python
