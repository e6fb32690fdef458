// The restricted pickle machine's parts (writer/pickle.h is its interface):
// the opcodes, the VM's objects, the allow-list of globals and the Machine,
// whose members live in four files: writer/pickle.cc (the opcode loop, the
// memo), writer/pickle_globals.cc (globals, calls, tensors and storages),
// writer/pickle_tree.cc (the tree handed out, and pickling objects back) and
// writer/pickle_torchao.cc (torchao's tensors, read as tensor groups).
// Internal to those files.
#pragma once

#include <cstdint>
#include <cstdio>
#include <deque>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "tsar/error.h"
#include "writer/pickle.h"

namespace tsar::pickle::detail {

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

inline const char* KindName(NodeKind k) {
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
inline constexpr Allowed kAllowed[] = {
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

inline constexpr size_t kMaxGlobalLine = 256;  // bytes of a GLOBAL module or name line
inline constexpr size_t kMaxKeyLength = 64;    // storage keys are decimal counters in practice

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
  // writer/pickle_torchao.cc: sets v.group (or v.not_group) when object `id`,
  // converted to the opaque `v`, is a torchao tensor.
  void TorchaoGroup(uint32_t id, Value& v);
  friend class TorchaoReader;

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
  std::vector<bool> typed_;      // by node id: read as a group's attribute already
  uint64_t shared_bytes_ = 0;
};

}  // namespace tsar::pickle::detail
