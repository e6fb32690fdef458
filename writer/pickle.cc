// A small pickle virtual machine for torch.save's data.pkl that never executes
// anything: globals come from a fixed allow-list and are interpreted here.
#include "writer/pickle.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <deque>
#include <iterator>
#include <string_view>
#include <unordered_map>

#include "format/endian.h"
#include "format/reader.h"
#include "tsar/dtype.h"
#include "tsar/error.h"
#include "writer/pickler.h"

namespace tsar::pickle {
namespace {

using format::CheckedAdd;
using format::CheckedMul;
using format::Quote;

// Opcodes, named as in CPython's Lib/pickletools.py.
namespace op {
constexpr uint8_t kMark = '(', kStop = '.', kPop = '0', kPopMark = '1', kBinInt = 'J',
                  kBinInt1 = 'K', kBinInt2 = 'M', kNone = 'N', kBinPersId = 'Q', kReduce = 'R',
                  kBinString = 'T', kShortBinString = 'U', kBinUnicode = 'X', kAppend = 'a',
                  kBuild = 'b', kGlobal = 'c', kDict = 'd', kEmptyDict = '}', kAppends = 'e',
                  kBinGet = 'h', kLongBinGet = 'j', kList = 'l', kEmptyList = ']', kBinPut = 'q',
                  kLongBinPut = 'r', kSetItem = 's', kTuple = 't', kEmptyTuple = ')',
                  kSetItems = 'u', kBinFloat = 'G', kBinBytes = 'B', kShortBinBytes = 'C',
                  kProto = 0x80, kNewObj = 0x81, kTuple1 = 0x85, kTuple2 = 0x86, kTuple3 = 0x87,
                  kNewTrue = 0x88, kNewFalse = 0x89, kLong1 = 0x8a, kLong4 = 0x8b,
                  kShortBinUnicode = 0x8c, kBinUnicode8 = 0x8d, kBinBytes8 = 0x8e,
                  kStackGlobal = 0x93, kMemoize = 0x94, kFrame = 0x95, kDup = '2', kExt1 = 0x82,
                  kExt2 = 0x83, kExt4 = 0x84, kEmptySet = 0x8f, kAddItems = 0x90, kFrozenSet = 0x91,
                  kNewObjEx = 0x92, kByteArray8 = 0x96, kNextBuffer = 0x97, kReadOnlyBuffer = 0x98;
}  // namespace op

// Objects of the VM. Besides the public kinds there are the things a pickle
// builds on the way: a global (never resolved), a storage, and an object
// built by calling something that is not interpreted here.
enum class NodeKind : uint8_t {
  kNone,
  kBool,
  kInt,
  kFloat,
  kString,
  kBytes,
  kList,
  kTuple,
  kDict,
  kTensor,
  kGlobal,
  kStorage,
  kBigInt,
  kObject
};

const char* KindName(NodeKind k) {
  static constexpr const char* kNames[] = {"None",   "bool",    "int",    "float", "str",
                                           "bytes",  "list",    "tuple",  "dict",  "tensor",
                                           "global", "storage", "bigint", "object"};
  return kNames[static_cast<int>(k)];
}

struct Node {
  NodeKind kind = NodeKind::kNone;
  bool ordered = false;  // kDict: made by collections.OrderedDict
  int64_t i = 0;         // kBool, kInt; kTensor: index into tensors_; kStorage: into storages;
                         // kGlobal: index into kAllowed, or -1; kObject: into objects_
  double f = 0;
  std::string s;                // kString (UTF-8), kBytes, kBigInt; kGlobal: "module\nname"
  std::vector<uint32_t> items;  // kList/kTuple elements; kDict: key, value, key, value...
  int64_t attrs = -1;           // kDict: the node BUILD set as its attributes
};

// An object built by REDUCE, NEWOBJ or NEWOBJ_EX of something not interpreted
// here, then changed by BUILD, APPEND(S), SETITEM(S) or ADDITEMS: recorded to
// be written back as the same opcodes, never run.
struct Object {
  uint32_t callable = 0;
  uint32_t args = 0;
  int64_t kwargs = -1;                                         // NEWOBJ_EX
  uint8_t how = 0;                                             // the opcode that built it
  std::vector<std::pair<uint8_t, std::vector<uint32_t>>> ops;  // opcode, operands, in order
};

// The only globals a pickle may name. Everything else is refused: resolving a
// global is how a pickle runs code (os.system, builtins.eval, ...).
enum class What {
  kOrderedDict,
  kRebuildTensor,
  kRebuildTensorV3,
  kDType,
  kRebuildParameter,
  kRebuildParameterState,
  kCodecsEncode,
  kBytes,
  kStorageType
};
struct Allowed {
  const char* module;
  const char* name;
  What what;
  const char* dtype;  // kStorageType: the PyTorch dtype name of its elements
};
constexpr Allowed kAllowed[] = {
    {"collections", "OrderedDict", What::kOrderedDict, nullptr},
    {"torch._utils", "_rebuild_tensor_v2", What::kRebuildTensor, nullptr},
    // torch >= 2.1 saves dtypes without a typed storage class (float8, uint16-64)
    // as _rebuild_tensor_v3(..., dtype) over a torch.storage.UntypedStorage.
    {"torch._utils", "_rebuild_tensor_v3", What::kRebuildTensorV3, nullptr},
    {"torch._utils", "_rebuild_parameter", What::kRebuildParameter, nullptr},
    {"torch._utils", "_rebuild_parameter_with_state", What::kRebuildParameterState, nullptr},
    // Protocol 2 spells a bytes object b as _codecs.encode(str(b, 'latin1'), 'latin1'),
    // or as bytes() when it is empty ("__builtin__" after Python 3's fix_imports).
    {"_codecs", "encode", What::kCodecsEncode, nullptr},
    {"__builtin__", "bytes", What::kBytes, nullptr},
    {"builtins", "bytes", What::kBytes, nullptr},
    // torch/storage.py _dtype_to_storage_type_map(), plus the names newer torch
    // uses for float8 and wide unsigned types; UntypedStorage counts bytes.
    {"torch", "DoubleStorage", What::kStorageType, "float64"},
    {"torch", "FloatStorage", What::kStorageType, "float32"},
    {"torch", "HalfStorage", What::kStorageType, "float16"},
    {"torch", "BFloat16Storage", What::kStorageType, "bfloat16"},
    {"torch", "LongStorage", What::kStorageType, "int64"},
    {"torch", "IntStorage", What::kStorageType, "int32"},
    {"torch", "ShortStorage", What::kStorageType, "int16"},
    {"torch", "CharStorage", What::kStorageType, "int8"},
    {"torch", "ByteStorage", What::kStorageType, "uint8"},
    {"torch", "BoolStorage", What::kStorageType, "bool"},
    {"torch", "ComplexFloatStorage", What::kStorageType, "complex64"},
    {"torch", "ComplexDoubleStorage", What::kStorageType, "complex128"},
    {"torch", "Float8_e5m2Storage", What::kStorageType, "float8_e5m2"},
    {"torch", "Float8_e4m3fnStorage", What::kStorageType, "float8_e4m3fn"},
    {"torch", "UInt16Storage", What::kStorageType, "uint16"},
    {"torch", "UInt32Storage", What::kStorageType, "uint32"},
    {"torch", "UInt64Storage", What::kStorageType, "uint64"},
    {"torch", "UntypedStorage", What::kStorageType, "uint8"},
    {"torch.storage", "UntypedStorage", What::kStorageType, "uint8"},
    // _rebuild_tensor_v3's dtype argument: torch.<name> for every tsar dtype.
    {"torch", "bool", What::kDType, "bool"},
    {"torch", "uint8", What::kDType, "uint8"},
    {"torch", "int8", What::kDType, "int8"},
    {"torch", "int16", What::kDType, "int16"},
    {"torch", "int32", What::kDType, "int32"},
    {"torch", "int64", What::kDType, "int64"},
    {"torch", "float16", What::kDType, "float16"},
    {"torch", "bfloat16", What::kDType, "bfloat16"},
    {"torch", "float32", What::kDType, "float32"},
    {"torch", "float64", What::kDType, "float64"},
    {"torch", "complex32", What::kDType, "complex32"},
    {"torch", "complex64", What::kDType, "complex64"},
    {"torch", "complex128", What::kDType, "complex128"},
    {"torch", "float8_e5m2", What::kDType, "float8_e5m2"},
    {"torch", "float8_e4m3fn", What::kDType, "float8_e4m3fn"},
    {"torch", "float8_e4m3fnuz", What::kDType, "float8_e4m3fnuz"},
    {"torch", "float8_e5m2fnuz", What::kDType, "float8_e5m2fnuz"},
    {"torch", "float8_e8m0fnu", What::kDType, "float8_e8m0fnu"},
    {"torch", "float4_e2m1fn_x2", What::kDType, "float4_e2m1fn_x2"},
    {"torch", "uint16", What::kDType, "uint16"},
    {"torch", "uint32", What::kDType, "uint32"},
    {"torch", "uint64", What::kDType, "uint64"},
};

constexpr size_t kMaxGlobalLine = 256;  // bytes of a GLOBAL module or name line
constexpr size_t kMaxKeyLength = 64;    // storage keys are decimal counters in practice

class Machine {
 public:
  Machine(const uint8_t* data, size_t size, const std::string& path)
      : data_(data), size_(size), path_(path) {
    // Immutable singletons, so None/True/False cost no object each time.
    New(NodeKind::kNone);
    New(NodeKind::kBool);
    At(New(NodeKind::kBool)).i = 1;
  }

  Result Run();

 private:
  static constexpr uint32_t kNoneId = 0, kFalseId = 1, kTrueId = 2;

  [[noreturn]] void Fail(const std::string& message) const {
    throw Error(ErrorCode::kBadInput, path_, op_offset_, "pickle: " + message);
  }
  // The next n bytes; fails unless they are all there.
  const uint8_t* Take(uint64_t n) {
    if (n > size_ - pos_) {
      char label[32];
      std::snprintf(label, sizeof label, "opcode 0x%02x", op_);
      Fail(std::string(label) + ": expected " + std::to_string(n) + " more bytes, found " +
           std::to_string(size_ - pos_) + " (truncated or corrupt)");
    }
    pos_ += n;
    return data_ + pos_ - n;
  }
  Node& At(uint32_t id) { return nodes_[id]; }  // deque: references stay valid
  uint32_t New(NodeKind kind) {
    if (object_budget_ == 0) Fail("more than " + std::to_string(kMaxObjects) + " objects");
    --object_budget_;
    nodes_.emplace_back();
    nodes_.back().kind = kind;
    return static_cast<uint32_t>(nodes_.size() - 1);
  }
  // Python moves the stack aside at MARK, so nothing below the mark is reachable.
  size_t Floor() const { return marks_.empty() ? 0 : marks_.back(); }
  uint32_t Top() {
    if (stack_.size() <= Floor()) Fail("stack underflow");
    return stack_.back();
  }
  uint32_t Pop() {
    uint32_t id = Top();
    stack_.pop_back();
    return id;
  }
  std::vector<uint32_t> PopMark() {
    if (marks_.empty()) Fail("no MARK to pop to");
    std::vector<uint32_t> items(stack_.begin() + marks_.back(), stack_.end());
    stack_.resize(marks_.back());
    marks_.pop_back();
    return items;
  }
  // Dimensions count as objects: a memoized size tuple reused by many tensors
  // would otherwise turn a few input bytes into up to kMaxRank copies each.
  uint32_t NewTensor(TensorRef t) {
    object_budget_ -= std::min(object_budget_, 2 * t.sizes.size());
    t.object = static_cast<uint32_t>(tensors_.size());
    tensors_.push_back(std::move(t));
    uint32_t id = New(NodeKind::kTensor);
    At(id).i = static_cast<int64_t>(tensors_.size() - 1);
    return id;
  }
  uint32_t NewInt(int64_t v) {
    uint32_t id = New(NodeKind::kInt);
    At(id).i = v;
    return id;
  }
  uint32_t NewSeq(NodeKind kind, std::vector<uint32_t> items) {
    uint32_t id = New(kind);
    At(id).items = std::move(items);
    return id;
  }
  Node& Expect(uint32_t id, NodeKind kind, const std::string& what) {
    Node& n = At(id);
    if (n.kind != kind) Fail(what + ": expected " + KindName(kind) + ", found " + KindName(n.kind));
    return n;
  }
  int64_t ExpectInt(uint32_t id, const std::string& what) {
    int64_t v = Expect(id, NodeKind::kInt, what).i;
    if (v < 0) Fail(what + ": expected >= 0, found " + std::to_string(v));
    return v;
  }
  // A str or bytes object of n bytes, for the string opcode op_.
  uint32_t ReadString(uint64_t n);
  std::string ReadLine();
  uint32_t LookupGlobal(const std::string& module, const std::string& name);
  void AddItems(uint32_t target, const std::vector<uint32_t>& items, bool dict);
  uint32_t Call(uint32_t fn, uint32_t args, uint8_t how, int64_t kwargs = -1);
  uint32_t NewObject(uint32_t callable, uint32_t args, uint8_t how, int64_t kwargs = -1);
  uint32_t Builtin(const char* name);
  std::string GlobalName(const Node& n) const;
  std::string Label(uint32_t id);
  struct Fragment {
    std::vector<std::string> segments{std::string()};
    std::vector<Value> items;
  };
  void Pickle(uint32_t id, size_t depth, Fragment& f);
  uint32_t RebuildTensor(const std::vector<uint32_t>& a, bool v3);
  uint32_t LoadStorage(uint32_t pid);
  void RetypeStorage(uint32_t storage, uint32_t dtype_node, const std::string& name);
  void Charge(uint64_t bytes);
  Value Convert(uint32_t id, size_t depth);

  const uint8_t* data_;
  size_t size_;
  const std::string& path_;
  size_t pos_ = 0;
  size_t op_offset_ = 0;  // offset of the opcode being run; every error names it
  uint8_t op_ = 0;
  size_t object_budget_ = kMaxObjects;
  std::deque<Node> nodes_;
  std::vector<uint32_t> stack_;
  std::vector<size_t> marks_;
  // The memo: pickles number it 0, 1, 2, ... (dense_), but LONG_BINPUT may
  // name any u32 (sparse_). memo_size_ counts the keys, as len(memo) does.
  static constexpr uint32_t kNoNode = UINT32_MAX;
  std::vector<uint32_t> memo_dense_;
  std::unordered_map<uint32_t, uint32_t> memo_sparse_;
  size_t memo_size_ = 0;
  void MemoPut(uint32_t index, uint32_t node);
  uint32_t MemoGet(uint32_t index) const;
  std::vector<TensorRef> tensors_;
  std::vector<Object> objects_;
  std::vector<StorageRef> storages_;
  std::unordered_map<std::string, uint32_t> storage_index_;
  std::vector<bool> converted_;  // by node id: copied into the tree already
  uint64_t shared_bytes_ = 0;
};

uint32_t Machine::ReadString(uint64_t n) {
  const bool bytes = op_ == op::kShortBinBytes || op_ == op::kBinBytes || op_ == op::kBinBytes8;
  const NodeKind kind = bytes ? NodeKind::kBytes : NodeKind::kString;
  const uint8_t* p = Take(n);
  uint32_t id = New(kind);
  At(id).s.assign(reinterpret_cast<const char*>(p), n);
  // torch.load decodes protocol-0/1 strings as UTF-8 too, so one check covers all.
  if (kind == NodeKind::kString && !format::IsValidUtf8(At(id).s)) {
    Fail("string " + Quote(At(id).s) + ": expected valid UTF-8");
  }
  return id;
}

std::string Machine::ReadLine() {
  size_t avail = std::min(size_ - pos_, kMaxGlobalLine + 1);
  const void* nl = std::memchr(data_ + pos_, '\n', avail);
  if (nl == nullptr) {
    Fail("GLOBAL: expected a newline-terminated name of at most " + std::to_string(kMaxGlobalLine) +
         " bytes");
  }
  size_t n = static_cast<const uint8_t*>(nl) - (data_ + pos_);
  std::string line(reinterpret_cast<const char*>(Take(n + 1)), n);
  return line;
}

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

Result Machine::Run() {
  for (;;) {
    op_offset_ = pos_;
    if (pos_ == size_) Fail("expected an opcode, found the end of data (no STOP)");
    op_ = *Take(1);
    switch (op_) {
      case op::kProto: {
        uint8_t version = *Take(1);
        if (version > 5) Fail("PROTO: expected protocol <= 5, found " + std::to_string(version));
        break;
      }
      case op::kFrame:
        Take(8);
        break;  // frames only group bytes; the opcodes inside count
      case op::kMark:
        marks_.push_back(stack_.size());
        break;
      case op::kPop:
        Pop();
        break;
      case op::kPopMark:
        PopMark();
        break;
      case op::kNone:
      case op::kNewTrue:
      case op::kNewFalse:
        stack_.push_back(op_ == op::kNone ? kNoneId : op_ == op::kNewTrue ? kTrueId : kFalseId);
        break;
      case op::kBinInt1:
        stack_.push_back(NewInt(*Take(1)));
        break;
      case op::kBinInt2:
        stack_.push_back(NewInt(format::LoadU16(Take(2))));
        break;
      case op::kBinInt:
        stack_.push_back(NewInt(static_cast<int32_t>(format::LoadU32(Take(4)))));
        break;
      case op::kLong1:
      case op::kLong4: {
        // Little-endian two's complement of n bytes: an int64, or a bigint
        // kept as its shortest encoding.
        uint64_t n = op_ == op::kLong1 ? *Take(1) : format::LoadU32(Take(4));
        const uint8_t* p = Take(n);
        while (n > 1 && ((p[n - 1] == 0x00 && !(p[n - 2] & 0x80)) ||
                         (p[n - 1] == 0xFF && (p[n - 2] & 0x80)))) {
          --n;  // a redundant sign byte
        }
        if (n > 8) {
          uint32_t id = New(NodeKind::kBigInt);
          At(id).s.assign(reinterpret_cast<const char*>(p), n);
          stack_.push_back(id);
          break;
        }
        uint64_t v = 0;
        for (uint64_t k = 0; k < n; ++k) v |= uint64_t{p[k]} << (8 * k);
        if (n > 0 && n < 8 && (p[n - 1] & 0x80)) v |= ~uint64_t{0} << (8 * n);
        stack_.push_back(NewInt(static_cast<int64_t>(v)));
        break;
      }
      case op::kBinFloat: {  // the one big-endian field of the pickle format
        const uint8_t* p = Take(8);
        uint64_t bits = 0;
        for (int k = 0; k < 8; ++k) bits = (bits << 8) | p[k];
        uint32_t id = New(NodeKind::kFloat);
        At(id).f = format::BitsToDouble(bits);
        stack_.push_back(id);
        break;
      }
      case op::kShortBinUnicode:
      case op::kShortBinString:
      case op::kShortBinBytes:
        stack_.push_back(ReadString(*Take(1)));
        break;
      case op::kBinUnicode:
      case op::kBinString:  // its i32 length read as u32: a negative one fails in Take
      case op::kBinBytes:
        stack_.push_back(ReadString(format::LoadU32(Take(4))));
        break;
      case op::kBinUnicode8:
      case op::kBinBytes8:
        stack_.push_back(ReadString(format::LoadU64(Take(8))));
        break;
      case op::kEmptyList:
      case op::kEmptyDict:
      case op::kEmptyTuple:
        stack_.push_back(New(op_ == op::kEmptyList   ? NodeKind::kList
                             : op_ == op::kEmptyDict ? NodeKind::kDict
                                                     : NodeKind::kTuple));
        break;
      case op::kList:
        stack_.push_back(NewSeq(NodeKind::kList, PopMark()));
        break;
      case op::kTuple:
        stack_.push_back(NewSeq(NodeKind::kTuple, PopMark()));
        break;
      case op::kDict: {
        uint32_t id = New(NodeKind::kDict);
        AddItems(id, PopMark(), true);
        stack_.push_back(id);
        break;
      }
      case op::kTuple1:
      case op::kTuple2:
      case op::kTuple3: {
        std::vector<uint32_t> items(op_ - op::kTuple1 + 1);
        for (size_t k = items.size(); k-- > 0;) items[k] = Pop();
        stack_.push_back(NewSeq(NodeKind::kTuple, std::move(items)));
        break;
      }
      case op::kAppend: {
        uint32_t v = Pop();
        AddItems(Top(), {v}, false);
        break;
      }
      case op::kSetItem: {
        uint32_t v = Pop(), k = Pop();
        AddItems(Top(), {k, v}, true);
        break;
      }
      case op::kAppends:
      case op::kSetItems: {
        std::vector<uint32_t> items = PopMark();
        AddItems(Top(), items, op_ == op::kSetItems);
        break;
      }
      case op::kBinPut:
      case op::kLongBinPut:
      case op::kMemoize: {
        uint32_t index = op_ == op::kBinPut       ? *Take(1)
                         : op_ == op::kLongBinPut ? format::LoadU32(Take(4))
                                                  : static_cast<uint32_t>(memo_size_);
        MemoPut(index, Top());
        break;
      }
      case op::kBinGet:
      case op::kLongBinGet: {
        uint32_t index = op_ == op::kBinGet ? *Take(1) : format::LoadU32(Take(4));
        const uint32_t node = MemoGet(index);
        if (node == kNoNode) Fail("memo key " + std::to_string(index) + " was never stored");
        stack_.push_back(node);
        break;
      }
      case op::kGlobal: {
        std::string module = ReadLine();
        std::string name = ReadLine();
        stack_.push_back(LookupGlobal(module, name));
        break;
      }
      case op::kStackGlobal: {
        uint32_t name = Pop(), module = Pop();  // NOLINT(readability-isolate-declaration)
        stack_.push_back(LookupGlobal(Expect(module, NodeKind::kString, "STACK_GLOBAL module").s,
                                      Expect(name, NodeKind::kString, "STACK_GLOBAL name").s));
        break;
      }
      case op::kReduce:
      case op::kNewObj: {
        uint32_t args = Pop(), fn = Pop();
        stack_.push_back(Call(fn, args, op_));
        break;
      }
      case op::kNewObjEx: {
        uint32_t kwargs = Pop(), args = Pop(), cls = Pop();
        Expect(kwargs, NodeKind::kDict, "NEWOBJ_EX kwargs");
        stack_.push_back(Call(cls, args, op_, kwargs));
        break;
      }
      case op::kBuild: {
        // An object's state (kept), or attributes on a dict (an OrderedDict
        // state_dict's _metadata).
        uint32_t state = Pop();
        Node& target = At(Top());
        if (target.kind == NodeKind::kObject) {
          objects_[target.i].ops.emplace_back(op::kBuild, std::vector<uint32_t>{state});
          break;
        }
        Expect(state, NodeKind::kDict, "BUILD state");
        if (target.kind != NodeKind::kDict || target.attrs >= 0) {
          Fail(std::string("BUILD: expected an object or a dict without attributes, found ") +
               KindName(target.kind));
        }
        target.attrs = state;
        break;
      }
      case op::kDup:
        stack_.push_back(Top());
        break;
      case op::kEmptySet: {
        uint32_t args = New(NodeKind::kTuple);
        stack_.push_back(NewObject(Builtin("set"), args, op::kReduce));
        break;
      }
      case op::kAddItems: {
        std::vector<uint32_t> items = PopMark();
        uint32_t target = Top();
        if (At(target).kind != NodeKind::kObject) Fail("ADDITEMS: expected a set");
        objects_[At(target).i].ops.emplace_back(op::kAddItems, std::move(items));
        break;
      }
      case op::kFrozenSet: {  // frozenset([items...])
        uint32_t list = NewSeq(NodeKind::kList, PopMark());
        uint32_t args = NewSeq(NodeKind::kTuple, {list});
        stack_.push_back(NewObject(Builtin("frozenset"), args, op::kReduce));
        break;
      }
      case op::kByteArray8: {  // bytearray(b"...")
        const uint64_t n = format::LoadU64(Take(8));
        const uint8_t* p = Take(n);
        uint32_t bytes = New(NodeKind::kBytes);
        At(bytes).s.assign(reinterpret_cast<const char*>(p), n);
        uint32_t args = NewSeq(NodeKind::kTuple, {bytes});
        stack_.push_back(NewObject(Builtin("bytearray"), args, op::kReduce));
        break;
      }
      case op::kNextBuffer:
      case op::kReadOnlyBuffer:
      case op::kExt1:
      case op::kExt2:
      case op::kExt4:
        throw Error(ErrorCode::kUnsupported, path_, op_offset_,
                    "pickle: out-of-band buffers and the copyreg extension registry are not "
                    "supported (torch.save does not write them)");
      case op::kBinPersId:
        stack_.push_back(LoadStorage(Pop()));
        break;
      case op::kStop: {
        if (stack_.size() != 1 || !marks_.empty()) {
          Fail("STOP: expected one object and no open MARK, found " +
               std::to_string(stack_.size()) + " objects and " + std::to_string(marks_.size()) +
               " marks");
        }
        if (pos_ != size_)
          Fail("STOP: expected the end of data, found " + std::to_string(size_ - pos_) +
               " more bytes");
        Result result;
        converted_.assign(nodes_.size(), false);
        result.root = Convert(stack_[0], 0);
        result.storages = std::move(storages_);
        return result;
      }
      default: {
        char label[48];
        std::snprintf(label, sizeof label, "unknown opcode 0x%02x", op_);
        Fail(label);
      }
    }
  }
}

void Machine::Charge(uint64_t bytes) {
  shared_bytes_ += bytes;
  if (shared_bytes_ > kMaxSharedBytes) {
    Fail("result tree: expected at most " + std::to_string(kMaxSharedBytes) +
         " bytes of repeated shared objects, found more (objects shared too often)");
  }
}

// Copies the object graph into a tree. Shared objects are copied at each use,
// so the budget and the depth cap stop exponential sharing and cycles.
void Machine::MemoPut(uint32_t index, uint32_t node) {
  // Dense while the keys come nearly in order, and never more than twice the
  // keys stored (plus a page): a key far ahead goes to the map, so neither
  // one LONG_BINPUT 4000000000 nor keys spaced widely can cost more memory
  // than the pickle's own bytes.
  if (index < memo_dense_.size() ||
      (index < memo_dense_.size() + 4096 && index < 2 * memo_size_ + 4096)) {
    if (index >= memo_dense_.size()) memo_dense_.resize(index + 1, kNoNode);
    if (memo_dense_[index] == kNoNode && memo_sparse_.erase(index) == 0) ++memo_size_;
    memo_dense_[index] = node;
  } else {
    memo_size_ += memo_sparse_.insert_or_assign(index, node).second;
  }
}

uint32_t Machine::MemoGet(uint32_t index) const {
  if (index < memo_dense_.size() && memo_dense_[index] != kNoNode) return memo_dense_[index];
  const auto it = memo_sparse_.find(index);
  return it == memo_sparse_.end() ? kNoNode : it->second;
}

Value Machine::Convert(uint32_t id, size_t depth) {
  const Node& n = At(id);
  if (depth > kMaxDepth)
    Fail("nesting: expected at most " + std::to_string(kMaxDepth) + " levels (or a cycle)");
  // A first copy costs no more than the input that built the node did; later
  // copies of shared objects are what can explode, so only they are charged.
  const bool repeat = converted_[id];
  converted_[id] = true;
  if (repeat) Charge(sizeof(Value) + n.s.size() + n.items.size() * sizeof(Value));
  Value v;
  switch (n.kind) {
    case NodeKind::kNone:
      v.kind = Value::Kind::kNone;
      break;
    case NodeKind::kBool:
      v.kind = Value::Kind::kBool;
      v.b = n.i != 0;
      break;
    case NodeKind::kInt:
      v.kind = Value::Kind::kInt;
      v.i = n.i;
      break;
    case NodeKind::kFloat:
      v.kind = Value::Kind::kFloat;
      v.f = n.f;
      break;
    case NodeKind::kString:
      v.kind = Value::Kind::kString;
      v.str = n.s;
      break;
    case NodeKind::kBytes:
      v.kind = Value::Kind::kBytes;
      v.str = n.s;
      break;
    case NodeKind::kTensor:
      v.kind = Value::Kind::kTensor;
      v.tensor = tensors_[n.i];
      if (repeat) Charge(16 * v.tensor.sizes.size());
      break;
    case NodeKind::kList:
    case NodeKind::kTuple:
      v.kind = n.kind == NodeKind::kList ? Value::Kind::kList : Value::Kind::kTuple;
      for (uint32_t item : n.items) v.items.push_back(Convert(item, depth + 1));
      break;
    case NodeKind::kDict: {
      v.kind = Value::Kind::kDict;
      v.ordered = n.ordered;
      // A repeated str or int key keeps its first position and takes the
      // last value, as in Python. Other keys are kept as they come.
      std::unordered_map<std::string, size_t> position;
      for (size_t k = 0; k + 1 < n.items.size(); k += 2) {
        const Node& key = At(n.items[k]);
        const bool plain = key.kind == NodeKind::kInt || key.kind == NodeKind::kString;
        std::string text = key.kind == NodeKind::kInt      ? std::to_string(key.i)
                           : key.kind == NodeKind::kString ? key.s
                                                           : std::string();
        if (repeat) Charge(text.size());
        auto [it, inserted] =
            plain
                ? position.emplace((key.kind == NodeKind::kInt ? "i" : "s") + text, v.items.size())
                : std::make_pair(position.end(), true);
        Value item = Convert(n.items[k + 1], depth + 1);
        if (inserted) {
          v.keys.push_back(std::move(text));
          v.key_values.push_back(Convert(n.items[k], depth + 1));
          v.items.push_back(std::move(item));
        } else {
          v.items[it->second] = std::move(item);
        }
      }
      if (n.attrs >= 0)
        v.attributes = std::make_shared<Value>(Convert(static_cast<uint32_t>(n.attrs), depth + 1));
      break;
    }
    case NodeKind::kBigInt:
      v.kind = Value::Kind::kBigInt;
      v.str = n.s;
      break;
    case NodeKind::kGlobal:
    case NodeKind::kObject: {
      v.kind = Value::Kind::kOpaque;
      v.str = Label(id);
      Fragment f;
      Pickle(id, depth + 1, f);
      v.segments = std::move(f.segments);
      v.items = std::move(f.items);
      break;
    }
    case NodeKind::kStorage:
      throw Error(ErrorCode::kUnsupported, path_, std::nullopt,
                  "pickle: a storage used outside a plain tensor (a quantized, sparse or other "
                  "special tensor, or a bare storage) is not supported");
  }
  return v;
}

// What an opaque value is, for people: the global, or the class an object
// was made from ("argparse.Namespace", "numpy.core.multiarray.scalar").
std::string Machine::Label(uint32_t id) {
  const Node& n = At(id);
  if (n.kind == NodeKind::kGlobal) return GlobalName(n);
  const Object& o = objects_[n.i];
  const Node& c = At(o.callable);
  if (c.kind != NodeKind::kGlobal) return "object";
  const std::string name = GlobalName(c);
  const Node& args = At(o.args);
  // copyreg's helpers name the class in their first argument.
  if ((name == "copyreg._reconstructor" || name == "copy_reg._reconstructor" ||
       name == "copyreg.__newobj__") &&
      args.kind == NodeKind::kTuple && !args.items.empty() &&
      At(args.items[0]).kind == NodeKind::kGlobal) {
    return GlobalName(At(args.items[0]));
  }
  return name;
}

// Writes node `id` as pickle opcodes that rebuild it (writer/pickler.h; the
// protocol 4 ADDITEMS and NEWOBJ_EX as the input had them), without memo: a
// shared object is written at each use. A tensor is not written: it ends the
// current segment and becomes an item of `f`.
void Machine::Pickle(uint32_t id, size_t depth, Fragment& f) {
  if (depth > kMaxDepth)
    Fail("nesting: expected at most " + std::to_string(kMaxDepth) + " levels (or a cycle)");
  const bool repeat = converted_[id];
  converted_[id] = true;
  const Node& n = At(id);
  if (repeat) Charge(sizeof(Node) + n.s.size() + n.items.size() * 4);
  // The segment being written: a tensor inside any child starts a new one.
  const auto out = [&f] { return Pickler(&f.segments.back()); };
  const auto items = [&](const std::vector<uint32_t>& v) {
    for (uint32_t item : v) Pickle(item, depth + 1, f);
  };
  switch (n.kind) {
    case NodeKind::kNone:
      out().None();
      break;
    case NodeKind::kBool:
      out().Bool(n.i != 0);
      break;
    case NodeKind::kInt:
      out().Int(n.i);
      break;
    case NodeKind::kBigInt:
      out().BigInt(n.s);
      break;
    case NodeKind::kFloat:
      out().Float(n.f);
      break;
    case NodeKind::kString:
      out().Str(n.s);
      break;
    case NodeKind::kBytes:
      out().Bytes(n.s);
      break;
    case NodeKind::kList:
      out().EmptyList();
      if (!n.items.empty()) {
        out().Mark();
        items(n.items);
        out().Appends();
      }
      break;
    case NodeKind::kTuple:
      out().Mark();
      items(n.items);
      out().Tuple();
      break;
    case NodeKind::kDict:
      if (n.ordered) {
        out().OrderedDict();
      } else {
        out().EmptyDict();
      }
      if (!n.items.empty()) {
        out().Mark();
        items(n.items);
        out().SetItems();
      }
      if (n.attrs >= 0) {
        Pickle(static_cast<uint32_t>(n.attrs), depth + 1, f);
        out().Build();
      }
      break;
    case NodeKind::kGlobal: {
      const size_t nl = n.s.find('\n');  // "module\nname"
      out().Global(n.s.substr(0, nl), n.s.substr(nl + 1));
      break;
    }
    case NodeKind::kObject: {
      const Object& o = objects_[n.i];  // Pickle adds no object: the reference stays valid
      Pickle(o.callable, depth + 1, f);
      Pickle(o.args, depth + 1, f);
      if (o.kwargs >= 0) Pickle(static_cast<uint32_t>(o.kwargs), depth + 1, f);
      out().Op(o.how);
      for (const auto& [opcode, operands] : o.ops) {
        if (opcode != op::kBuild) out().Mark();
        items(operands);
        out().Op(opcode);
      }
      break;
    }
    case NodeKind::kTensor: {
      Value t;
      t.kind = Value::Kind::kTensor;
      t.tensor = tensors_[n.i];
      f.items.push_back(std::move(t));
      f.segments.emplace_back();
      break;
    }
    case NodeKind::kStorage:
      throw Error(ErrorCode::kUnsupported, path_, std::nullopt,
                  "pickle: a storage used outside a plain tensor (a quantized, sparse or other "
                  "special tensor, or a bare storage) is not supported");
  }
}

}  // namespace

const Value* Value::Find(std::string_view key) const {
  for (size_t k = 0; k < keys.size(); ++k) {
    if (keys[k] == key && key_values[k].kind == Kind::kString) return &items[k];
  }
  for (size_t k = 0; k < keys.size(); ++k) {
    if (keys[k] == key && key_values[k].kind == Kind::kInt) return &items[k];
  }
  return nullptr;
}

const Value* Value::Attribute(std::string_view name) const {
  return attributes ? attributes->Find(name) : nullptr;
}

Result Parse(const uint8_t* data, size_t size, const std::string& path) {
  Machine machine(data, size, path);
  return machine.Run();
}

}  // namespace tsar::pickle
