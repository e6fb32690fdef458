// torchao's quantized tensor classes, and the enums and records their
// attributes hold, as tsar's C++ knows them (spec §4.13, issue 58): the C++
// side of python/tsar/_torchao.py's CLASSES, ENUMS and RECORDS, in one place
// for every C++ reader and writer of torchao's files (the safetensors files
// transformers writes, torch.save pickles) and of tensor groups. A name read
// from a file selects a row here or nothing; nothing is ever imported or
// called by a name from a file.
//
// Also the two texts a group's description (§4.13.2) is made of: JSON as
// Python's json.dumps(d, sort_keys=True, separators=(",", ":"),
// ensure_ascii=False) writes it, and floats as Python's float.hex().
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tsar/dtype.h"

namespace tsar::torchao {

// spec §4.13.2: the library a description names.
inline constexpr std::string_view kLibrary = "torchao";
// The version a description records when the file it was made from does not
// say which torchao wrote it (a safetensors file of transformers, a pickle):
// Python's tsar/_torchao.py writes the same when torchao has no __version__.
inline constexpr std::string_view kUnknownVersion = "unknown";

// Where a class's outer (wrapper) tensor takes its shape and dtype from, as
// its __new__ does (torch.Tensor._make_wrapper_subclass): the outer strides
// are always C-contiguous.
enum class OuterShape {
  kFirstTensor,     // qdata's sizes
  kShapeAttribute,  // the "shape" attribute (a list or torch.Size of ints)
};
enum class OuterDtype {
  kDtypeAttribute,  // the "dtype" attribute (None: float32, torch's default)
  kMemberDtype,     // the dtype of member `dtype_member` (scale, group_scale)
  kBFloat16,        // always bfloat16 (Int4TilePackedTo4dTensor)
};

// One torchao tensor class: torchao's tensor_data_names,
// optional_tensor_data_names, tensor_attribute_names and
// optional_tensor_attribute_names, in torchao's order. A group's members are
// its tensors, then its optional tensors that are present, in this order
// (__tensor_flatten__'s).
struct Class {
  std::string_view name;    // "Int8Tensor"
  std::string_view module;  // where torchao defines it, as pickle names it
  std::vector<std::string_view> tensors;
  std::vector<std::string_view> optional_tensors;
  std::vector<std::string_view> attributes;
  std::vector<std::string_view> optional_attributes;
  OuterShape shape = OuterShape::kFirstTensor;
  OuterDtype dtype = OuterDtype::kDtypeAttribute;
  std::string_view dtype_member;  // kMemberDtype only
  // The value an instance made without each optional attribute holds (its
  // __init__'s default, as __init__ stores it: Int4Tensor's activation_dtype
  // None becomes bfloat16), as a typed value's JSON text: what the group of a
  // description that leaves it out holds (the .pt exporter pickles it).
  std::vector<std::pair<std::string_view, std::string_view>> defaults = {};

  bool TakesTensor(std::string_view member) const;
  bool TakesAttribute(std::string_view attribute) const;
  // The typed value of defaults for `attribute`, or nullopt.
  std::optional<nlohmann::json> Default(std::string_view attribute) const;
};

// An enum or a record (a dataclass or named tuple) an attribute may hold.
struct Named {
  std::string_view name;    // "MappingType"
  std::string_view module;  // "torchao.quantization.quant_primitives"
  // Records: a named tuple (pickled as NEWOBJ of its class with its fields,
  // in this order) or a dataclass (NEWOBJ with (), then BUILD of its
  // __dict__, which holds exactly these fields), and its fields.
  bool named_tuple = false;
  std::vector<std::string_view> fields;
};

const std::vector<Class>& Classes();
const std::vector<Named>& Enums();
const std::vector<Named>& Records();

// The row of that name, or nullptr.
const Class* FindClass(std::string_view name);
const Named* FindEnum(std::string_view name);
const Named* FindRecord(std::string_view name);

// "a, b, c": the names of a table, sorted, for messages.
std::string ClassNames();
std::string EnumNames();
std::string RecordNames();

// `j` as Python's json.dumps(j, sort_keys=True, separators=(",", ":"),
// ensure_ascii=False) writes it (byte for byte: nlohmann's object keeps its
// keys sorted bytewise, which is code point order for UTF-8, and escapes as
// Python does). JSON numbers with a fraction are not written (Python and
// nlohmann spell some floats apart): a float of a description is a typed
// ["float", hex] value. Throws kInvalidArgument for one.
std::string Dump(const nlohmann::json& j);

// Python's float.hex(x): "0x1.8000000000000p+1", "-0x0.0p+0",
// "0x0.0000000000001p-1022", "nan", "inf", "-inf".
std::string FloatHex(double x);
// Python's float.fromhex() of what FloatHex writes (spec §4.13.2's float
// text); nullopt for any other text, or a value beyond binary64's range.
std::optional<double> ParseFloatHex(std::string_view text);

// Whether `name` is what str(dtype) writes after "torch." for a dtype of
// PyTorch (2.15): "bfloat16", "int4"; not an alias ("float", "half").
bool IsTorchDTypeName(std::string_view name);

// The dtype a ["dtype", N] value names when tsar has a code for it
// (DTypeFromName without the aliases), or nullopt ("int4" has none).
std::optional<DType> DTypeOfName(std::string_view name);

// A group's description (spec §4.13.2), as it is stored: `members` in
// component order, `attributes` an object of typed values.
struct Description {
  std::string library;
  std::string version;
  std::string cls;
  std::vector<std::string> members;
  nlohmann::json attributes;  // an object of typed values
};

// The stored text of `d` (Dump of the five members).
std::string DescriptionText(const Description& d);

// Reads group `group`'s description `text` against the grammar of §4.13.2:
// throws kInvalidValue naming the group and what is wrong (not JSON, a
// member missing or extra, a value that is not a typed value, nesting past
// 32). Checks no table: FindClass and the others say what a reader knows.
Description ParseDescription(const std::string& group, std::string_view text);

}  // namespace tsar::torchao
