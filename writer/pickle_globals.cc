// The restricted pickle machine's globals and calls (writer/pickle_machine.h):
// a GLOBAL is never resolved, a call of an allowed one is interpreted here
// (tensors, parameters, storages, OrderedDict, bytes), any other call only
// recorded, to be written back.
#include <algorithm>
#include <cstring>
#include <iterator>
#include <string_view>

#include "format/reader.h"
#include "tsar/dtype.h"
#include "writer/pickle_machine.h"

namespace tsar::pickle::detail {

using format::CheckedAdd;
using format::CheckedMul;
using format::Quote;

// A global is never resolved: one that tsar interprets is marked with its
// kAllowed index, any other is only a name, kept to be written back.
uint32_t Machine::LookupGlobal(const std::string& module, const std::string& name) {
  if (module.empty() || name.empty() || module.find('\n') != std::string::npos ||
      name.find('\n') != std::string::npos) {
    Fail("global " + Quote(module + "." + name) +
         ": expected a module and a name without newlines");
  }
  uint32_t id = New(NodeKind::kGlobal);
  At(id).i = -1;
  At(id).s = module + "\n" + name;
  for (size_t k = 0; k < std::size(kAllowed); ++k) {
    if (module == kAllowed[k].module && name == kAllowed[k].name)
      At(id).i = static_cast<int64_t>(k);
  }
  return id;
}

uint32_t Machine::Builtin(const char* name) { return LookupGlobal("builtins", name); }

std::string Machine::GlobalName(const Node& n) const {
  std::string s = n.s;
  std::replace(s.begin(), s.end(), '\n', '.');
  return s;
}

uint32_t Machine::NewObject(uint32_t callable, uint32_t args, uint8_t how, int64_t kwargs) {
  if (At(callable).kind == NodeKind::kStorage) Fail("a storage cannot be called");
  objects_.push_back(Object{callable, args, kwargs, how, {}});
  uint32_t id = New(NodeKind::kObject);
  At(id).i = static_cast<int64_t>(objects_.size() - 1);
  return id;
}

void Machine::AddItems(uint32_t target, const std::vector<uint32_t>& items, bool dict) {
  if (dict && items.size() % 2 != 0) Fail("SETITEMS: expected key/value pairs, found an odd count");
  if (At(target).kind == NodeKind::kObject) {  // obj[k] = v or obj.append(x), replayed on load
    objects_[At(target).i].ops.emplace_back(dict ? op::kSetItems : op::kAppends, items);
    return;
  }
  Node& n = Expect(target, dict ? NodeKind::kDict : NodeKind::kList,
                   dict ? "SETITEM(S) target" : "APPEND(S) target");
  if (dict) {
    for (size_t k = 0; k < items.size(); k += 2) {
      NodeKind key = At(items[k]).kind;
      if (key == NodeKind::kList || key == NodeKind::kDict) {  // Python raises TypeError too
        Fail(std::string("dict key: expected a hashable value, found a ") + KindName(key));
      }
    }
  }
  // `n` may be among `items` (a list appended to itself); Convert rejects the cycle.
  n.items.insert(n.items.end(), items.begin(), items.end());
}

uint32_t Machine::Call(uint32_t fn_id, uint32_t args_id, uint8_t how, int64_t kwargs) {
  const std::vector<uint32_t>& a = Expect(args_id, NodeKind::kTuple, "arguments").items;
  const Node& fn = At(fn_id);
  if (fn.kind != NodeKind::kGlobal || fn.i < 0 || how == op::kNewObjEx) {
    return NewObject(fn_id, args_id, how, kwargs);  // kept, never called
  }
  const bool newobj = how == op::kNewObj;
  const Allowed& g = kAllowed[fn.i];
  const std::string name = std::string(g.module) + "." + g.name;
  const auto arity = [&](size_t lo, size_t hi) {
    if (a.size() < lo || a.size() > hi) {
      Fail(name + ": expected " + std::to_string(lo) + (lo == hi ? "" : "-" + std::to_string(hi)) +
           " arguments, found " + std::to_string(a.size()));
    }
  };
  if (newobj && g.what != What::kOrderedDict) Fail("NEWOBJ of " + name + " is not supported");
  switch (g.what) {
    case What::kOrderedDict: {
      if (!a.empty()) return NewObject(fn_id, args_id, how);  // OrderedDict(iterable): kept
      uint32_t id = New(NodeKind::kDict);                     // items follow through SETITEMS
      At(id).ordered = true;
      return id;
    }
    case What::kBytes:
      arity(0, 0);
      return New(NodeKind::kBytes);
    case What::kCodecsEncode: {
      arity(2, 2);
      const std::string& text = Expect(a[0], NodeKind::kString, name + " text").s;
      const std::string& codec = Expect(a[1], NodeKind::kString, name + " encoding").s;
      if (codec != "latin1" && codec != "latin-1")
        Fail(name + ": expected latin1, found " + Quote(codec));
      // The text is valid UTF-8 already; code points <= 0xFF use lead byte 0xC2 or 0xC3.
      std::string bytes;
      for (size_t k = 0; k < text.size(); ++k) {
        auto c = static_cast<uint8_t>(text[k]);
        if (c >= 0x80 && c != 0xC2 && c != 0xC3) Fail(name + ": text is not latin-1");
        bytes += static_cast<char>(c < 0x80 ? c : ((c & 0x03) << 6) | (text[++k] & 0x3F));
      }
      uint32_t id = New(NodeKind::kBytes);
      At(id).s = std::move(bytes);
      return id;
    }
    case What::kRebuildTensor:
      return RebuildTensor(a, false);
    case What::kRebuildTensorV3:
      return RebuildTensor(a, true);
    case What::kRebuildParameter:
    case What::kRebuildParameterState: {
      // (data, requires_grad, backward_hooks[, state]); state holds Python
      // attributes of the Parameter, which tsar has no use for.
      g.what == What::kRebuildParameter ? arity(3, 3) : arity(4, 4);
      TensorRef t = tensors_[Expect(a[0], NodeKind::kTensor, name + " data").i];
      t.requires_grad = Expect(a[1], NodeKind::kBool, name + " requires_grad").i != 0;
      if (!Expect(a[2], NodeKind::kDict, name + " backward_hooks").items.empty()) {
        Fail(name + " backward_hooks: expected an empty dict");
      }
      t.is_parameter = true;
      return NewTensor(std::move(t));
    }
    case What::kStorageType:
    case What::kDType:
      break;
  }
  Fail(name + " cannot be called");
}

uint32_t Machine::RebuildTensor(const std::vector<uint32_t>& a, bool v3) {
  // _rebuild_tensor_v2(storage, storage_offset, size, stride, requires_grad,
  // backward_hooks[, metadata]); torch 2.x adds metadata for conj/neg views.
  // _rebuild_tensor_v3 has a dtype before the metadata.
  const std::string name = v3 ? "torch._utils._rebuild_tensor_v3" : "torch._utils._rebuild_tensor_v2";
  const size_t fixed = v3 ? 7 : 6;
  if (a.size() != fixed && a.size() != fixed + 1) {
    Fail(name + ": expected " + std::to_string(fixed) + " or " + std::to_string(fixed + 1) +
         " arguments, found " + std::to_string(a.size()));
  }
  TensorRef t;
  t.storage = static_cast<uint32_t>(Expect(a[0], NodeKind::kStorage, name + " storage").i);
  if (v3) RetypeStorage(t.storage, a[6], name);
  t.storage_offset = static_cast<uint64_t>(ExpectInt(a[1], name + " storage_offset"));
  const std::vector<uint32_t>& size = Expect(a[2], NodeKind::kTuple, name + " size").items;
  const std::vector<uint32_t>& stride = Expect(a[3], NodeKind::kTuple, name + " stride").items;
  if (size.size() != stride.size() || size.size() > kMaxRank) {
    Fail(name + ": expected size and stride of equal rank <= " + std::to_string(kMaxRank) +
         ", found " + std::to_string(size.size()) + " and " + std::to_string(stride.size()));
  }
  for (size_t k = 0; k < size.size(); ++k) {
    t.sizes.push_back(ExpectInt(size[k], name + " size"));
    t.strides.push_back(ExpectInt(stride[k], name + " stride"));
  }
  t.requires_grad = Expect(a[4], NodeKind::kBool, name + " requires_grad").i != 0;
  if (!Expect(a[5], NodeKind::kDict, name + " backward_hooks").items.empty()) {
    Fail(name + " backward_hooks: expected an empty dict");
  }
  if (a.size() == fixed + 1) {
    const std::vector<uint32_t>& meta = Expect(a[fixed], NodeKind::kDict, name + " metadata").items;
    for (size_t k = 1; k < meta.size(); k += 2) {
      if (At(meta[k]).kind != NodeKind::kBool || At(meta[k]).i != 0) {
        throw Error(ErrorCode::kUnsupported, path_, op_offset_,
                    "pickle: tensor metadata " + Quote(At(meta[k - 1]).s) +
                        " is set (conj/neg views are not supported)");
      }
    }
  }
  // Every addressable element must lie in the storage; an empty view addresses none.
  uint64_t last = t.storage_offset;
  const bool empty = std::find(t.sizes.begin(), t.sizes.end(), 0) != t.sizes.end();
  for (size_t k = 0; k < t.sizes.size() && !empty; ++k) {
    uint64_t span;
    if (!CheckedMul(static_cast<uint64_t>(t.sizes[k] - 1), static_cast<uint64_t>(t.strides[k]),
                    &span) ||
        !CheckedAdd(last, span, &last)) {
      throw Error(ErrorCode::kOverflow, path_, op_offset_,
                  "pickle: tensor extent overflows 64 bits");
    }
  }
  const StorageRef& st = storages_[t.storage];
  if (!empty && last >= st.numel) {
    Fail("tensor: expected its last element inside storage " + Quote(st.key) + " of " +
         std::to_string(st.numel) + " elements, found element " + std::to_string(last));
  }
  return NewTensor(std::move(t));
}

// _rebuild_tensor_v3's dtype gives an UntypedStorage (counted in bytes) its
// element type, once: torch.save refuses to save one storage as two dtypes.
void Machine::RetypeStorage(uint32_t storage, uint32_t dtype_node, const std::string& name) {
  const Node& d = At(dtype_node);
  if (d.kind != NodeKind::kGlobal || d.i < 0 || kAllowed[d.i].what != What::kDType) {
    Fail(name + " dtype: expected a torch dtype (torch.float8_e4m3fn, torch.uint16, ...)");
  }
  const std::string dtype = kAllowed[d.i].dtype;
  StorageRef& st = storages_[storage];
  if (st.dtype == dtype) return;
  if (!st.untyped || st.dtype != "uint8") {  // typed, or given a dtype already
    Fail("storage " + Quote(st.key) + ": expected one dtype for every tensor on it, found " +
         st.dtype + " and " + dtype);
  }
  const size_t size = ElementSize(*DTypeFromName(dtype));
  if (st.numel % size != 0) {
    Fail("storage " + Quote(st.key) + ": " + std::to_string(st.numel) +
         " bytes are not a whole number of " + dtype + " elements");
  }
  st.numel /= size;
  st.dtype = dtype;
}

uint32_t Machine::LoadStorage(uint32_t pid) {
  const std::vector<uint32_t>& p = Expect(pid, NodeKind::kTuple, "persistent id").items;
  if (p.size() != 5 || At(p[0]).kind != NodeKind::kString || At(p[0]).s != "storage") {
    Fail("persistent id: expected ('storage', type, key, location, numel)");
  }
  const Node& type = At(p[1]);
  if (type.kind != NodeKind::kGlobal || type.i < 0 || kAllowed[type.i].what != What::kStorageType) {
    Fail("persistent id type: expected a torch storage class");
  }
  StorageRef ref{Expect(p[2], NodeKind::kString, "storage key").s, kAllowed[type.i].dtype,
                 Expect(p[3], NodeKind::kString, "storage location").s,
                 static_cast<uint64_t>(ExpectInt(p[4], "storage numel"))};
  if (std::string_view(kAllowed[type.i].name) == "UntypedStorage") {
    ref.untyped = true;
    ref.untyped_bytes = ref.numel;
  }
  // Keys become zip record names, so only the characters torch uses get through.
  bool key_ok = !ref.key.empty() && ref.key.size() <= kMaxKeyLength;
  for (char c : ref.key) {
    key_ok = key_ok && ((c >= '0' && c <= '9') || (c >= 'A' && c <= 'Z') ||
                        (c >= 'a' && c <= 'z') || c == '_');
  }
  if (!key_ok) Fail("storage key " + Quote(ref.key) + ": expected 1-64 of [0-9A-Za-z_]");
  if (ref.location.empty() || ref.location.size() > kMaxKeyLength) {
    Fail("storage location " + Quote(ref.location) + ": expected 1-64 bytes");
  }
  auto [it, inserted] = storage_index_.emplace(ref.key, static_cast<uint32_t>(storages_.size()));
  if (inserted) {
    storages_.push_back(ref);
  } else {
    const StorageRef& old = storages_[it->second];
    const bool same_bytes = old.untyped ? ref.untyped && old.untyped_bytes == ref.numel
                                        : old.dtype == ref.dtype && old.numel == ref.numel;
    if (!same_bytes || old.location != ref.location) {
      Fail("storage " + Quote(ref.key) +
           ": expected the same dtype, numel and location at "
           "every reference, found " +
           old.dtype + "[" + std::to_string(old.numel) + "] and " + ref.dtype + "[" +
           std::to_string(ref.numel) + "]");
    }
  }
  uint32_t id = New(NodeKind::kStorage);
  At(id).i = it->second;
  return id;
}

}  // namespace tsar::pickle::detail
