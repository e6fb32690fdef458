// tsar's C++ table of torchao classes, enums and records, and the texts of
// a group's description (writer/torchao_table.h).
#include "writer/torchao_table.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>

#include "format/reader.h"
#include "tsar/error.h"
#include "writer/json_util.h"

namespace tsar::torchao {
namespace {

constexpr std::string_view kQuantization = "torchao.quantization";
constexpr std::string_view kGranularity = "torchao.quantization.granularity";

// Checked against the pinned torchao by tests/python/test_torchao_transformers.py,
// as python/tsar/_torchao.py's CLASSES is by test_torchao_groups.py.
// tests/python/test_torchao_pack.py reads the rows of Table(), Enums(),
// Records() and IsTorchDTypeName()'s kNames as text and compares them with
// _torchao.py's (the records' fields with the pinned torchao's, the dtype
// names with torch's): keep them braced lists of string literals, the k
// constants of this file and booleans.
const std::vector<Class>& Table() {
  static const std::vector<Class> table = {
      {"Int8Tensor",
       kQuantization,
       {"qdata", "scale"},
       {"zero_point", "act_quant_scale", "act_quant_zero_point", "act_pre_scale"},
       {"block_size", "dtype"},
       {"act_quant_kwargs", "reduce_range"},
       OuterShape::kFirstTensor,
       OuterDtype::kDtypeAttribute,
       {},
       {{"act_quant_kwargs", "null"}, {"reduce_range", "false"}}},
      {"IntxUnpackedToInt8Tensor",
       kQuantization,
       {"qdata", "scale", "zero_point"},
       {},
       {"target_dtype", "block_size", "dtype", "activation_quantization"},
       {},
       OuterShape::kFirstTensor,
       OuterDtype::kDtypeAttribute,
       {}},
      {"Float8Tensor",
       kQuantization,
       {"qdata", "scale"},
       {},
       {},
       {"block_size", "mm_config", "act_quant_kwargs", "kernel_preference", "dtype"},
       OuterShape::kFirstTensor,
       OuterDtype::kDtypeAttribute,
       {},
       {{"block_size", "null"},
        {"mm_config", "null"},
        {"act_quant_kwargs", "null"},
        {"kernel_preference", "[\"enum\",\"KernelPreference\",\"AUTO\"]"},
        {"dtype", "null"}}},
      {"Int4Tensor",
       kQuantization,
       {"qdata", "scale", "zero_point"},
       {"act_pre_scale"},
       {"block_size", "shape"},
       {"activation_dtype"},
       OuterShape::kShapeAttribute,
       OuterDtype::kMemberDtype,
       "scale",
       {{"activation_dtype", "[\"dtype\",\"bfloat16\"]"}}},
      {"Int4PlainInt32Tensor",
       kQuantization,
       {"qdata", "scale", "zero_point"},
       {"act_pre_scale"},
       {"block_size", "shape"},
       {},
       OuterShape::kShapeAttribute,
       OuterDtype::kMemberDtype,
       "scale"},
      {"Int4PreshuffledTensor",
       kQuantization,
       {"qdata", "group_scale"},
       {"group_zero", "row_scale"},
       {"block_size", "shape"},
       {},
       OuterShape::kShapeAttribute,
       OuterDtype::kMemberDtype,
       "group_scale"},
      {"Int4TilePackedTo4dTensor",
       kQuantization,
       {"qdata", "scale_and_zero"},
       {"act_pre_scale"},
       {"block_size", "shape"},
       {},
       OuterShape::kShapeAttribute,
       OuterDtype::kBFloat16,
       {}},
  };
  return table;
}

std::string Names(std::vector<std::string_view> names) {
  std::sort(names.begin(), names.end());
  std::string out;
  for (const auto n : names) out += (out.empty() ? "" : ", ") + std::string(n);
  return out;
}

template <class Row>
const Row* Find(const std::vector<Row>& rows, std::string_view name) {
  for (const Row& r : rows) {
    if (r.name == name) return &r;
  }
  return nullptr;
}

bool Has(const std::vector<std::string_view>& v, std::string_view s) {
  return std::find(v.begin(), v.end(), s) != v.end();
}

void CheckNoFloat(const nlohmann::json& j) {
  if (j.is_number_float()) {
    throw Error(ErrorCode::kInvalidArgument, "", std::nullopt,
                "a description holds no JSON float: a float is [\"float\", float.hex()]");
  }
  if (j.is_structured()) {
    for (const auto& x : j) CheckNoFloat(x);
  }
}

// One JSON value, as spec §4.13.2 reads a description: nesting at most 256
// deep, and a key twice in one object refused (nlohmann's DOM would keep the
// last).
class DescriptionParser : public json::DomBuilder<nlohmann::json> {
 public:
  DescriptionParser() : DomBuilder(256) {}
  std::string error;

 protected:
  bool OnKey(const nlohmann::json& object, const std::string& key) override {
    if (!object.contains(key)) return true;
    error = "key " + format::Quote(key) + " twice in one object";
    return false;
  }
  bool OnTooDeep() override {
    error = "JSON nested more than 256 deep";
    return false;
  }
  bool OnError(std::size_t, const nlohmann::detail::exception& e) override {
    error = std::string("not JSON (") + e.what() + ")";
    return false;
  }
};

constexpr int kMaxTypedDepth = 32;

std::string Kind(const nlohmann::json& v) {
  switch (v.type()) {
    case nlohmann::json::value_t::null:
      return "null";
    case nlohmann::json::value_t::boolean:
      return "a boolean";
    case nlohmann::json::value_t::number_integer:
    case nlohmann::json::value_t::number_unsigned:
      return "an integer";
    case nlohmann::json::value_t::number_float:
      return "a number with a fraction or exponent";
    case nlohmann::json::value_t::string:
      return "a string";
    case nlohmann::json::value_t::array:
      return "an array";
    case nlohmann::json::value_t::object:
      return "an object";
    default:
      return "a value";
  }
}

// The depth of typed value `v` (§4.13.2), or throws `fail(why)`.
template <class Fail>
int TypedDepth(const nlohmann::json& v, const Fail& fail) {
  if (v.is_null() || v.is_boolean() || v.is_string() || v.is_number_integer()) {
    if (v.is_number_unsigned() &&
        v.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      fail("an integer outside int64 (" + v.dump() + ")");
    }
    return 0;
  }
  if (!v.is_array() || v.empty() || !v[0].is_string()) {
    fail("expected a typed value, found " + (v.is_array() && v.empty() ? "an empty array"
                                             : v.is_array() ? "an array without a tag"
                                                            : Kind(v)));
  }
  const std::string& tag = v[0].get_ref<const std::string&>();
  const auto shape = [&](size_t n, bool ok) {
    if (v.size() != n || !ok) fail("expected a typed value, found tag " + format::Quote(tag) +
                                   " with " + std::to_string(v.size() - 1) + " items");
  };
  if (tag == "float") {
    shape(2, v.size() == 2 && v[1].is_string());
    if (!ParseFloatHex(v[1].get_ref<const std::string&>())) {
      fail("float: expected a float.hex() text, found " + format::Quote(v[1].get<std::string>()));
    }
    return 1;
  }
  if (tag == "dtype") {
    shape(2, v.size() == 2 && v[1].is_string());
    return 1;
  }
  if (tag == "size") {
    shape(2, v.size() == 2 && v[1].is_array() &&
                 std::all_of(v[1].begin(), v[1].end(),
                             [](const nlohmann::json& x) { return x.is_number_integer(); }));
    for (const auto& x : v[1]) TypedDepth(x, fail);  // int64
    return 1;
  }
  if (tag == "enum") {
    shape(3, v.size() == 3 && v[1].is_string() && v[2].is_string());
    return 1;
  }
  int inner = 0;
  if (tag == "list" || tag == "tuple") {
    shape(2, v.size() == 2 && v[1].is_array());
    for (const auto& x : v[1]) inner = std::max(inner, TypedDepth(x, fail));
  } else if (tag == "record") {
    shape(3, v.size() == 3 && v[1].is_string() && v[2].is_object());
    for (const auto& [k, x] : v[2].items()) inner = std::max(inner, TypedDepth(x, fail));
  } else {
    fail("expected a typed value, found tag " + format::Quote(tag));
  }
  if (inner + 1 > kMaxTypedDepth) {
    fail("typed values nested more than " + std::to_string(kMaxTypedDepth) + " deep");
  }
  return inner + 1;
}

}  // namespace

bool Class::TakesTensor(std::string_view member) const {
  return Has(tensors, member) || Has(optional_tensors, member);
}

bool Class::TakesAttribute(std::string_view attribute) const {
  return Has(attributes, attribute) || Has(optional_attributes, attribute);
}

std::optional<nlohmann::json> Class::Default(std::string_view attribute) const {
  for (const auto& [name, text] : defaults) {
    if (name == attribute) return nlohmann::json::parse(text);
  }
  return std::nullopt;
}

const std::vector<Class>& Classes() { return Table(); }

const std::vector<Named>& Enums() {
  static const std::vector<Named> enums = {
      {"MappingType", "torchao.quantization.quant_primitives", false, {}},
      {"KernelPreference", "torchao.quantization.quantize_.common.kernel_preference", false, {}},
      {"IntxUnpackedToInt8TensorActivationQuantization",
       "torchao.quantization.quantize_.workflows.intx.intx_unpacked_to_int8_tensor",
       false,
       {}},
  };
  return enums;
}

const std::vector<Named>& Records() {
  static const std::vector<Named> records = {
      {"PerRow", kGranularity, false, {"dim"}},
      {"PerTensor", kGranularity, false, {}},
      {"PerGroup", kGranularity, false, {"group_size"}},
      {"PerAxis", kGranularity, false, {"axis"}},
      {"PerBlock", kGranularity, false, {"block_size"}},
      {"PerToken", kGranularity, false, {}},
      {"QuantizeTensorToInt8Kwargs",
       "torchao.quantization.quantize_.workflows.int8.int8_tensor",
       false,
       {"granularity", "mapping_type", "reduce_range"}},
      {"QuantizeTensorToFloat8Kwargs",
       "torchao.quantization.quantize_.workflows.float8.float8_tensor",
       false,
       {"float8_dtype", "granularity", "mm_config", "hp_value_lb", "hp_value_ub",
        "kernel_preference"}},
      {"Float8MMConfig",
       "torchao.float8.inference",
       true,
       {"emulate", "use_fast_accum", "pad_inner_dim"}},
  };
  return records;
}

const Class* FindClass(std::string_view name) { return Find(Classes(), name); }
const Named* FindEnum(std::string_view name) { return Find(Enums(), name); }
const Named* FindRecord(std::string_view name) { return Find(Records(), name); }

std::string ClassNames() {
  std::vector<std::string_view> v;
  for (const auto& c : Classes()) v.push_back(c.name);
  return Names(v);
}
std::string EnumNames() {
  std::vector<std::string_view> v;
  for (const auto& c : Enums()) v.push_back(c.name);
  return Names(v);
}
std::string RecordNames() {
  std::vector<std::string_view> v;
  for (const auto& c : Records()) v.push_back(c.name);
  return Names(v);
}

std::string Dump(const nlohmann::json& j) {
  CheckNoFloat(j);
  // nlohmann::json's objects are std::maps (keys sorted bytewise); dump()
  // writes no whitespace, raw UTF-8 (ensure_ascii=False), and escapes ",
  // \, \b, \f, \n, \r, \t and the other controls as \u00XX in lowercase hex,
  // as Python's encoder does (neither escapes U+007F).
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::strict);
}

std::string FloatHex(double x) {
  if (std::isnan(x)) return "nan";
  if (std::isinf(x)) return x < 0 ? "-inf" : "inf";
  uint64_t bits;
  std::memcpy(&bits, &x, 8);
  const bool negative = bits >> 63;
  const int biased = static_cast<int>((bits >> 52) & 0x7FF);
  const uint64_t fraction = bits & ((uint64_t{1} << 52) - 1);
  std::string out = negative ? "-0x" : "0x";
  if (biased == 0 && fraction == 0) return out + "0.0p+0";
  char digits[14];
  std::snprintf(digits, sizeof digits, "%013llx", static_cast<unsigned long long>(fraction));
  const int exponent = biased == 0 ? -1022 : biased - 1023;
  out += biased == 0 ? "0." : "1.";
  out += digits;
  out += exponent < 0 ? "p-" : "p+";
  return out + std::to_string(exponent < 0 ? -exponent : exponent);
}

std::optional<double> ParseFloatHex(std::string_view t) {
  if (t == "nan") return std::numeric_limits<double>::quiet_NaN();
  if (t == "inf") return std::numeric_limits<double>::infinity();
  if (t == "-inf") return -std::numeric_limits<double>::infinity();
  size_t i = 0;
  if (i < t.size() && t[i] == '-') ++i;
  if (t.substr(i, 2) != "0x") return std::nullopt;
  i += 2;
  if (i >= t.size() || (t[i] != '0' && t[i] != '1')) return std::nullopt;
  ++i;
  if (i >= t.size() || t[i] != '.') return std::nullopt;
  ++i;
  const size_t hex = i;
  while (i < t.size() && ((t[i] >= '0' && t[i] <= '9') || (t[i] >= 'a' && t[i] <= 'f'))) ++i;
  if (i == hex || i >= t.size() || t[i] != 'p') return std::nullopt;
  ++i;
  if (i >= t.size() || (t[i] != '+' && t[i] != '-')) return std::nullopt;
  ++i;
  const size_t dec = i;
  while (i < t.size() && t[i] >= '0' && t[i] <= '9') ++i;
  if (i == dec || i != t.size()) return std::nullopt;
  // glibc's strtod reads C99 hexadecimal floats, rounding to nearest even.
  const std::string text(t);
  errno = 0;
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (end != text.c_str() + text.size() || std::isinf(v)) return std::nullopt;
  return v;
}

bool IsTorchDTypeName(std::string_view name) {
  // str(d) of every torch.dtype d of torch 2.15, without "torch.".
  // clang-format off
  static constexpr std::string_view kNames[] = {
      "bcomplex32", "bfloat16", "bits16", "bits1x8", "bits2x4", "bits4x2", "bits8", "bool",
      "complex128", "complex32", "complex64", "float16", "float32", "float4_e2m1fn_x2", "float64",
      "float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz", "float8_e8m0fnu",
      "int1", "int16", "int2", "int3", "int32", "int4", "int5", "int6", "int64", "int7", "int8",
      "qint32", "qint8", "quint2x4", "quint4x2", "quint8", "uint1", "uint16", "uint2", "uint3",
      "uint32", "uint4", "uint5", "uint6", "uint64", "uint7", "uint8"};
  // clang-format on
  return std::find(std::begin(kNames), std::end(kNames), name) != std::end(kNames);
}

std::optional<DType> DTypeOfName(std::string_view name) {
  for (DType d : kAllDTypes) {
    if (DTypeName(d) == name) return d;
  }
  return std::nullopt;
}

std::string DescriptionText(const Description& d) {
  nlohmann::json j = nlohmann::json::object();
  j["library"] = d.library;
  j["version"] = d.version;
  j["class"] = d.cls;
  j["members"] = d.members;
  j["attributes"] = d.attributes;
  return Dump(j);
}

Description ParseDescription(const std::string& group, std::string_view text) {
  const auto fail = [&](const std::string& why) {
    throw Error(ErrorCode::kInvalidValue, "", std::nullopt,
                "group " + format::Quote(group) + ": description (spec §4.13.2): " + why);
  };
  if (text.size() >= 3 && text.substr(0, 3) == "\xEF\xBB\xBF") text.remove_prefix(3);
  DescriptionParser parser;
  const bool ok = nlohmann::json::sax_parse(text, &parser);
  if (!parser.error.empty()) fail(parser.error);
  if (!ok) fail("not JSON");
  nlohmann::json d = parser.Take();
  static const char* const kKeys[] = {"attributes", "class", "library", "members", "version"};
  bool exact = d.is_object() && d.size() == std::size(kKeys);
  for (const char* k : kKeys) exact = exact && d.contains(k);
  if (!exact) {
    std::string found;
    if (d.is_object()) {
      for (const auto& [k, v] : d.items()) found += (found.empty() ? "" : ", ") + k;
    }
    fail("expected an object with exactly attributes, class, library, members, version, found " +
         (d.is_object() ? "[" + found + "]" : Kind(d)));
  }
  for (const char* k : {"class", "library", "version"}) {
    if (!d[k].is_string()) fail(std::string(k) + ": expected a string, found " + Kind(d[k]));
  }
  Description out;
  out.library = d["library"].get<std::string>();
  out.version = d["version"].get<std::string>();
  out.cls = d["class"].get<std::string>();
  const nlohmann::json& members = d["members"];
  if (!members.is_array()) fail("members: expected an array of names, found " + Kind(members));
  for (const auto& m : members) {
    if (!m.is_string() || m.get_ref<const std::string&>().empty()) {
      fail("members: expected non-empty strings, found " + (m.is_string() ? "\"\"" : Kind(m)));
    }
    const std::string& name = m.get_ref<const std::string&>();
    if (std::find(out.members.begin(), out.members.end(), name) != out.members.end()) {
      fail("members: " + format::Quote(name) + " twice");
    }
    out.members.push_back(name);
  }
  if (!d["attributes"].is_object()) {
    fail("attributes: expected an object, found " + Kind(d["attributes"]));
  }
  for (const auto& item : d["attributes"].items()) {
    // Not a structured binding: C++17 lambdas cannot capture one (clang refuses).
    const std::string& k = item.key();
    TypedDepth(item.value(),
               [&](const std::string& why) { fail("attributes: " + format::Quote(k) + ": " + why); });
  }
  out.attributes = std::move(d["attributes"]);
  return out;
}

}  // namespace tsar::torchao
