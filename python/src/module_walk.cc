// WalkModule (python/src/module_walk.h).
#include "python/src/module_walk.h"
#include "python/src/py_ref.h"
#include "tsar/error.h"

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

// What the walk has read without a reference of its own: safe while no
// Python code runs (nothing can drop it), held (Flush) before any call that
// could run Python. In the common case none does, and the walk takes no
// reference but one per tensor it hands out (load_into of the LLaMA bench,
// portable path, A/B in one hour: holding everything it read cost 0.1 ms of
// its 0.85).
struct Borrowed {
  std::vector<PyObject*> p;
  void Flush(WalkRefs& refs) {
    for (PyObject* o : p) refs.Hold(o);
    p.clear();
  }
};

// A module's attributes the walk reads, from one pass over its __dict__
// (where nn.Module.__init__ and __setattr__ keep _parameters, _buffers,
// _modules, the hook dicts and `training`; setattr interns the names, so
// they compare by identity with ours). One pass over ~20 entries instead of
// a getattr each through nn.Module's __getattr__ hook and the class's MRO
// (the 100,000-tensor mixture of experts, 133,000 modules: load_into 170 ms,
// against 360 ms through the Python walk), and no lookup, which could call
// a key's __eq__ (a key of another type, or an equal str that is not the
// interned one, is no match): false where one of them is not found.
bool Attributes(PyObject* dict, const Names& k, PyObject* (&found)[7]) {
  PyObject* const names[7] = {k.hooks,  k.pre_hooks,      k.parameters, k.buffers,
                              k.non_persistent, k.modules, k.training};
  for (PyObject*& f : found) f = nullptr;
  Py_ssize_t pos = 0;
  PyObject *key, *value;
  int left = 7;
  while (left > 0 && PyDict_Next(dict, &pos, &key, &value)) {
    for (int f = 0; f < 7; ++f) {
      if (key == names[f] && found[f] == nullptr) {
        found[f] = value;
        --left;
        break;
      }
    }
  }
  return left == 0;
}

// Whether the module's class keeps nn.Module's state_dict (`plain`, cached
// in `cache`). A class not yet in the cache costs a call into Python, and so
// does a lookup of a class whose metaclass is not `type` (its __hash__ and
// __eq__ could be Python's): what the walk borrowed is held first.
bool Plain(PyObject* module, PyObject* cache, PyObject* plain, Borrowed& borrowed,
           WalkRefs& refs) {
  PyObject* type = reinterpret_cast<PyObject*>(Py_TYPE(module));
  if (Py_TYPE(type) != &PyType_Type) borrowed.Flush(refs);
  PyObject* known = PyDict_GetItemWithError(cache, type);  // borrowed
  if (known != nullptr) return known == Py_True;
  if (PyErr_Occurred()) {
    PyErr_Clear();
    return false;
  }
  borrowed.Flush(refs);
  Ref r(PyObject_CallOneArg(plain, type));
  if (r.p == nullptr) {
    PyErr_Clear();
    return false;
  }
  return r.p == Py_True;
}

// Whether every member of the set is exactly str: a lookup of a str in it
// then compares strings and runs no Python.
bool StrSet(PyObject* set) {
  if (PySet_GET_SIZE(set) == 0) return true;
  Ref it(PyObject_GetIter(set));
  if (it.p == nullptr) {
    PyErr_Clear();
    return false;
  }
  bool all = true;
  while (PyObject* item = PyIter_Next(it.p)) {
    all = all && PyUnicode_CheckExact(item);
    Py_DECREF(item);
  }
  if (PyErr_Occurred()) {
    PyErr_Clear();
    return false;
  }
  return all;
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

// Python's own limit on nesting (state_dict() recurses): deeper is refused
// as state_dict() refuses it, with RecursionError (the Python walk's words).
constexpr uint32_t kMaxDepth = 1000;

// Modules taken through each step at a time: enough for the waits to
// overlap, few enough that what a step hints is still in the cache at the
// next (a level of 33,000 experts walked whole was slower than depth first).
constexpr size_t kBatch = 64;

// One module object met in the walk, read once however many paths reach it
// (state_dict() lists its tensors under each path).
struct Node {  // its pointers borrowed (Borrowed) or held
  PyObject* module;
  PyObject* params = nullptr, *buffers = nullptr, *skip = nullptr, *modules = nullptr;
  PyObject* hooks = nullptr, *pre_hooks = nullptr;
  uint32_t first_tensor = 0, n_tensors = 0;  // into the walk's tensors
  uint32_t first_child = 0, n_children = 0;  // into the walk's children
};

struct Child {
  PyObject* key;  // its name in the parent's _modules
  uint32_t node;
};

struct Entry {
  PyObject* key;    // the name in _parameters or _buffers
  PyObject* value;  // the tensor
  bool persistent;
};

// Module object -> its node: open addressing over pointers (a lookup per
// module, 133,000 in the largest bench, where a node-based map allocates).
class NodeTable {
 public:
  // The node of `m`, or `fresh` (then recorded for m).
  uint32_t FindOrAdd(PyObject* m, uint32_t fresh) {
    if (2 * (used_ + 1) > slots_.size()) Grow();
    size_t i = Hash(m) & (slots_.size() - 1);
    while (slots_[i].first != nullptr) {
      if (slots_[i].first == m) return slots_[i].second;
      i = (i + 1) & (slots_.size() - 1);
    }
    slots_[i] = {m, fresh};
    ++used_;
    return fresh;
  }

 private:
  static size_t Hash(PyObject* m) {
    return static_cast<size_t>((reinterpret_cast<uintptr_t>(m) >> 4) * 0x9E3779B97F4A7C15ull >> 7);
  }
  void Grow() {
    std::vector<std::pair<PyObject*, uint32_t>> old(std::max<size_t>(64, 2 * slots_.size()));
    old.swap(slots_);
    used_ = 0;
    for (const auto& [m, n] : old)
      if (m != nullptr) FindOrAdd(m, n);
  }
  std::vector<std::pair<PyObject*, uint32_t>> slots_;
  size_t used_ = 0;
};

// Appends dict's entries (None skipped) to `out`, borrowed, those named in
// `skip` as not persistent, and hints their objects; false where the dict is
// not a plain dict of str -> ... (the values' types are checked once they
// are in the cache). `skip`: a set of str only (StrSet), or what was
// borrowed is held before each lookup, which can then run Python.
bool Entries(PyObject* dict, PyObject* skip, bool skip_is_str, std::vector<Entry>& out,
             Borrowed& borrowed, WalkRefs& refs) {
  if (!PyDict_CheckExact(dict)) return false;
  Py_ssize_t pos = 0;
  PyObject *key, *value;
  while (PyDict_Next(dict, &pos, &key, &value)) {
    if (value == Py_None) continue;
    if (!PyUnicode_CheckExact(key)) return false;
    out.push_back({key, value, true});
    borrowed.p.push_back(key);
    borrowed.p.push_back(value);
    if (skip != nullptr) {
      if (!skip_is_str) borrowed.Flush(refs);
      const int in = PySet_Contains(skip, key);
      if (in < 0) {
        PyErr_Clear();
        return false;
      }
      out.back().persistent = !in;
    }
    Prefetch(value);
  }
  return true;
}

// The key's UTF-8, or nullptr (error cleared).
const char* Utf8(PyObject* key, Py_ssize_t* n) {
  const char* s = PyUnicode_AsUTF8AndSize(key, n);
  if (s == nullptr) PyErr_Clear();
  return s;
}

// A hook dict as nn.Module makes it (an OrderedDict, or a dict), so that its
// size is read without running Python.
bool PlainHooks(PyObject* d) { return PyDict_CheckExact(d) || PyODict_CheckExact(d); }

// How many names state_dict() lists below each node (its tensors, then each
// child's under each path), saturated at kMaxWalkNames + 1; nullopt where a
// module contains itself or nests deeper than kMaxDepth (state_dict()'s
// RecursionError: the Python walk says so).
std::optional<std::vector<uint64_t>> NameCounts(const std::vector<Node>& nodes,
                                                const std::vector<Child>& children) {
  constexpr uint64_t kCap = kMaxWalkNames + 1;
  std::vector<uint64_t> count(nodes.size(), 0);
  std::vector<uint8_t> state(nodes.size(), 0);  // 0 new, 1 on the path, 2 counted
  std::vector<std::pair<uint32_t, uint32_t>> path{{0, 0}};  // (node, next child)
  state[0] = 1;
  while (!path.empty()) {
    auto& [n, c] = path.back();
    if (c < nodes[n].n_children) {
      const uint32_t child = children[nodes[n].first_child + c++].node;
      if (state[child] == 1 || path.size() >= kMaxDepth) return std::nullopt;
      if (state[child] == 0) {
        state[child] = 1;
        path.emplace_back(child, 0);
      }
      continue;
    }
    uint64_t total = nodes[n].n_tensors;
    for (uint32_t k = 0; k < nodes[n].n_children; ++k)
      total = std::min(kCap, total + count[children[nodes[n].first_child + k].node]);
    count[n] = total;
    state[n] = 2;
    path.pop_back();
  }
  return count;
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
//
// Nothing read can be dropped while it is used: what the walk borrowed is
// held (`refs`) before any call that could run Python (Plain() of a class
// not yet seen, a lookup in a set of other than str), whose code may change
// the module; the lookups that run in every walk run none (the __dict__ is
// read in one pass, a set of str compares strings). The tensors handed out
// are held until the caller drops `refs`. Each module object is read once (a
// submodule reused on many paths is one node), so the work is linear in the
// objects, and the names are counted before any is made.
std::optional<bool> WalkModule(PyObject* module, PyObject* plain_cache, PyObject* plain,
                               PyTypeObject* tensor_type, const TensorSink& sink,
                               WalkRefs& refs) {
  if (!PyDict_Check(plain_cache)) return std::nullopt;
  const Names& k = N();
  bool any_training = false;
  std::vector<Node> nodes{Node{module}};  // the caller holds the root
  std::vector<PyObject*> dicts;            // each node's __dict__, held
  Borrowed borrowed;
  std::vector<Child> children;
  std::vector<Entry> tensors;
  NodeTable seen;
  seen.FindOrAdd(module, 0);
  for (size_t lo = 0; lo < nodes.size();) {
    const size_t hi = std::min(nodes.size(), lo + kBatch);
    const size_t first_tensor = tensors.size();
    // The next batch's modules, as far as they are known yet (a managed
    // __dict__ sits just before its object).
    for (size_t i = lo == 0 ? lo : hi; i < std::min(nodes.size(), hi + kBatch); ++i)
      Prefetch(reinterpret_cast<const char*>(nodes[i].module) - 64);
    for (size_t i = lo; i < hi; ++i) {  // each module's __dict__
      if (!Plain(nodes[i].module, plain_cache, plain, borrowed, refs)) return std::nullopt;
      PyObject* dict = PyObject_GenericGetDict(nodes[i].module, nullptr);
      if (dict == nullptr) {
        PyErr_Clear();
        return std::nullopt;
      }
      dicts.push_back(refs.Take(dict));
      Prefetch(dict);
    }
    for (size_t i = lo; i < hi; ++i) PrefetchTable(dicts[i]);
    for (size_t i = lo; i < hi; ++i) {  // its attributes, borrowed
      Node& n = nodes[i];
      PyObject* found[7];
      if (!Attributes(dicts[i], k, found) || !PyBool_Check(found[6])) return std::nullopt;
      any_training = any_training || found[6] == Py_True;
      n.hooks = found[0];
      n.pre_hooks = found[1];
      n.params = found[2];
      n.buffers = found[3];
      n.skip = found[4];
      n.modules = found[5];
      for (int f = 0; f < 6; ++f) {
        borrowed.p.push_back(found[f]);
        Prefetch(found[f]);
      }
    }
    for (size_t i = lo; i < hi; ++i) {  // no hooks; plain dicts; their tables
      const Node& n = nodes[i];
      if (!PlainHooks(n.hooks) || !PlainHooks(n.pre_hooks) || PyDict_GET_SIZE(n.hooks) != 0 ||
          PyDict_GET_SIZE(n.pre_hooks) != 0)
        return std::nullopt;
      if (!(PySet_CheckExact(n.skip) || PyFrozenSet_CheckExact(n.skip)) ||
          !PyDict_CheckExact(n.modules) || !PyDict_CheckExact(n.params) ||
          !PyDict_CheckExact(n.buffers))
        return std::nullopt;
      for (PyObject* d : {n.params, n.buffers, n.modules}) {
        if (PyDict_GET_SIZE(d) != 0) PrefetchTable(d);
      }
    }
    for (size_t i = lo; i < hi; ++i) {  // tensors and children, hinted for the next steps
      Node& n = nodes[i];
      n.first_tensor = static_cast<uint32_t>(tensors.size());
      PyObject* const skip = PyDict_GET_SIZE(n.buffers) != 0 && PySet_GET_SIZE(n.skip) != 0
                                 ? n.skip
                                 : nullptr;
      if (!Entries(n.params, nullptr, true, tensors, borrowed, refs) ||
          !Entries(n.buffers, skip, skip == nullptr || StrSet(skip), tensors, borrowed, refs))
        return std::nullopt;
      if (tensors.size() > UINT32_MAX) return std::nullopt;
      n.n_tensors = static_cast<uint32_t>(tensors.size()) - n.first_tensor;
      n.first_child = static_cast<uint32_t>(children.size());
      PyObject* const modules = n.modules;  // `n` moves as nodes grows
      Py_ssize_t pos = 0;
      PyObject *key, *child;
      while (PyDict_Next(modules, &pos, &key, &child)) {
        if (child == Py_None) continue;
        if (!PyUnicode_CheckExact(key)) return std::nullopt;
        const uint32_t fresh = static_cast<uint32_t>(nodes.size());
        // A module reached twice is referenced twice: one only this dict
        // refers to is new, without a look in the table (most modules).
        const uint32_t node = Py_REFCNT(child) > 1 ? seen.FindOrAdd(child, fresh) : fresh;
        if (node == fresh) {
          nodes.push_back(Node{child});
          borrowed.p.push_back(child);
        }
        children.push_back({key, node});
        borrowed.p.push_back(key);
        if (nodes.size() > UINT32_MAX || children.size() > UINT32_MAX) return std::nullopt;
      }
      nodes[i].n_children = static_cast<uint32_t>(children.size()) - nodes[i].first_child;
    }
    for (size_t t = first_tensor; t < tensors.size(); ++t) {  // hinted above
      if (!PyObject_TypeCheck(tensors[t].value, tensor_type)) return std::nullopt;
    }
    lo = hi;
  }
  // What the caller keeps using once this returns, across its own calls
  // into Python: the tensors. (No Python runs from here to the end.)
  refs.Reserve(tensors.size());
  for (const Entry& t : tensors) refs.Hold(t.value);

  const std::optional<std::vector<uint64_t>> counts = NameCounts(nodes, children);
  if (!counts) return std::nullopt;
  if ((*counts)[0] > kMaxWalkNames) {
    throw Error(ErrorCode::kInvalidArgument, "load_into", std::nullopt,
                "the module lists more than " + std::to_string(kMaxWalkNames) +
                    " tensors by name in state_dict(): a submodule reached on many paths (" +
                    std::to_string(nodes.size()) + " module objects; state_dict() names each "
                    "tensor once per path). Bind a module whose submodules are reused on fewer "
                    "paths");
  }

  // state_dict's order: depth first, a module's own tensors, then its
  // children in _modules order, names prefixed by the path to them.
  std::string prefix;
  struct Frame {
    uint32_t node;
    Child* via;  // how it was reached (the root: none)
    size_t parent_len;
  };
  std::vector<Frame> stack{{0, nullptr, 0}};
  while (!stack.empty()) {
    const Frame f = stack.back();
    stack.pop_back();
    const Node& n = nodes[f.node];
    prefix.resize(f.parent_len);
    if (f.via != nullptr) {
      Py_ssize_t len = 0;
      const char* s = Utf8(f.via->key, &len);
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
    for (uint32_t c = n.n_children; c-- > 0;) {
      Child& child = children[n.first_child + c];
      stack.push_back({child.node, &child, prefix.size()});
    }
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
      },
      out.refs);
  if (!training) return std::nullopt;
  out.training = *training;
  return out;
}

}  // namespace tsar::python
