// WalkModule (python/src/module_walk.h).
#include "python/src/module_walk.h"
#include "python/src/py_ref.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

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

// A hint that `p` (and the line after it) will be read soon; any address,
// none is dereferenced.
inline void Prefetch(const void* p) {
  __builtin_prefetch(p);
  __builtin_prefetch(static_cast<const char*>(p) + 64);
}

// Where a dict's lookups and PyDict_Next read: its keys (a combined table
// holds its entries there) and a split table's values.
inline void PrefetchTable(PyObject* dict) {
  const auto* d = reinterpret_cast<const PyDictObject*>(dict);
  Prefetch(d->ma_keys);
  if (d->ma_values != nullptr) Prefetch(d->ma_values);
}

// Python's own limit on nesting (state_dict() recurses): deeper is a cycle
// in the module graph, which state_dict() reports as RecursionError.
constexpr uint32_t kMaxDepth = 1000;

// Modules taken through each step at a time: enough for the waits to
// overlap, few enough that what a step hints is still in the cache at the
// next (a level of 33,000 experts walked whole was slower than depth first).
constexpr size_t kBatch = 64;

// One module met in the walk: the module reached under one name (a module
// under two names is two nodes, as state_dict lists it twice).
struct Node {
  PyObject* module;          // borrowed from its parent's _modules (the root: the caller's)
  PyObject* key = nullptr;   // its name in the parent's _modules, borrowed; the root: none
  PyObject* params = nullptr, *buffers = nullptr, *skip = nullptr, *modules = nullptr;
  PyObject* hooks = nullptr, *pre_hooks = nullptr;
  uint32_t first_tensor = 0, n_tensors = 0;  // into the walk's tensors
  uint32_t first_child = 0, n_children = 0;  // into nodes: its children, side by side
  uint32_t depth = 1;
};

struct Entry {
  PyObject* key;    // the name in _parameters or _buffers, borrowed
  PyObject* value;  // the tensor, borrowed
  bool persistent;
};

// Appends dict's entries (None skipped) to `out`, those named in `skip` as
// not persistent, and hints their objects; false where the dict is not a
// plain dict of str -> ... (the values' types are checked once they are in
// the cache).
bool Entries(PyObject* dict, PyObject* skip, std::vector<Entry>& out) {
  if (!PyDict_CheckExact(dict)) return false;
  Py_ssize_t pos = 0;
  PyObject *key, *value;
  while (PyDict_Next(dict, &pos, &key, &value)) {
    if (value == Py_None) continue;
    if (!PyUnicode_Check(key)) return false;
    bool persistent = true;
    if (skip != nullptr) {
      const int in = PySet_Contains(skip, key);
      if (in < 0) {
        PyErr_Clear();
        return false;
      }
      persistent = !in;
    }
    Prefetch(value);
    out.push_back({key, value, persistent});
  }
  return true;
}

// The key's UTF-8, or nullptr (error cleared).
const char* Utf8(PyObject* key, Py_ssize_t* n) {
  const char* s = PyUnicode_AsUTF8AndSize(key, n);
  if (s == nullptr) PyErr_Clear();
  return s;
}

}  // namespace

// The walk goes breadth first, kBatch modules at a time: each step runs
// over the whole batch before the next step, hinting to the CPU what the next
// step reads. Module objects, their dicts and the dicts inside are scattered
// over the heap, and a module built moments ago is no longer in the caches:
// depth first, each read waited for the one before (the walk of the
// 423-module LLaMA took 0.26 ms right after building it, 0.09 ms walked
// again). In batches the waits of a batch overlap: load_into of that LLaMA,
// A/B in one process, 0.80 -> 0.59 ms (accelerator) and 1.13 -> 1.07 ms
// (portable); of the 100,000-tensor mixture of experts 148 -> 131 and
// 429 -> 362 ms. Then one pass in state_dict's order hands the tensors out.
std::optional<bool> WalkModule(PyObject* module, PyObject* plain_cache, PyObject* plain,
                               PyTypeObject* tensor_type, const TensorSink& sink) {
  if (!PyDict_Check(plain_cache)) return std::nullopt;
  const Names& k = N();
  bool any_training = false;
  std::vector<Node> nodes{Node{module}};
  struct Dicts {  // each module's __dict__, held while its items are borrowed
    std::vector<PyObject*> p;
    ~Dicts() {
      for (PyObject* d : p) Py_DECREF(d);
    }
  } dicts;
  std::vector<Entry> tensors;
  // The frames borrow their modules: the parents' _modules dicts hold them,
  // and nothing here runs Python code that could change them (attribute
  // reads of plain modules, Plain()'s call only for a type not yet seen).
  for (size_t lo = 0; lo < nodes.size();) {
    const size_t hi = std::min(nodes.size(), lo + kBatch);
    const size_t first_tensor = tensors.size();
    // The next batch's modules, as far as they are known yet (a managed
    // __dict__ sits just before its object).
    for (size_t i = lo == 0 ? lo : hi; i < std::min(nodes.size(), hi + kBatch); ++i)
      Prefetch(reinterpret_cast<const char*>(nodes[i].module) - 64);
    for (size_t i = lo; i < hi; ++i) {  // each module's __dict__
      if (!Plain(nodes[i].module, plain_cache, plain)) return std::nullopt;
      PyObject* dict = PyObject_GenericGetDict(nodes[i].module, nullptr);
      if (dict == nullptr) {
        PyErr_Clear();
        return std::nullopt;
      }
      dicts.p.push_back(dict);
      Prefetch(dict);
    }
    for (size_t i = lo; i < hi; ++i) PrefetchTable(dicts.p[i]);
    for (size_t i = lo; i < hi; ++i) {  // its attributes
      Node& n = nodes[i];
      PyObject* dict = dicts.p[i];
      const int training = Truth(dict, k.training);
      if (training < 0) return std::nullopt;
      any_training = any_training || training;
      n.hooks = Item(dict, k.hooks);
      n.pre_hooks = Item(dict, k.pre_hooks);
      n.params = Item(dict, k.parameters);
      n.buffers = Item(dict, k.buffers);
      n.skip = Item(dict, k.non_persistent);
      n.modules = Item(dict, k.modules);
      if (n.hooks == nullptr || n.pre_hooks == nullptr || n.params == nullptr ||
          n.buffers == nullptr || n.skip == nullptr || n.modules == nullptr)
        return std::nullopt;
      for (PyObject* o : {n.hooks, n.pre_hooks, n.params, n.buffers, n.skip, n.modules}) Prefetch(o);
    }
    for (size_t i = lo; i < hi; ++i) {  // no hooks; plain dicts; their tables
      const Node& n = nodes[i];
      if (PyObject_IsTrue(n.hooks) != 0 || PyObject_IsTrue(n.pre_hooks) != 0) {
        PyErr_Clear();
        return std::nullopt;
      }
      if (!PyAnySet_Check(n.skip) || !PyDict_CheckExact(n.modules) ||
          !PyDict_CheckExact(n.params) || !PyDict_CheckExact(n.buffers))
        return std::nullopt;
      for (PyObject* d : {n.params, n.buffers, n.modules}) {
        if (PyDict_GET_SIZE(d) != 0) PrefetchTable(d);
      }
    }
    for (size_t i = lo; i < hi; ++i) {  // tensors and children, hinted for the next steps
      Node& n = nodes[i];
      n.first_tensor = static_cast<uint32_t>(tensors.size());
      if (!Entries(n.params, nullptr, tensors) ||
          !Entries(n.buffers, PyDict_GET_SIZE(n.buffers) != 0 ? n.skip : nullptr, tensors))
        return std::nullopt;
      n.n_tensors = static_cast<uint32_t>(tensors.size()) - n.first_tensor;
      n.first_child = static_cast<uint32_t>(nodes.size());
      PyObject* const modules = n.modules;  // `n` moves as nodes grows
      Py_ssize_t pos = 0;
      PyObject *key, *child;
      while (PyDict_Next(modules, &pos, &key, &child)) {
        if (child == Py_None) continue;
        if (!PyUnicode_Check(key)) return std::nullopt;
        if (nodes[i].depth == kMaxDepth) return std::nullopt;
        nodes.push_back(Node{child, key});
        nodes.back().depth = nodes[i].depth + 1;
        if (nodes.size() > UINT32_MAX) return std::nullopt;
      }
      nodes[i].n_children = static_cast<uint32_t>(nodes.size()) - nodes[i].first_child;
    }
    for (size_t t = first_tensor; t < tensors.size(); ++t) {  // hinted above
      if (!PyObject_TypeCheck(tensors[t].value, tensor_type)) return std::nullopt;
    }
    lo = hi;
  }

  // state_dict's order: depth first, a module's own tensors, then its
  // children in _modules order, names prefixed by the path to them.
  std::string prefix;
  std::vector<std::pair<uint32_t, size_t>> stack{{0, 0}};  // (node, its parent's prefix length)
  while (!stack.empty()) {
    const auto [i, parent_len] = stack.back();
    stack.pop_back();
    const Node& n = nodes[i];
    prefix.resize(parent_len);
    if (n.key != nullptr) {
      Py_ssize_t len = 0;
      const char* s = Utf8(n.key, &len);
      if (s == nullptr) return std::nullopt;
      prefix.append(s, static_cast<size_t>(len)).push_back('.');
    }
    for (uint32_t t = n.first_tensor; t < n.first_tensor + n.n_tensors; ++t) {
      Py_ssize_t len = 0;
      const char* s = Utf8(tensors[t].key, &len);
      if (s == nullptr) return std::nullopt;
      std::string name;
      name.reserve(prefix.size() + static_cast<size_t>(len));
      name.append(prefix).append(s, static_cast<size_t>(len));
      sink(std::move(name), tensors[t].value, tensors[t].persistent);
    }
    for (uint32_t c = n.n_children; c-- > 0;) stack.emplace_back(n.first_child + c, prefix.size());
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
