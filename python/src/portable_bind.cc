// load_into's loop on the portable path, in C++ over the Python C API (no
// LibTorch): python/src/portable_bind.h.
#include "python/src/portable_bind.h"

#include <dlpack/dlpack.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "format/extent.h"
#include "format/index.h"
#include "format/spec.h"
#include "format/tensor_parallel.h"
#include "loader/archive_core.h"
#include "python/src/module_walk.h"
#include "python/src/py_ref.h"
#include "tsar/dtype.h"

namespace tsar::python {
namespace {

using Ref = PyRef;

// torch's own getters and setters of a tensor's attributes: the
// descriptors of torch._C.TensorBase, found once on torch.Tensor (which
// keeps them). Called directly, a subclass's property or __getattr__ of the
// same name never runs: what is read is what the tensor is (a Parameter
// subclass whose `shape` says [3, 4] while it holds 12 elements is read as
// [12], as the accelerator reads its TensorImpl). torch's getter still asks
// a subclass's own __torch_function__; Honest() declines those types.
struct Attrs {
  PyObject* is_meta = nullptr, *is_cpu = nullptr, *layout = nullptr, *dtype = nullptr,
            *shape = nullptr, *requires_grad = nullptr, *data = nullptr;
  PyObject* torch_function = nullptr;  // torch.Tensor's __torch_function__
  PyObject* disabled = nullptr;        // torch._C._disabled_torch_function_impl (Parameter's)
  PyTypeObject* tensor_type = nullptr;
  // false with a Python error set.
  bool Find(PyTypeObject* type) {
    if (tensor_type == type) return true;
    const auto find = [type](const char* name, bool settable) -> PyObject* {
      Ref key(PyUnicode_InternFromString(name));
      PyObject* d = key.p != nullptr ? _PyType_Lookup(type, key.p) : nullptr;  // borrowed
      if (d == nullptr || Py_TYPE(d)->tp_descr_get == nullptr ||
          (settable && Py_TYPE(d)->tp_descr_set == nullptr)) {
        if (!PyErr_Occurred())
          PyErr_Format(PyExc_TypeError, "bind_fast: torch.Tensor.%s is no descriptor", name);
        return nullptr;
      }
      return d;
    };
    Ref c(PyImport_ImportModule("torch._C"));
    Ref off(c.p != nullptr ? PyObject_GetAttrString(c.p, "_disabled_torch_function_impl")
                           : nullptr);
    Ref tf_name(PyUnicode_InternFromString("__torch_function__"));
    if (off.p == nullptr || tf_name.p == nullptr) return false;
    PyObject* tf = _PyType_Lookup(type, tf_name.p);
    if (tf == nullptr) {
      PyErr_SetString(PyExc_TypeError, "bind_fast: torch.Tensor has no __torch_function__");
      return false;
    }
    if (!(is_meta = find("is_meta", false)) || !(is_cpu = find("is_cpu", false)) ||
        !(layout = find("layout", false)) || !(dtype = find("dtype", false)) ||
        !(shape = find("shape", false)) || !(requires_grad = find("requires_grad", true)) ||
        !(data = find("data", true)))
      return false;
    torch_function = tf;
    disabled = off.p;
    Py_INCREF(disabled);  // kept for the process, with torch
    tensor_type = type;
    return true;
  }
  // The attribute as torch's getter gives it: a new reference, or nullptr
  // with an error set.
  static PyObject* Get(PyObject* descriptor, PyObject* t) {
    return Py_TYPE(descriptor)->tp_descr_get(descriptor, t,
                                             reinterpret_cast<PyObject*>(Py_TYPE(t)));
  }
  static int Set(PyObject* descriptor, PyObject* t, PyObject* value) {
    return Py_TYPE(descriptor)->tp_descr_set(descriptor, t, value);
  }
  // Whether t's type leaves torch's getters alone: its __torch_function__
  // is torch.Tensor's (which runs the getter itself) or disabled
  // (nn.Parameter's). Another one could answer anything: declined.
  bool Honest(PyObject* t) const {
    static PyObject* const kName = PyUnicode_InternFromString("__torch_function__");
    PyObject* tf = _PyType_Lookup(Py_TYPE(t), kName);
    return tf == torch_function || tf == disabled;
  }
};

// The types of one bind's slots found to be tensors whose getters are
// torch's (Attrs::Honest): a model has two or three, and its 100,000 slots
// are then checked by a compare each. A type is known with its version tag,
// which changes with its bases or attributes.
class KnownTypes {
 public:
  // Whether `t` is an instance of `tensor_type` that Attrs::Honest accepts.
  bool Check(PyObject* t, PyTypeObject* tensor_type, const Attrs& attrs) {
    PyTypeObject* type = Py_TYPE(t);
    for (const auto& [known, tag] : known_)
      if (known == type && tag == type->tp_version_tag && tag != 0) return true;
    if (!PyObject_TypeCheck(t, tensor_type) || !attrs.Honest(t)) return false;
    if (known_.size() < 8) known_.emplace_back(type, type->tp_version_tag);
    return true;
  }

 private:
  std::vector<std::pair<PyTypeObject*, unsigned int>> known_;
};
Attrs& A() {
  static Attrs attrs;  // filled under the GIL, one torch per process
  return attrs;
}

// getattr(o, name) through torch's getter is True: 1, False: 0, an error: -1.
int IsTrue(PyObject* o, PyObject* descriptor) {
  Ref v(Attrs::Get(descriptor, o));
  if (v.p == nullptr) return -1;
  return v.p == Py_True ? 1 : 0;
}

// Whether the torch.Size `shape` is `sizes` (n of them); -1 on an error.
int SameShape(PyObject* shape, const int64_t* sizes, uint32_t n) {
  if (!PyTuple_Check(shape) || PyTuple_GET_SIZE(shape) != static_cast<Py_ssize_t>(n)) return 0;
  for (uint32_t d = 0; d < n; ++d) {
    const long long v = PyLong_AsLongLong(PyTuple_GET_ITEM(shape, d));
    if (v == -1 && PyErr_Occurred()) return -1;
    if (v != sizes[d]) return 0;
  }
  return 1;
}

// DLPack's type for a tsar dtype that every torch of the range imports from
// DLPack (at::fromDLPack), or nullopt (bool, float8 and the rest: made in
// Python).
std::optional<DLDataType> DLPackType(DType d) {
  const auto of = [](uint8_t code, uint8_t bits) { return DLDataType{code, bits, 1}; };
  switch (d) {
    case DType::kUInt8: return of(kDLUInt, 8);
    case DType::kInt8: return of(kDLInt, 8);
    case DType::kInt16: return of(kDLInt, 16);
    case DType::kInt32: return of(kDLInt, 32);
    case DType::kInt64: return of(kDLInt, 64);
    case DType::kFloat16: return of(kDLFloat, 16);
    case DType::kBFloat16: return of(kDLBfloat, 16);
    case DType::kFloat32: return of(kDLFloat, 32);
    case DType::kFloat64: return of(kDLFloat, 64);
    case DType::kComplex64: return of(kDLComplex, 64);
    case DType::kComplex128: return of(kDLComplex, 128);
    default: return std::nullopt;
  }
}

// What a DLPack tensor over the mapping owns: the archive (so the mapping
// lives while torch's storage does) and its shape, inside it up to kInline
// dimensions (one allocation a tensor). Freed by torch's deleter, from
// whichever thread drops the storage, without the GIL: no Python here.
struct Held {
  static constexpr uint32_t kInline = 8;
  ArchiveFile file;
  int64_t inline_dims[2 * kInline];  // sizes, then strides
  std::vector<int64_t> more_dims;    // the same, past kInline dimensions
  DLManagedTensor managed{};
};

void DeleteHeld(DLManagedTensor* m) { delete static_cast<Held*>(m->manager_ctx); }

// A capsule torch never took ("dltensor", not renamed "used_dltensor") still
// owns its tensor.
void DeleteCapsule(PyObject* capsule) {
  if (!PyCapsule_IsValid(capsule, "dltensor")) return;
  auto* m = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule, "dltensor"));
  if (m != nullptr && m->deleter != nullptr) m->deleter(m);
}

// A tensor over `data` of the given shape and strides, through torch's DLPack
// import: one call into torch, where frombuffer + as_strided take two (and a
// view's autograd bookkeeping). The capsule holds the archive, so the
// mapping lives while torch's storage does.
PyObject* ViaDLPack(const ArchiveFile& file, const void* data, const int64_t* sizes,
                    const int64_t* strides, uint32_t ndim, DLDataType type,
                    PyObject* from_dlpack) {
  std::unique_ptr<Held> held(new Held{file, {}, {}, {}});
  int64_t* dims = held->inline_dims;
  if (ndim > Held::kInline) {
    held->more_dims.resize(2 * size_t{ndim});
    dims = held->more_dims.data();
  }
  std::copy(sizes, sizes + ndim, dims);
  std::copy(strides, strides + ndim, dims + ndim);
  DLTensor& dl = held->managed.dl_tensor;
  dl.data = const_cast<void*>(data);
  dl.device = DLDevice{kDLCPU, 0};
  dl.ndim = static_cast<int>(ndim);
  dl.dtype = type;
  dl.shape = dims;
  dl.strides = dims + ndim;
  dl.byte_offset = 0;
  held->managed.manager_ctx = held.get();
  held->managed.deleter = DeleteHeld;
  Ref capsule(PyCapsule_New(&held->managed, "dltensor", DeleteCapsule));
  if (capsule.p == nullptr) return nullptr;
  held.release();  // the capsule owns it now, then torch's storage
  return PyObject_CallOneArg(from_dlpack, capsule.p);
}

// Record `t` as a tensor of its own storage.
PyObject* ViaDLPack(const ArchiveFile& file, const format::Index& index, uint32_t t,
                    DLDataType type, PyObject* from_dlpack) {
  const format::TensorRecord& r = index.tensors()[t];
  return ViaDLPack(file,
                   static_cast<const uint8_t*>(file.storage_values(r.storage)) +
                       r.storage_offset * ElementSize(r.dtype),
                   index.sizes(r), index.strides(r), r.ndim, type, from_dlpack);
}

// torch's dtype object of each tsar dtype this torch has, borrowed from the
// caller's {tsar name: torch dtype} dict; nullptr for the others.
struct DTypeObjects {
  PyObject* of[format::kLastDTypeCode + 1] = {};
  // false with a Python error set.
  bool Fill(PyObject* dtypes) {
    for (DType d : kAllDTypes) {
      const std::string_view name = DTypeName(d);
      Ref key(PyUnicode_FromStringAndSize(name.data(), static_cast<Py_ssize_t>(name.size())));
      if (key.p == nullptr) return false;
      of[static_cast<uint16_t>(d)] = PyDict_GetItemWithError(dtypes, key.p);
      if (PyErr_Occurred()) return false;
    }
    return true;
  }
  PyObject* operator[](DType d) const { return of[static_cast<uint16_t>(d)]; }
};

// The match reads each tensor's TensorImpl (its device, layout, dtype and
// shape), which a model built moments ago no longer has in the caches: one
// wait per tensor, in turn. A hint to the CPU a few tensors ahead lets those
// waits overlap (load_into of the LLaMA bench, A/B in one process: 0.92 ->
// 0.88 ms). torch keeps a tensor object's TensorImpl* in its THPVariable,
// right after PyObject_HEAD (torch 2.15: offset 16) or after MaybeOwned's
// flag (2.7: offset 24). That is torch's layout, not its API, so the hint
// reads the offset that `t._cdata` (torch's own address of the TensorImpl)
// confirmed once in this process, none if neither did; and it is only a
// hint: a prefetch reads nothing.
size_t ImplOffset(PyObject* t, PyTypeObject* tensor_type) {
  static int offset = -1;  // unknown; 0: none; one torch per process
  if (offset < 0) {
    if (!PyObject_TypeCheck(t, tensor_type)) return 0;  // ask again with a tensor
    static PyObject* const kCData = PyUnicode_InternFromString("_cdata");
    Ref cdata(PyObject_GetAttr(t, kCData));
    const unsigned long long at = cdata.p != nullptr ? PyLong_AsUnsignedLongLong(cdata.p) : 0;
    if (PyErr_Occurred()) PyErr_Clear();
    offset = 0;
    for (const int candidate : {16, 24}) {
      uintptr_t kept = 0;
      std::memcpy(&kept, reinterpret_cast<const char*>(t) + candidate, sizeof kept);
      if (at != 0 && kept == at) offset = candidate;
    }
  }
  return static_cast<size_t>(offset);
}

// `t`: any object; only a tensor's is read.
void HintImpl(PyObject* t, size_t offset, PyTypeObject* tensor_type) {
  if (!PyObject_TypeCheck(t, tensor_type)) return;  // state_dict items from Python: anything
  const char* impl = nullptr;
  std::memcpy(&impl, reinterpret_cast<const char*>(t) + offset, sizeof impl);
  for (int line = 0; line < 4; ++line) __builtin_prefetch(impl + 64 * line);
}

// How many records view each storage (a storage of one is its tensor's own).
std::vector<uint32_t> StorageUsers(const format::Index& index) {
  std::vector<uint32_t> users(index.storages().size(), 0);
  for (const format::TensorRecord& r : index.tensors()) ++users[r.storage];
  return users;
}

enum class State : uint8_t { kMissing, kMatched, kTied };

// Whether records a and b are one view of one storage (a tie the archive
// kept: tsar.save of a tied module writes both names over one storage).
bool SameView(const format::Index& index, uint32_t a, uint32_t b) {
  const format::TensorRecord& x = index.tensors()[a];
  const format::TensorRecord& y = index.tensors()[b];
  return a == b || (x.storage == y.storage && x.storage_offset == y.storage_offset &&
                    x.dtype == y.dtype && x.ndim == y.ndim &&
                    std::equal(index.sizes(x), index.sizes(x) + x.ndim, index.sizes(y)) &&
                    std::equal(index.strides(x), index.strides(x) + x.ndim, index.strides(y)));
}

// (v[0], ..., v[n-1]) as a tuple of ints; nullptr with an error set.
PyObject* IntTuple(const int64_t* v, uint32_t n) {
  PyObject* out = PyTuple_New(n);
  for (uint32_t d = 0; out != nullptr && d < n; ++d) {
    PyObject* x = PyLong_FromLongLong(v[d]);
    if (x == nullptr) {
      Py_DECREF(out);
      return nullptr;
    }
    PyTuple_SET_ITEM(out, d, x);
  }
  return out;
}

// flat.as_strided(sizes, strides, storage_offset) of record `rec`: its view of
// the 1-d tensor `flat` over its whole storage (of the record's dtype).
PyObject* AsStrided(PyObject* flat, const format::Index& index, const format::TensorRecord& rec) {
  static PyObject* const kAsStrided = PyUnicode_InternFromString("as_strided");
  Ref sizes(IntTuple(index.sizes(rec), rec.ndim)), strides(IntTuple(index.strides(rec), rec.ndim));
  Ref offset(PyLong_FromUnsignedLongLong(rec.storage_offset));
  if (sizes.p == nullptr || strides.p == nullptr || offset.p == nullptr) return nullptr;
  return PyObject_CallMethodObjArgs(flat, kAsStrided, sizes.p, strides.p, offset.p, nullptr);
}

// Record rec's view of its storage's flat 1-d tensor: the one kept in `first`
// ({storage: tensor}, PortableArchive._first, where its _flat keeps them),
// or, where `flat` (first's entry, looked up by the caller) is nullptr, one
// made through DLPack as rec's dtype and kept there (the first kept wins, as
// _flat's setdefault). So a storage is one torch storage whoever makes it, and
// PortableArchive.view's other-dtype views of it too. A new reference; None
// where PortableArchive.view must make the view (the flat has another dtype
// than `dtype`, rec's, or the storage is empty or no whole number of rec's
// elements); nullptr with an error set.
PyObject* ViewOfKept(const ArchiveFile& file, const format::Index& index,
                     const format::TensorRecord& rec, DLDataType type, PyObject* dtype,
                     PyObject* from_dlpack, PyObject* first, PyObject* key, PyObject* flat) {
  static PyObject* const kDType = PyUnicode_InternFromString("dtype");
  if (flat == nullptr) {
    const uint64_t nbytes = index.storages()[rec.storage].nbytes;
    const uint64_t item = ElementSize(rec.dtype);
    if (nbytes == 0 || nbytes % item != 0) Py_RETURN_NONE;  // _flat's other cases
    const int64_t n = static_cast<int64_t>(nbytes / item), one = 1;
    Ref made(ViaDLPack(file, file.storage_values(rec.storage), &n, &one, 1, type, from_dlpack));
    if (made.p == nullptr) return nullptr;
    flat = PyDict_SetDefault(first, key, made.p);  // borrowed
    if (flat == nullptr) return nullptr;
  }
  Ref flat_dtype(PyObject_GetAttr(flat, kDType));
  if (flat_dtype.p == nullptr) return nullptr;
  if (flat_dtype.p != dtype) Py_RETURN_NONE;  // another dtype's view: PortableArchive.view
  return AsStrided(flat, index, rec);
}

}  // namespace

PyObject* FastBind(const ArchiveFile& file, PyObject* module, PyObject* items, bool training,
                   PyObject* loose, const FastBindArgs& a) {
  Attrs& k = A();
  if (!k.Find(a.tensor_type)) return nullptr;
  KnownTypes types;
  const ArchiveCore& core = *file.core();
  const format::Index& index = core.index;
  // Tensor parallelism: here only a rank of the world the archive was packed
  // for (each sharded tensor's slice is its block); any other world, and a
  // whole module bound from such an archive, in tsar/_portable_bind.py.
  const int64_t tp = index.tp_world();
  const bool ranked = tp != 0 && a.world == tp && a.rank >= 0 && a.rank < tp;
  if (!ranked && (tp != 0 || a.world > 1 || a.rank != 0)) Py_RETURN_NONE;

  // The slots: the module walked here, or (name, tensor) items from Python.
  WalkedModule walked;
  if (module != Py_None) {
    std::optional<WalkedModule> w = WalkModule(module, a.plain_cache, a.plain, a.tensor_type);
    if (!w) Py_RETURN_NONE;
    walked = std::move(*w);
  } else {
    walked.training = training;
    if (!PyList_Check(items) || !PyList_Check(loose)) Py_RETURN_NONE;
    for (PyObject* list : {items, loose}) {
      auto& to = list == items ? walked.slots : walked.non_persistent;
      for (Py_ssize_t i = 0; i < PyList_GET_SIZE(list); ++i) {
        PyObject* item = PyList_GET_ITEM(list, i);
        if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) != 2) Py_RETURN_NONE;
        PyObject* name = PyTuple_GET_ITEM(item, 0);
        Py_ssize_t n = 0;
        const char* s = PyUnicode_Check(name) ? PyUnicode_AsUTF8AndSize(name, &n) : nullptr;
        if (s == nullptr) {
          PyErr_Clear();
          Py_RETURN_NONE;
        }
        // Held: the bind below calls into Python, which could drop the list's items.
        to.push_back({std::string(s, static_cast<size_t>(n)),
                      walked.refs.Hold(PyTuple_GET_ITEM(item, 1))});
      }
    }
  }
  if (walked.training && file.mode() == MapMode::kShared && !a.allow_training) Py_RETURN_NONE;
  std::vector<WalkedTensor>& slots = walked.slots;

  DTypeObjects dtype_of;
  if (!dtype_of.Fill(a.dtypes)) return nullptr;

  // The match: a record per slot, each checked as tsar/_portable_bind.py
  // checks it. Anything that one would report or refuse (a dtype or shape
  // mismatch, a device, a layout, strict with names left over, a meta tensor
  // left unbound) returns None: that path then says so in its own words.
  const uint32_t entry = core.BindEntry(a.entry);
  const format::EntryRecord& e = index.entries()[entry];
  const uint32_t end = e.first_tensor + e.tensor_count;
  std::vector<uint32_t> match(slots.size(), format::kNone);
  std::vector<State> state(slots.size(), State::kMissing);
  std::vector<bool> meta(slots.size(), false);
  std::vector<bool> used(e.tensor_count, false);
  const std::string& mp = a.module_prefix;
  std::string key;
  // The shape of the rank's slice of sharded record `rec`: its block's.
  std::vector<int64_t> block_sizes;
  const auto block_shape = [&](const format::TensorRecord& rec) {
    const int64_t* full = index.sizes(rec);
    block_sizes.assign(full, full + rec.ndim);
    block_sizes[rec.shard_dim] /= tp;
    return block_sizes.data();
  };
  uint32_t next = e.first_tensor;  // a module usually lists tensors in the archive's order
  constexpr size_t kAhead = 4;
  const size_t impl_at = slots.empty() ? 0 : ImplOffset(slots[0].tensor, a.tensor_type);
  for (size_t i = 0; impl_at != 0 && i < std::min(kAhead, slots.size()); ++i)
    HintImpl(slots[i].tensor, impl_at, a.tensor_type);
  for (size_t i = 0; i < slots.size(); ++i) {
    PyObject* t = slots[i].tensor;
    if (impl_at != 0 && i + kAhead < slots.size())
      HintImpl(slots[i + kAhead].tensor, impl_at, a.tensor_type);
    if (!types.Check(t, a.tensor_type, k)) Py_RETURN_NONE;
    const int is_meta = IsTrue(t, k.is_meta);
    if (is_meta < 0) return nullptr;
    if (!is_meta) {
      const int is_cpu = IsTrue(t, k.is_cpu);
      if (is_cpu <= 0) return is_cpu < 0 ? nullptr : (Py_INCREF(Py_None), Py_None);
    }
    meta[i] = is_meta;
    const std::string& name = slots[i].name;
    if (name.compare(0, mp.size(), mp) != 0) continue;
    key.assign(a.archive_prefix).append(name, mp.size());
    const uint32_t r =
        next < end && index.tensors()[next].name == key ? next : index.FindTensor(entry, key);
    if (r == format::kNone) continue;
    const format::TensorRecord& rec = index.tensors()[r];
    if (rec.role == format::Role::kSparseComponent) Py_RETURN_NONE;
    Ref layout(Attrs::Get(k.layout, t)), dtype(Attrs::Get(k.dtype, t)),
        shape(Attrs::Get(k.shape, t));
    if (layout.p == nullptr || dtype.p == nullptr || shape.p == nullptr) return nullptr;
    if (layout.p != a.strided || dtype.p != dtype_of[rec.dtype])
      Py_RETURN_NONE;
    const int64_t* sizes = rec.shard_dim == format::kNone ? index.sizes(rec) : block_shape(rec);
    const int same = SameShape(shape.p, sizes, rec.ndim);
    if (same <= 0) return same < 0 ? nullptr : (Py_INCREF(Py_None), Py_None);
    next = r + 1;
    used[r - e.first_tensor] = true;
    match[i] = r;
    state[i] = State::kMatched;
  }

  // Ties: one tensor object under several names. A name the archive lacks is
  // bound through its twin; twins the archive holds as records of different
  // views (which may hold other values) are left to tsar/_portable_bind.py.
  std::vector<std::pair<PyObject*, size_t>> by_object(slots.size());
  for (size_t i = 0; i < slots.size(); ++i) by_object[i] = {slots[i].tensor, i};
  std::sort(by_object.begin(), by_object.end());
  std::vector<bool> bound(slots.size(), false), first_of_object(slots.size(), true);
  for (size_t lo = 0, hi; lo < by_object.size(); lo = hi) {
    for (hi = lo + 1; hi < by_object.size() && by_object[hi].first == by_object[lo].first;) ++hi;
    uint32_t record = format::kNone;
    bool first = true;
    for (size_t j = lo; j < hi; ++j) {
      const size_t i = by_object[j].second;
      if (state[i] != State::kMatched) continue;
      if (record != format::kNone && !SameView(index, match[i], record)) Py_RETURN_NONE;
      record = match[i];
      first_of_object[i] = first;
      first = false;
    }
    for (size_t j = lo; j < hi; ++j) {
      const size_t i = by_object[j].second;
      bound[i] = record != format::kNone;
      if (bound[i] && state[i] == State::kMissing) state[i] = State::kTied;
    }
  }

  Ref bound_names(PyList_New(0)), missing(PyList_New(0)), unexpected(PyList_New(0)),
      tied(PyList_New(0));
  if (!bound_names.p || !missing.p || !unexpected.p || !tied.p) return nullptr;
  const auto append = [](PyObject* list, std::string_view s) {
    Ref str(PyUnicode_FromStringAndSize(s.data(), static_cast<Py_ssize_t>(s.size())));
    return str.p != nullptr && PyList_Append(list, str.p) == 0;
  };
  for (size_t i = 0; i < slots.size(); ++i) {
    if (state[i] == State::kMissing) {
      if (a.strict || meta[i]) Py_RETURN_NONE;  // refused, with the names, in Python
      if (!append(missing.p, slots[i].name)) return nullptr;
    } else if (state[i] == State::kTied && !append(tied.p, slots[i].name)) {
      return nullptr;
    }
  }
  for (uint32_t r = e.first_tensor; r < end; ++r) {
    if (used[r - e.first_tensor] || index.tensors()[r].role == format::Role::kSparseComponent)
      continue;
    if (a.strict) Py_RETURN_NONE;
    if (!append(unexpected.p, index.tensors()[r].name)) return nullptr;
  }
  // A rank's block comes through DLPack as a tensor of its own: where two
  // objects of the module would view one sharded storage (tied in the
  // archive, not in the module), tsar/_portable_bind.py gives them one.
  std::vector<uint32_t> blocks;
  for (size_t i = 0; ranked && i < slots.size(); ++i) {
    if (state[i] != State::kMatched || !first_of_object[i]) continue;
    const format::TensorRecord& rec = index.tensors()[match[i]];
    if (rec.shard_dim == format::kNone) continue;
    if (!DLPackType(rec.dtype)) Py_RETURN_NONE;
    blocks.push_back(rec.storage);
  }
  std::sort(blocks.begin(), blocks.end());
  if (std::adjacent_find(blocks.begin(), blocks.end()) != blocks.end()) Py_RETURN_NONE;
  std::vector<PyObject*> bound_objects;
  for (size_t i = 0; i < slots.size(); ++i)
    if (bound[i]) bound_objects.push_back(slots[i].tensor);
  std::sort(bound_objects.begin(), bound_objects.end());
  for (const WalkedTensor& w : walked.non_persistent) {
    if (!types.Check(w.tensor, a.tensor_type, k)) Py_RETURN_NONE;
    const int is_meta = IsTrue(w.tensor, k.is_meta);
    if (is_meta < 0) return nullptr;
    if (is_meta && !std::binary_search(bound_objects.begin(), bound_objects.end(), w.tensor))
      Py_RETURN_NONE;
  }

  // Every check passed: each matched tensor takes its view of the mapping in
  // place. A storage no other record uses comes through DLPack as the tensor
  // itself; the tensors of one that is shared (views, ties) are views of its
  // flat tensor kept in PortableArchive._first (ViewOfKept), or come from
  // PortableArchive.view in another dtype: one torch storage either way.
  Ref entry_name(PyUnicode_FromStringAndSize(e.name.data(), static_cast<Py_ssize_t>(e.name.size())));
  if (entry_name.p == nullptr) return nullptr;
  const std::vector<uint32_t> users = StorageUsers(index);
  for (size_t i = 0; i < slots.size(); ++i) {
    if (state[i] != State::kMatched) continue;
    if (!append(bound_names.p, slots[i].name)) return nullptr;
    if (!first_of_object[i]) continue;  // a tie: its tensor is bound already
    const format::TensorRecord& rec = index.tensors()[match[i]];
    const std::optional<DLDataType> type = DLPackType(rec.dtype);
    const bool block = rec.shard_dim != format::kNone;  // (ranked: checked above)
    const bool own = block || (type && users[rec.storage] == 1 &&
                               index.storages()[rec.storage].nbytes != 0);
    Ref view;
    if (block) {  // rank a.rank's slice, C-contiguous at its block (spec §4.12.2)
      const int64_t* sizes = block_shape(rec);
      const std::vector<int64_t> strides = format::ShardStrides(block_sizes);
      const auto* data = static_cast<const uint8_t*>(file.storage_data(rec.storage)) +
                         static_cast<uint64_t>(a.rank) * index.ShardLayoutOf(rec).block_stride;
      view.p = ViaDLPack(file, data, sizes, strides.data(), rec.ndim, *type, a.from_dlpack);
      if (view.p == nullptr) return nullptr;
    } else if (own) {
      view.p = ViaDLPack(file, index, match[i], *type, a.from_dlpack);
      if (view.p == nullptr) return nullptr;
    } else if (type) {  // a shared storage: a view of its flat tensor, kept in first
      Ref key(PyLong_FromUnsignedLong(rec.storage));
      if (key.p == nullptr) return nullptr;
      PyObject* flat = PyDict_GetItemWithError(a.first, key.p);  // borrowed
      if (flat == nullptr && PyErr_Occurred()) return nullptr;
      view.p = ViewOfKept(file, index, rec, *type, dtype_of[rec.dtype], a.from_dlpack, a.first,
                          key.p, flat);
      if (view.p == nullptr) return nullptr;
      if (view.p == Py_None) {
        Py_DECREF(view.p);
        view.p = nullptr;
      }
    }
    if (view.p == nullptr) {  // the other dtypes: PortableArchive.view
      Ref name(PyUnicode_FromStringAndSize(rec.name.data(),
                                           static_cast<Py_ssize_t>(rec.name.size())));
      if (name.p == nullptr) return nullptr;
      view.p = PyObject_CallFunctionObjArgs(a.view_of, entry_name.p, name.p, nullptr);
    }
    if (view.p == nullptr) return nullptr;
    PyObject* t = slots[i].tensor;
    if (!meta[i]) {  // set_data: the same object and TensorImpl, the view's storage
      if (Attrs::Set(k.data, t, view.p) != 0) return nullptr;
      continue;
    }
    // A meta tensor cannot take CPU data: the object takes the TensorImpl of
    // a CPU tensor instead (torch._C._swap_tensor_impl), keeping its class,
    // __dict__ and requires_grad. A view of a shared storage is detached
    // first (Tensor._make_subclass), so the parameter is no autograd view.
    const int requires_grad = IsTrue(t, k.requires_grad);
    if (requires_grad < 0) return nullptr;
    Ref swapped(own ? nullptr
                    : PyObject_CallFunctionObjArgs(a.make_subclass,
                                                   reinterpret_cast<PyObject*>(Py_TYPE(t)),
                                                   view.p, Py_False, nullptr));
    if (!own && swapped.p == nullptr) return nullptr;
    Ref done(PyObject_CallFunctionObjArgs(a.swap, t, own ? view.p : swapped.p, nullptr));
    if (done.p == nullptr) return nullptr;
    if (requires_grad && Attrs::Set(k.requires_grad, t, Py_True) != 0) return nullptr;
  }
  Ref mismatched(PyList_New(0));
  if (mismatched.p == nullptr) return nullptr;
  return PyTuple_Pack(5, bound_names.p, missing.p, unexpected.p, mismatched.p, tied.p);
}

PyObject* DLPackTensors(const ArchiveFile& file, const std::string& entry, PyObject* from_dlpack,
                        PyObject* first, PyObject* dtypes) {
  static PyObject* const kDetach = PyUnicode_InternFromString("detach");
  if (!PyDict_Check(first) || !PyDict_Check(dtypes)) {
    PyErr_SetString(PyExc_TypeError, "dlpack_tensors: expected dicts");
    return nullptr;
  }
  const ArchiveCore& core = *file.core();
  const format::Index& index = core.index;
  const uint32_t e = core.Entry(entry);
  const std::vector<uint32_t> users = StorageUsers(index);
  DTypeObjects dtype_of;
  if (!dtype_of.Fill(dtypes)) return nullptr;
  // The tensor of record t, a new reference; None where Python makes it;
  // nullptr with an error set.
  const auto make = [&](uint32_t t) -> PyObject* {
    const format::TensorRecord& rec = index.tensors()[t];
    const std::optional<DLDataType> type = DLPackType(rec.dtype);
    PyObject* dtype = dtype_of[rec.dtype];
    if (!type || dtype == nullptr) Py_RETURN_NONE;
    Ref key(PyLong_FromUnsignedLong(rec.storage));
    if (key.p == nullptr) return nullptr;
    PyObject* flat = PyDict_GetItemWithError(first, key.p);  // borrowed
    if (flat == nullptr && PyErr_Occurred()) return nullptr;
    // The storage is this tensor's alone and all of it: the tensor itself
    // through DLPack (one call), its torch storage the archive storage's.
    // Else a view of the storage's flat tensor, as _flat makes it.
    // (A decoded record's view passed R48-R53: ComputeViewExtent has no fault.)
    const uint64_t nbytes = index.storages()[rec.storage].nbytes;
    const bool alone = flat == nullptr && nbytes != 0 && users[rec.storage] == 1 &&
                       rec.storage_offset == 0 &&
                       format::ComputeViewExtent(index.sizes(rec), index.strides(rec), rec.ndim,
                                                 0, ElementSize(rec.dtype))
                               .end == nbytes;
    if (alone) {
      Ref made(ViaDLPack(file, index, t, *type, from_dlpack));
      if (made.p == nullptr) return nullptr;
      // Kept: the tensor itself would carry the caller's requires_grad_()
      // and in-place changes into every later view; an alias of it does not.
      Ref kept(PyObject_CallMethodNoArgs(made.p, kDetach));
      if (kept.p == nullptr) return nullptr;
      // The first one made for this storage wins (as _flat's setdefault).
      flat = PyDict_SetDefault(first, key.p, kept.p);
      if (flat == nullptr) return nullptr;
      if (flat == kept.p) {
        PyObject* tensor = made.p;
        made.p = nullptr;
        return tensor;
      }
    }
    return ViewOfKept(file, index, rec, *type, dtype, from_dlpack, first, key.p, flat);
  };
  Ref out(PyList_New(0));
  if (out.p == nullptr) return nullptr;
  bool failed = false;
  core.ForEachVisible(e, [&](std::string_view, uint32_t t, uint32_t) {
    if (failed) return;
    Ref tensor(t == format::kNone ? (Py_INCREF(Py_None), Py_None) : make(t));
    failed = tensor.p == nullptr || PyList_Append(out.p, tensor.p) != 0;
  });
  if (failed) return nullptr;
  PyObject* list = out.p;
  out.p = nullptr;
  return list;
}

}  // namespace tsar::python
