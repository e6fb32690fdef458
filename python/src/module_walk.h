// The slots of a torch.nn.Module, read in C++ through the Python C API alone
// (no LibTorch): what load_into binds, on both of tsar's paths. The
// accelerator (python/src/module.cc) turns each tensor into its TensorImpl,
// the portable path (python/src/portable_bind.cc) works on the objects.
#pragma once

#include <Python.h>

#include <functional>
#include <optional>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace tsar::python {

// Owned references, released together when this is destroyed, which must
// happen with the GIL held: to the tensors a walk hands out (a bind calls
// into Python after the walk, and code run there could drop them from the
// module), and to everything the walk had read when it called something
// that could run Python (a class's state_dict lookup, a set's __eq__), which
// stays alive here whatever that code does.
class WalkRefs {
 public:
  WalkRefs() = default;
  WalkRefs(WalkRefs&& o) noexcept : held_(std::move(o.held_)) { o.held_.clear(); }
  WalkRefs& operator=(WalkRefs&& o) noexcept {
    std::swap(held_, o.held_);
    return *this;
  }
  WalkRefs(const WalkRefs&) = delete;
  WalkRefs& operator=(const WalkRefs&) = delete;
  ~WalkRefs() {
    for (PyObject* o : held_) Py_DECREF(o);
  }
  // `o` (not null), now held here; returns it.
  PyObject* Hold(PyObject* o) {
    Py_INCREF(o);
    held_.push_back(o);
    return o;
  }
  // `o`, a new reference the caller gives up, now held here.
  PyObject* Take(PyObject* o) {
    held_.push_back(o);
    return o;
  }
  void Reserve(size_t more) { held_.reserve(held_.size() + more); }  // room for `more` others

 private:
  std::vector<PyObject*> held_;
};

struct WalkedTensor {
  std::string name;  // as state_dict() names it
  PyObject* tensor;  // held by the WalkedModule's refs
};

struct WalkedModule {
  std::vector<WalkedTensor> slots;  // state_dict(keep_vars=True) order
  bool training = false;            // any submodule in training mode
  // The non-persistent buffers (not in state_dict(), so in no archive): a
  // bind refuses to leave one on the meta device.
  std::vector<WalkedTensor> non_persistent;
  WalkRefs refs;  // every tensor above (and what the walk held: WalkRefs)
};

// The most tensor names one walk lists: a submodule reused on many paths
// (twice at each of 30 levels: 2^30 names) is refused (tsar::Error) before
// any name is made, where state_dict() would run out of memory.
inline constexpr uint64_t kMaxWalkNames = uint64_t{1} << 24;

// The names and tensors of module.state_dict(keep_vars=True), in its order,
// read straight from each module's _parameters, _buffers and _modules dicts
// (tsar._bind._state_items does the same walk in Python, at about twice the
// cost: attribute lookups, a tuple and a name string per tensor, then their
// conversion). A tensor is an instance of `tensor_type` (torch._C.TensorBase).
// nullopt where state_dict() must run itself: a module with state_dict hooks,
// one whose class changes state_dict (`plain(type)` false; `plain_cache` is a
// dict {type: bool} that `plain` fills), or containers that are not plain
// dicts, and every object on the way not exactly of the type nn.Module puts
// there (`training` a bool, the hook dicts OrderedDicts, names and the
// __dict__'s keys str). Each
// module object is read once, however many paths reach it; names are listed
// per path, as state_dict() lists them. Needs the GIL; raises nothing (a
// Python error is cleared, nullopt) but tsar::Error past kMaxWalkNames.
std::optional<WalkedModule> WalkModule(PyObject* module, PyObject* plain_cache, PyObject* plain,
                                       PyTypeObject* tensor_type);

// The same walk handing each tensor to `sink` in that order (name, the
// tensor, held by `refs` until the caller drops them; whether state_dict()
// lists it) instead of collecting
// them: the accelerator reads each TensorImpl there, no second pass over the
// slots (one cost it about a tenth of its bind of 100,000 tensors). Returns
// whether any submodule is training, or nullopt (the sink may have been
// called: discard what it gathered). Declines (nullopt) a module tree
// deeper than Python's nesting limit and a module that contains itself.
using TensorSink = std::function<void(std::string&& name, PyObject* tensor, bool persistent)>;
std::optional<bool> WalkModule(PyObject* module, PyObject* plain_cache, PyObject* plain,
                               PyTypeObject* tensor_type, const TensorSink& sink, WalkRefs& refs);

}  // namespace tsar::python
