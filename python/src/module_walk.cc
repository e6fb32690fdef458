// WalkModule (python/src/module_walk.h).
#include "python/src/module_walk.h"
#include "python/src/py_ref.h"

#include <utility>

namespace tsar::python {
namespace {

// Interned once: attribute lookups then compare pointers.
struct Names {
  PyObject* parameters = PyUnicode_InternFromString("_parameters");
  PyObject* buffers = PyUnicode_InternFromString("_buffers");
  PyObject* modules = PyUnicode_InternFromString("_modules");
  PyObject* non_persistent = PyUnicode_InternFromString("_non_persistent_buffers_set");
  PyObject* hooks = PyUnicode_InternFromString("_state_dict_hooks");
  PyObject* pre_hooks = PyUnicode_InternFromString("_state_dict_pre_hooks");
  PyObject* training = PyUnicode_InternFromString("training");
};
const Names& N() {
  static const Names names;  // first use holds the GIL
  return names;
}

using Ref = PyRef;

// A module's instance attribute, borrowed from its __dict__ (where
// nn.Module.__init__ and __setattr__ keep _parameters, _buffers, _modules,
// the hook dicts and `training`), or nullptr (error cleared). Two dict
// lookups instead of a getattr through nn.Module's __getattr__ hook and the
// class's MRO (the 100,000-tensor mixture of experts, 133,000 modules: load_into
// 170 ms, against 360 ms through the Python walk).
PyObject* Item(PyObject* dict, PyObject* name) {
  PyObject* v = PyDict_GetItemWithError(dict, name);
  if (v == nullptr) PyErr_Clear();
  return v;
}

// 1 true, 0 false, -1 undecidable (error cleared).
int Truth(PyObject* dict, PyObject* name) {
  PyObject* v = Item(dict, name);
  if (v == nullptr) return -1;
  const int t = PyObject_IsTrue(v);
  if (t < 0) PyErr_Clear();
  return t;
}

bool Plain(PyObject* module, PyObject* cache, PyObject* plain) {
  PyObject* type = reinterpret_cast<PyObject*>(Py_TYPE(module));
  PyObject* known = PyDict_GetItemWithError(cache, type);  // borrowed
  if (known != nullptr) return known == Py_True;
  if (PyErr_Occurred()) {
    PyErr_Clear();
    return false;
  }
  Ref r(PyObject_CallOneArg(plain, type));
  if (r.p == nullptr) {
    PyErr_Clear();
    return false;
  }
  return r.p == Py_True;
}

// Hands dict's tensors (None skipped) to `sink`, those named in `skip` as
// not persistent; false where the dict is not a plain dict of str -> Tensor.
bool Tensors(PyObject* dict, PyObject* skip, const std::string& prefix, PyTypeObject* tensor_type,
             const TensorSink& sink) {
  if (!PyDict_CheckExact(dict)) return false;
  Py_ssize_t pos = 0;
  PyObject *key, *value;
  while (PyDict_Next(dict, &pos, &key, &value)) {
    if (value == Py_None) continue;
    if (!PyUnicode_Check(key) || !PyObject_TypeCheck(value, tensor_type)) return false;
    bool persistent = true;
    if (skip != nullptr) {
      const int in = PySet_Contains(skip, key);
      if (in < 0) {
        PyErr_Clear();
        return false;
      }
      persistent = !in;
    }
    Py_ssize_t n = 0;
    const char* s = PyUnicode_AsUTF8AndSize(key, &n);
    if (s == nullptr) {
      PyErr_Clear();
      return false;
    }
    std::string name;
    name.reserve(prefix.size() + static_cast<size_t>(n));
    name.append(prefix).append(s, static_cast<size_t>(n));
    sink(std::move(name), value, persistent);
  }
  return true;
}

}  // namespace

std::optional<bool> WalkModule(PyObject* module, PyObject* plain_cache, PyObject* plain,
                               PyTypeObject* tensor_type, const TensorSink& sink) {
  if (!PyDict_Check(plain_cache)) return std::nullopt;
  const Names& k = N();
  bool any_training = false;
  // Depth first, children in _modules order: state_dict's order. A module
  // reached under two names is listed under both, as state_dict does. The
  // frames borrow their modules: the parents' _modules dicts hold them, and
  // nothing here runs Python code that could change them (attribute reads
  // of plain modules, Plain()'s call only for a type not yet seen).
  std::vector<std::pair<std::string, PyObject*>> stack{{"", module}};
  std::vector<std::pair<std::string, PyObject*>> children;
  while (!stack.empty()) {
    auto [prefix, m] = std::move(stack.back());
    stack.pop_back();
    Ref dict(PyObject_GenericGetDict(m, nullptr));
    if (dict.p == nullptr) {
      PyErr_Clear();
      return std::nullopt;
    }
    if (Truth(dict.p, k.hooks) != 0 || Truth(dict.p, k.pre_hooks) != 0 ||
        !Plain(m, plain_cache, plain))
      return std::nullopt;
    const int training = Truth(dict.p, k.training);
    if (training < 0) return std::nullopt;
    any_training = any_training || training;
    PyObject* params = Item(dict.p, k.parameters);
    PyObject* buffers = Item(dict.p, k.buffers);
    PyObject* skip = Item(dict.p, k.non_persistent);
    PyObject* modules = Item(dict.p, k.modules);
    if (params == nullptr || buffers == nullptr || skip == nullptr || modules == nullptr ||
        !PyAnySet_Check(skip) || !PyDict_CheckExact(modules))
      return std::nullopt;
    if (!Tensors(params, nullptr, prefix, tensor_type, sink) ||
        !Tensors(buffers, skip, prefix, tensor_type, sink))
      return std::nullopt;
    children.clear();
    Py_ssize_t pos = 0;
    PyObject *key, *child;
    while (PyDict_Next(modules, &pos, &key, &child)) {
      if (child == Py_None) continue;
      Py_ssize_t n = 0;
      const char* s = PyUnicode_Check(key) ? PyUnicode_AsUTF8AndSize(key, &n) : nullptr;
      if (s == nullptr) {
        PyErr_Clear();
        return std::nullopt;
      }
      std::string name;
      name.reserve(prefix.size() + static_cast<size_t>(n) + 1);
      name.append(prefix).append(s, static_cast<size_t>(n)).push_back('.');
      children.emplace_back(std::move(name), child);
    }
    for (auto it = children.rbegin(); it != children.rend(); ++it) stack.push_back(std::move(*it));
  }
  return any_training;
}

std::optional<WalkedModule> WalkModule(PyObject* module, PyObject* plain_cache, PyObject* plain,
                                       PyTypeObject* tensor_type) {
  WalkedModule out;
  const std::optional<bool> training = WalkModule(
      module, plain_cache, plain, tensor_type,
      [&](std::string&& name, PyObject* tensor, bool persistent) {
        (persistent ? out.slots : out.non_persistent).push_back({std::move(name), tensor});
      });
  if (!training) return std::nullopt;
  out.training = *training;
  return out;
}

}  // namespace tsar::python
