// A restricted, non-executing reader of the data.pkl pickle inside a torch.save
// zip archive: turns it into a value tree whose tensors refer to storage records.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace tsar::pickle {

// One storage named by a persistent id ('storage', <torch.XStorage>, key,
// location, numel). Its bytes are the zip record "<archive>/data/<key>".
struct StorageRef {
  std::string key;       // [0-9A-Za-z_]+, unique within a Result
  std::string dtype;     // PyTorch name, as tsar::DTypeName: "float32", "bool", ...
  std::string location;  // device the storage was saved from: "cpu", "cuda:0"
  uint64_t numel = 0;    // elements of `dtype` (bytes for torch.UntypedStorage)
  // A torch.UntypedStorage: `dtype` is uint8 until a _rebuild_tensor_v3 gives it
  // its tensors' dtype (numel then counts those); untyped_bytes is its size.
  bool untyped = false;
  uint64_t untyped_bytes = 0;
};

// A tensor view onto a storage. Offsets, sizes and strides count elements.
// Parse guarantees: sizes.size() == strides.size() <= kMaxRank, all sizes and
// strides >= 0, and every element the view can address lies inside the storage.
struct TensorRef {
  uint32_t storage = 0;  // index into Result::storages
  uint64_t storage_offset = 0;
  std::vector<int64_t> sizes;
  std::vector<int64_t> strides;
  bool requires_grad = false;
  bool is_parameter = false;  // rebuilt through torch._utils._rebuild_parameter*
  // The Python object it is: equal for every reference to one tensor object.
  uint32_t object = 0;
};

// A torchao quantized tensor (a tensor group of format 1.5, spec §4.13) that
// a kOpaque value is the pickle of, as tsar stores it: read through tsar's
// table of torchao classes, enums and records (writer/torchao_table.h), never
// by running anything (writer/pickle_torchao.cc).
struct Group {
  std::string cls;  // the class's name in the table ("Int8Tensor")
  // Each member's name and the index of its tensor among the opaque
  // value's items, in the group's order (the class's tensors, then its
  // optional tensors that are there).
  std::vector<std::pair<std::string, size_t>> members;
  std::string dtype;  // the outer dtype (tsar::DTypeName)
  std::vector<int64_t> sizes;
  std::vector<int64_t> strides;
  // The description (spec §4.13.2) as python/tsar/_torchao.py's describe()
  // writes it for the same tensor, but "version": "unknown" (a pickle does
  // not record which torchao wrote it).
  std::string description;
};

// A node of the unpickled object tree. Copyable; children are owned by value.
struct Value {
  enum class Kind {
    kNone,
    kBool,
    kInt,
    kFloat,
    kString,
    kBytes,
    kTensor,
    kList,
    kTuple,
    kDict,
    kBigInt,  // an int outside int64: str holds its shortest little-endian two's complement
    // Anything else (a class instance, a global, a set...): kept as the pickle
    // opcodes that rebuild it, never run. str is a label (the class or
    // global, "argparse.Namespace"); the fragment is segments[0], items[0],
    // segments[1], ..., segments.back(): each item (a tensor) is pickled in
    // the place between two segments.
    kOpaque,
  };

  Kind kind = Kind::kNone;
  bool b = false;                     // kBool
  int64_t i = 0;                      // kInt
  double f = 0;                       // kFloat
  std::string str;                    // kString (UTF-8), kBytes, kBigInt, kOpaque label
  TensorRef tensor;                   // kTensor
  std::vector<Value> items;           // kList and kTuple elements; kDict values; kOpaque items
  std::vector<std::string> keys;      // kDict: text of each key (str as is, int in decimal)
  std::vector<Value> key_values;      // kDict: the keys themselves, in order
  bool ordered = false;               // kDict: a collections.OrderedDict
  std::vector<std::string> segments;  // kOpaque
  // Attributes a BUILD opcode set on a dict object (an OrderedDict state_dict's
  // "_metadata" lives here), as a kDict; null when there were none.
  std::shared_ptr<const Value> attributes;
  // kOpaque: the torchao tensor it is, when tsar can store it as a tensor
  // group; else null, and `not_group` says why a tensor of a torchao class
  // is not one ("" for everything else).
  std::shared_ptr<const Group> group;
  std::string not_group;

  // The value stored under the str or int key `key` in a kDict, or nullptr.
  const Value* Find(std::string_view key) const;
  // The attribute `name` set by BUILD, or nullptr.
  const Value* Attribute(std::string_view name) const;
};

struct Result {
  Value root;
  std::vector<StorageRef> storages;  // in order of first reference; one per key
};

// Hard limits that keep hostile input from exhausting memory or stack.
inline constexpr size_t kMaxRank = 64;
inline constexpr size_t kMaxDepth = 100;  // nesting of the result tree (recursion)
// Objects the VM may create (a tensor dimension counts as two); bounds memory
// to a few hundred bytes per object. A state_dict needs ~16 per tensor.
inline constexpr size_t kMaxObjects = size_t{1} << 22;
// The tree copies an object each time it is referenced; this bounds the bytes
// spent on second and later copies, so sharing cannot blow up exponentially.
inline constexpr uint64_t kMaxSharedBytes = uint64_t{64} << 20;

// Unpickles `data` (the bytes of data.pkl; `path` names it in errors) without
// executing anything. A few globals are interpreted here:
// collections.OrderedDict, torch._utils._rebuild_tensor_v2 / _rebuild_parameter
// / _rebuild_parameter_with_state, torch.<X>Storage types, and _codecs.encode /
// builtins.bytes for protocol-2 bytes. Every other global is never resolved:
// what is built from it (an object, a set, a numpy scalar, a pickled module)
// becomes a kOpaque value holding the opcodes that rebuild it, with the
// tensors inside it as items. A torchao quantized tensor
// (torch._tensor._rebuild_from_type_v2 of a class of writer/torchao_table.h)
// is such a value too, with its Group beside it (Value::group). Supports
// pickle protocols 2 to 5 as torch.save writes them. Dict keys may be any
// hashable value; a repeated str or int key keeps its first position and
// takes the last value, as in Python.
// Throws tsar::Error: kBadInput for malformed or refused input (the offset is
// that of the offending opcode), kOverflow when a tensor's extent overflows,
// kUnsupported for valid but unsupported input (conj/neg bits, a storage used
// outside a tensor, out-of-band buffers). Pure function of its input;
// thread-safe; `data` is only read during the call.
Result Parse(const uint8_t* data, size_t size, const std::string& path);

}  // namespace tsar::pickle
