// tsar::Value: the typed structure of what a checkpoint file held (spec
// §4.10, format 1.1): dicts (key order kept), lists, tuples, None, bool, int
// of any size, float, str, bytes, tensors of the archive, state_dict entries
// and opaque objects. Archive::value() reads it; Writer::set_value() writes it.
// No LibTorch: a tensor is named by its entry and name, and
// Archive::tensor(name, entry) gives it zero-copy.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace tsar {

class Value {
 public:
  // Pinned: the codes of spec §4.10.
  enum class Kind : uint8_t {
    kNone = 1,
    kBool = 2,
    kInt = 3,
    kBigInt = 4,  // an int outside int64: bytes() is its little-endian two's complement
    kFloat = 5,
    kStr = 6,    // bytes() is UTF-8
    kBytes = 7,  // bytes() is raw
    kList = 8,
    kTuple = 9,
    kDict = 10,    // pairs(); ordered() for a collections.OrderedDict
    kTensor = 11,  // entry() and name() of a tensor of the archive
    kEntry = 12,   // the state_dict of entry(): {tensor name: tensor} in entry order
    // An object tsar does not interpret (argparse.Namespace, a numpy scalar,
    // a Path, a pickled nn.Module...): a pickle fragment, never run by tsar.
    // bytes() is a label (the class, "argparse.Namespace"); the fragment is
    // segments()[0], items()[0], segments()[1], ... segments()[n]: the
    // segments are pickle opcodes, each item (a tensor, usually) is pickled
    // where it stands. Exporting to .pt writes it back as it was.
    kOpaque = 13,
  };

  Value() = default;  // None
  static Value None() { return Value(); }
  static Value Bool(bool b);
  static Value Int(int64_t i);
  static Value BigInt(std::string twos_complement_le);
  static Value Float(double f);
  static Value Str(std::string s);
  static Value Bytes(std::string b);
  static Value List(std::vector<Value> items);
  static Value Tuple(std::vector<Value> items);
  static Value Dict(std::vector<std::pair<Value, Value>> pairs, bool ordered = false);
  static Value Tensor(std::string entry, std::string name);
  static Value Entry(std::string entry, bool ordered = true);
  static Value Opaque(std::string label, std::vector<std::string> segments,
                      std::vector<Value> items);

  Kind kind() const { return kind_; }
  bool is(Kind k) const { return kind_ == k; }

  bool as_bool() const { return i_ != 0; }
  int64_t as_int() const { return i_; }
  double as_float() const;
  // str, bytes, bigint payload, opaque label.
  const std::string& bytes() const { return s_; }
  // list and tuple items; opaque items (what fills its holes).
  const std::vector<Value>& items() const { return items_; }
  // dict key/value pairs in order.
  const std::vector<std::pair<Value, Value>>& pairs() const { return pairs_; }
  // dict and entry: a collections.OrderedDict (else a dict).
  bool ordered() const { return ordered_; }
  // dict and entry: attributes set on the object (a state_dict's _metadata),
  // as a dict value, or nullptr.
  const Value* attributes() const { return attrs_.empty() ? nullptr : &attrs_[0]; }
  void set_attributes(Value dict);
  // tensor and entry: the entry's name; tensor: the tensor's name.
  const std::string& entry() const { return entry_; }
  const std::string& name() const { return name_; }
  // opaque: the pickle segments around its items (items().size() + 1 of them).
  const std::vector<std::string>& segments() const { return segments_; }

  // dict: the value of the str key `key`, or nullptr (also for other kinds).
  const Value* find(std::string_view key) const;

  // Structural equality: kinds, values (floats by bits), order, ordered(),
  // attributes, names.
  bool operator==(const Value& o) const;
  bool operator!=(const Value& o) const { return !(*this == o); }

 private:
  Kind kind_ = Kind::kNone;
  bool ordered_ = false;
  int64_t i_ = 0;  // bool, int, float bits
  std::string s_;
  std::string entry_, name_;
  std::vector<Value> items_;
  std::vector<std::pair<Value, Value>> pairs_;
  std::vector<Value> attrs_;  // 0 or 1
  std::vector<std::string> segments_;
};

// "none", "bool", "int", "bigint", "float", "str", "bytes", "list", "tuple",
// "dict", "tensor", "entry", "opaque": as the spec, inspect and --json spell it.
const char* ValueKindName(Value::Kind kind) noexcept;

}  // namespace tsar
