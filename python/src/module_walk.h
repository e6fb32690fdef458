// The slots of a torch.nn.Module, read in C++: what load_into binds.
#pragma once

#include <Python.h>

#include <optional>
#include <vector>

#include "loader/bind_common.h"

namespace tsar::python {

struct ModuleSlots {
  std::vector<BindSlot> slots;  // state_dict(keep_vars=True) order; the module keeps the tensors
  bool training = false;        // any submodule in training mode
  // The non-persistent buffers on the meta device (not in state_dict(), so
  // in no archive): BindSlots refuses a bind that would leave them there.
  std::vector<BindSlot> loose;
};

// The names and tensors of module.state_dict(keep_vars=True), in its order,
// read straight from each module's _parameters, _buffers and _modules dicts
// (tsar._bind._state_items does the same walk in Python, at about twice the
// cost: attribute lookups, a tuple and a name string per tensor, then their
// conversion).
// nullopt where state_dict() must run itself: a module with state_dict hooks,
// one whose class changes state_dict (`plain(type)` false; `plain_cache` is a
// dict {type: bool} that `plain` fills), or containers that are not plain
// dicts. Needs the GIL; raises nothing (a Python error is cleared, nullopt).
std::optional<ModuleSlots> WalkModule(PyObject* module, PyObject* plain_cache, PyObject* plain);

}  // namespace tsar::python
