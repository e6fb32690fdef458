// torchao's quantized tensors in transformers' safetensors files, to tensor
// groups and back (writer/torchao_safetensors.h).
#include "writer/torchao_safetensors.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string_view>
#include <unordered_map>
#include <unordered_set>

#include "format/reader.h"
#include "tsar/error.h"
#include "writer/strict_json.h"
#include "writer/torchao_table.h"

namespace tsar::torchao {
namespace {

using Json = nlohmann::json;
using format::Quote;

constexpr const char* kTensorNames = "tensor_names";
constexpr int kMaxTypedDepth = 32;  // spec §4.13.2

// Why a step of the import failed: the tensor it concerns ("" for the
// file's "tensor_names") and what was wrong.
struct Refusal {
  std::string tensor;
  std::string why;
};

[[noreturn]] void Refuse(const std::string& tensor, const std::string& why) {
  throw Refusal{tensor, why};
}

// torchao's JSON value `v` (an attribute, or a record's field) as a typed
// value of spec §4.13.2.
Json Typed(const Json& v, const std::string& tensor, const std::string& where, int depth = 0) {
  const auto fail = [&](const std::string& why) { Refuse(tensor, where + ": " + why); };
  if (v.is_null() || v.is_boolean() || v.is_string() || v.is_number_integer()) {
    if (v.is_number_unsigned() &&
        v.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      fail("expected an integer of int64, found " + v.dump());
    }
    return v;
  }
  if (depth >= kMaxTypedDepth) {
    fail("values nested more than " + std::to_string(kMaxTypedDepth) + " deep");
  }
  if (v.is_number_float()) return Json::array({"float", FloatHex(v.get<double>())});
  if (v.is_array()) {  // a list or a tuple in Python: JSON says which not
    Json items = Json::array();
    for (size_t i = 0; i < v.size(); ++i) {
      items.push_back(Typed(v[i], tensor, where + "[" + std::to_string(i) + "]", depth + 1));
    }
    return Json::array({"list", std::move(items)});
  }
  if (!v.is_object() || v.size() != 2 || !v.contains("_type") || !v.contains("_data") ||
      !v["_type"].is_string()) {
    fail("expected a JSON value or a torchao object {\"_type\": ..., \"_data\": ...}, found " +
         importer::Describe(v));
  }
  const std::string& type = v["_type"].get_ref<const std::string&>();
  const Json& data = v["_data"];
  if (type == "torch.dtype") {
    if (!data.is_string() || data.get_ref<const std::string&>().empty()) {
      fail("torch.dtype: expected a dtype's name, found " + importer::Describe(data));
    }
    return Json::array({"dtype", data});
  }
  if (FindEnum(type)) {
    if (!data.is_string()) {
      fail("enum " + type + ": expected a member's name, found " + importer::Describe(data));
    }
    return Json::array({"enum", type, data});
  }
  if (FindRecord(type)) {
    if (!data.is_object()) {
      fail("record " + type + ": expected an object of its fields, found " +
           importer::Describe(data));
    }
    Json fields = Json::object();
    for (const auto& [k, x] : data.items()) {
      fields[k] = Typed(x, tensor, where + "." + k, depth + 1);
    }
    return Json::array({"record", type, std::move(fields)});
  }
  Refuse(tensor, where + ": _type " + Quote(type) +
                    " is not an enum or record of tsar's torchao table (enums " + EnumNames() +
                    "; records " + RecordNames() + ")");
}

// C-contiguous strides of `sizes`, as LibTorch computes them (a size of 0
// counts as 1); nullopt past int64.
std::optional<std::vector<int64_t>> Contiguous(const std::vector<int64_t>& sizes) {
  std::vector<int64_t> strides(sizes.size(), 1);
  uint64_t stride = 1;
  for (size_t i = sizes.size(); i-- > 0;) {
    strides[i] = static_cast<int64_t>(stride);
    if (!format::CheckedMul(stride, static_cast<uint64_t>(std::max<int64_t>(sizes[i], 1)),
                            &stride) ||
        stride > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return std::nullopt;
    }
  }
  return strides;
}

// The integers of typed value `v` (["list", [...]], ["tuple", ...] or
// ["size", ...] of integers), or nullopt.
std::optional<std::vector<int64_t>> Ints(const Json& v) {
  if (!v.is_array() || v.size() != 2 || !v[0].is_string() || !v[1].is_array()) return std::nullopt;
  const std::string& tag = v[0].get_ref<const std::string&>();
  if (tag != "list" && tag != "tuple" && tag != "size") return std::nullopt;
  std::vector<int64_t> out;
  for (const auto& x : v[1]) {
    if (!x.is_number_integer() ||
        (x.is_number_unsigned() &&
         x.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) ||
        x.get<int64_t>() < 0) {
      return std::nullopt;
    }
    out.push_back(x.get<int64_t>());
  }
  return out;
}

struct Planned {
  std::string name;                   // M.P
  std::vector<std::string> keys;      // M._P_<member>, in member order
  writer::SparseRef group;            // components still empty
  std::vector<std::string> suffixes;  // ".<member>"
};

// The group of quantized tensor `name`, whose metadata is `text`, over the
// entry's tensors `by_key` (key -> index).
// The __metadata__ of parameter `name`: an object with a string "_type".
Json ParamMeta(const std::string& path, const std::string& name, const std::string& text) {
  Json meta;
  try {
    meta = importer::ParseStrictJson(text, path, 0, "__metadata__ " + Quote(name), "key");
  } catch (const Error& e) {
    Refuse(name, std::string("its __metadata__ is not JSON torchao's reader takes (") + e.what() +
                     ")");
  }
  if (!meta.is_object() || !meta.contains("_type") || !meta["_type"].is_string()) {
    Refuse(name, "__metadata__: expected an object with a string \"_type\", found " +
                     importer::Describe(meta));
  }
  return meta;
}

Planned Plan(const std::string& name, const Json& meta,
             const std::vector<importer::Imported::Tensor>& tensors,
             const std::unordered_map<std::string, size_t>& by_key) {
  const std::string& type = meta["_type"].get_ref<const std::string&>();
  const Class* cls = FindClass(type);
  if (!cls) {
    Refuse(name, "class " + Quote(type) + " is not in tsar's table of torchao classes (" +
                     ClassNames() + ")");
  }
  for (const auto& [k, v] : meta.items()) {
    if (k != "_type" && k != "_data" && k != "_tensor_data_names") {
      Refuse(name, "__metadata__: " + Quote(k) +
                       ": not a member of torchao's layout (_type, _data, _tensor_data_names)");
    }
  }
  if (!meta.contains("_data") || !meta["_data"].is_object()) {
    Refuse(name, "__metadata__: _data: expected an object of attributes, found " +
                     (meta.contains("_data") ? importer::Describe(meta["_data"]) : "none"));
  }
  const Json* names = meta.contains("_tensor_data_names") ? &meta["_tensor_data_names"] : nullptr;
  if (!names || !names->is_array()) {
    Refuse(name, "__metadata__: _tensor_data_names: expected a list of inner tensor names, found " +
                     (names ? importer::Describe(*names) : "none"));
  }
  std::set<std::string> present;
  for (const auto& n : *names) {
    if (!n.is_string() || !cls->TakesTensor(n.get_ref<const std::string&>())) {
      Refuse(name, "_tensor_data_names: " + (n.is_string() ? Quote(n.get<std::string>())
                                                            : importer::Describe(n)) +
                       " is not an inner tensor of " + type + " in tsar's table");
    }
    if (!present.insert(n.get<std::string>()).second) {
      Refuse(name, "_tensor_data_names: " + Quote(n.get<std::string>()) + " twice");
    }
  }
  const size_t dot = name.rfind('.');
  if (dot == std::string::npos || dot == 0 || dot + 1 == name.size()) {
    Refuse(name, "expected a module and a parameter name (torchao's keys are "
                 "\"<module>._<parameter>_<inner>\")");
  }
  const std::string prefix = name.substr(0, dot) + "._" + name.substr(dot + 1) + "_";
  Planned p;
  p.name = name;
  // Members in the class's order: its tensors, then the optional ones present.
  std::vector<std::string_view> order(cls->tensors);
  order.insert(order.end(), cls->optional_tensors.begin(), cls->optional_tensors.end());
  Description d;
  d.library = std::string(kLibrary);
  d.version = std::string(kUnknownVersion);
  d.cls = type;
  for (const std::string_view m : order) {
    const std::string member(m);
    const bool required =
        std::find(cls->tensors.begin(), cls->tensors.end(), m) != cls->tensors.end();
    if (!present.count(member)) {
      if (required) Refuse(name, "_tensor_data_names: lacks " + Quote(member) + ", which " + type +
                                     " requires");
      continue;
    }
    const std::string key = prefix + member;
    if (!by_key.count(key)) {
      Refuse(name, "inner tensor " + Quote(member) + ": expected a tensor " + Quote(key) +
                       ", found none");
    }
    p.keys.push_back(key);
    p.suffixes.push_back("." + member);
    d.members.push_back(member);
  }
  d.attributes = Json::object();
  for (const auto& [k, v] : meta["_data"].items()) {
    if (!cls->TakesAttribute(k)) {
      Refuse(name, "_data: " + Quote(k) + " is not an attribute of " + type + " in tsar's table");
    }
    d.attributes[k] = Typed(v, name, "attribute " + Quote(k));
  }
  for (const std::string_view a : cls->attributes) {
    if (!d.attributes.contains(std::string(a))) {
      Refuse(name, "_data: lacks " + Quote(std::string(a)) + ", which " + type + " requires");
    }
  }
  writer::SparseRef& g = p.group;
  g.layout = format::SparseLayout::kGroup;
  // The outer tensor, as the class's __new__ makes it.
  if (cls->shape == OuterShape::kShapeAttribute) {
    const auto s = Ints(d.attributes["shape"]);
    if (!s) Refuse(name, "attribute \"shape\": expected a list of non-negative integers");
    g.sizes = *s;
  } else {
    g.sizes = tensors[by_key.at(p.keys[0])].tensor.sizes;
  }
  const auto strides = Contiguous(g.sizes);
  if (!strides) Refuse(name, "its shape has more elements than int64 counts");
  g.strides = *strides;
  switch (cls->dtype) {
    case OuterDtype::kDtypeAttribute: {
      const Json& dt = d.attributes.contains("dtype") ? d.attributes["dtype"] : Json();
      if (dt.is_null()) {
        g.dtype = DType::kFloat32;  // torch's default dtype
        break;
      }
      const std::optional<DType> known =
          dt.is_array() && dt.size() == 2 && dt[0] == "dtype" ? DTypeOfName(dt[1].get<std::string>())
                                                              : std::nullopt;
      if (!known) {
        Refuse(name, "attribute \"dtype\": expected a dtype an archive holds, found " + dt.dump());
      }
      g.dtype = *known;
      break;
    }
    case OuterDtype::kMemberDtype: {
      const auto at = std::find(d.members.begin(), d.members.end(), cls->dtype_member);
      g.dtype = tensors[by_key.at(p.keys[at - d.members.begin()])].tensor.dtype;
      break;
    }
    case OuterDtype::kBFloat16:
      g.dtype = DType::kBFloat16;
      break;
  }
  g.description = DescriptionText(d);
  return p;
}

// The parameter names of "tensor_names", or a refusal.
std::vector<std::string> TensorNames(const std::string& path, const std::string& text) {
  Json names;
  try {
    names = importer::ParseStrictJson(text, path, 0, "__metadata__ \"tensor_names\"", "key");
  } catch (const Error& e) {
    Refuse("", std::string("\"tensor_names\" is not JSON (") + e.what() + ")");
  }
  if (!names.is_array()) {
    Refuse("", "\"tensor_names\": expected a JSON list of names, found " +
                   importer::Describe(names));
  }
  std::vector<std::string> out;
  std::unordered_set<std::string> seen;
  for (const auto& n : names) {
    if (!n.is_string()) {
      Refuse("", "\"tensor_names\": expected names, found " + importer::Describe(n));
    }
    if (!seen.insert(n.get<std::string>()).second) {
      Refuse(n.get<std::string>(), "named twice in \"tensor_names\"");
    }
    out.push_back(n.get<std::string>());
  }
  return out;
}

// Python's json.dumps(v) with its default separators (", ", ": ") and
// ensure_ascii=False, keys in the order given: how torchao writes its
// metadata. Floats as repr() would (shortest text that reads back the same),
// NaN and infinities as Python's json writes them.
void DumpPython(const nlohmann::ordered_json& v, std::string& out) {
  switch (v.type()) {
    case nlohmann::ordered_json::value_t::object: {
      out += '{';
      bool first = true;
      for (const auto& [k, x] : v.items()) {
        if (!first) out += ", ";
        first = false;
        out += nlohmann::json(k).dump(-1, ' ', false, nlohmann::json::error_handler_t::strict);
        out += ": ";
        DumpPython(x, out);
      }
      out += '}';
      return;
    }
    case nlohmann::ordered_json::value_t::array: {
      out += '[';
      for (size_t i = 0; i < v.size(); ++i) {
        if (i) out += ", ";
        DumpPython(v[i], out);
      }
      out += ']';
      return;
    }
    case nlohmann::ordered_json::value_t::number_float: {
      const double d = v.get<double>();
      if (std::isnan(d)) {
        out += "NaN";
      } else if (std::isinf(d)) {
        out += d < 0 ? "-Infinity" : "Infinity";
      } else {
        char buf[40];
        for (int precision = 1; precision <= 17; ++precision) {
          std::snprintf(buf, sizeof buf, "%.*g", precision, d);
          if (std::strtod(buf, nullptr) == d) break;
        }
        std::string s = buf;
        if (s.find_first_of(".eEn") == std::string::npos) s += ".0";
        out += s;
      }
      return;
    }
    default:
      out += v.dump(-1, ' ', false, nlohmann::json::error_handler_t::strict);
  }
}

// Typed value `v` (checked by ParseDescription) as torchao's JSON value.
nlohmann::ordered_json Untyped(const Json& v, const std::string& group, const std::string& where) {
  using OJ = nlohmann::ordered_json;
  const auto fail = [&](const std::string& why) {
    throw Error(ErrorCode::kInvalidValue, "", std::nullopt,
                "group " + Quote(group) + ": " + where + ": " + why);
  };
  if (!v.is_array()) return OJ(v);  // null, bool, int, str
  const std::string& tag = v[0].get_ref<const std::string&>();
  if (tag == "float") return OJ(*ParseFloatHex(v[1].get_ref<const std::string&>()));
  if (tag == "list" || tag == "tuple" || tag == "size") {
    OJ items = OJ::array();
    for (size_t i = 0; i < v[1].size(); ++i) {
      items.push_back(Untyped(v[1][i], group, where + "[" + std::to_string(i) + "]"));
    }
    return items;
  }
  OJ out = OJ::object();
  if (tag == "dtype") {
    out["_type"] = "torch.dtype";
    out["_data"] = v[1];
    return out;
  }
  const std::string& type = v[1].get_ref<const std::string&>();
  if (tag == "enum") {
    if (!FindEnum(type)) {
      fail("enum " + Quote(type) + " is not one of tsar's torchao table (" + EnumNames() + ")");
    }
    out["_type"] = type;
    out["_data"] = v[2];
    return out;
  }
  // record
  if (!FindRecord(type)) {
    fail("record " + Quote(type) + " is not one of tsar's torchao table (" + RecordNames() + ")");
  }
  OJ fields = OJ::object();
  for (const auto& [k, x] : v[2].items()) fields[k] = Untyped(x, group, where + "." + k);
  out["_type"] = type;
  out["_data"] = std::move(fields);
  return out;
}

}  // namespace

void GroupTorchaoSafetensors(importer::Imported& in, const std::string& path, bool strict) {
  const auto names_at =
      std::find_if(in.metadata.begin(), in.metadata.end(), [](const importer::Imported::Meta& m) {
        return m.entry.empty() && m.key == kTensorNames;
      });
  if (names_at == in.metadata.end() || in.entries.size() != 1) return;
  std::unordered_map<std::string, const std::string*> meta;  // archive-level strings
  for (const auto& m : in.metadata) {
    if (const auto* s = std::get_if<std::string>(&m.value); s && m.entry.empty()) {
      meta.emplace(m.key, s);
    }
  }
  const auto* names_text = std::get_if<std::string>(&names_at->value);
  auto& entry = in.entries[0];
  std::unordered_map<std::string, size_t> by_key;
  for (size_t i = 0; i < entry.tensors.size(); ++i) by_key.emplace(entry.tensors[i].name, i);
  std::vector<Planned> planned;
  std::vector<std::string> names;
  std::unordered_set<std::string> plain;  // {"_type": "Tensor"}
  try {
    if (!names_text) Refuse("", "\"tensor_names\": expected a string of JSON");
    names = TensorNames(path, *names_text);
    for (const std::string& name : names) {
      const auto it = meta.find(name);
      if (it == meta.end()) {
        Refuse(name, "\"tensor_names\" names it, and the __metadata__ has no key " + Quote(name) +
                         " saying what it is");
      }
      const Json m = ParamMeta(path, name, *it->second);
      if (m["_type"] == "Tensor") {  // a plain tensor, under its own name
        if (m.size() != 1) {
          Refuse(name, "__metadata__: a plain tensor's is {\"_type\": \"Tensor\"}, found " +
                           std::to_string(m.size() - 1) + " more keys");
        }
        if (!by_key.count(name)) {
          Refuse(name, "a plain tensor, says the __metadata__, and the file has no tensor "
                       "of that name");
        }
        plain.insert(name);
        continue;
      }
      planned.push_back(Plan(name, m, entry.tensors, by_key));
    }
    std::unordered_map<std::string, const std::string*> owner;  // key -> group
    for (const Planned& p : planned) {
      for (const std::string& k : p.keys) {
        if (const auto [at, fresh] = owner.emplace(k, &p.name); !fresh) {
          Refuse(p.name, "tensor " + Quote(k) + " is an inner tensor of " + Quote(*at->second) +
                             " too");
        }
        if (plain.count(k)) {
          Refuse(p.name, "tensor " + Quote(k) + " is its inner tensor, and a plain tensor of "
                         "\"tensor_names\" too");
        }
      }
    }
  } catch (const Refusal& r) {
    const std::string what = (r.tensor.empty() ? "" : "tensor " + Quote(r.tensor) + ": ") +
                             "torchao's metadata (transformers' TorchAoConfig): " + r.why;
    if (strict) {
      throw Error(ErrorCode::kBadInput, path, std::nullopt,
                  what + " (without --strict its inner tensors are packed as plain tensors)");
    }
    in.skipped.push_back(what + ": no tensor is stored as a group; every inner tensor is packed "
                                "as a plain tensor under its own name, and the metadata is kept "
                                "(--strict refuses the file)");
    return;
  }
  if (planned.empty()) return;  // plain tensors only: nothing to say beyond the metadata

  // Each group stands where its first member stood.
  std::vector<size_t> first_member;
  std::vector<bool> member(entry.tensors.size(), false);
  for (Planned& p : planned) {
    size_t first = entry.tensors.size();
    for (size_t k = 0; k < p.keys.size(); ++k) {
      const size_t i = by_key.at(p.keys[k]);
      first = std::min(first, i);
      member[i] = true;
      p.group.components.emplace_back(p.suffixes[k], std::move(entry.tensors[i].tensor));
    }
    first_member.push_back(first);
  }
  std::vector<size_t> kept_before(entry.tensors.size() + 1, 0);  // kept tensors before index i
  std::vector<importer::Imported::Tensor> kept;
  for (size_t i = 0; i < entry.tensors.size(); ++i) {
    kept_before[i] = kept.size();
    if (!member[i]) kept.push_back(std::move(entry.tensors[i]));
  }
  std::vector<size_t> order(planned.size());
  for (size_t k = 0; k < order.size(); ++k) order[k] = k;
  std::sort(order.begin(), order.end(),
            [&](size_t a, size_t b) { return first_member[a] < first_member[b]; });
  for (size_t k : order) {
    entry.groups.push_back(
        {planned[k].name, std::move(planned[k].group), kept_before[first_member[k]]});
  }
  entry.tensors = std::move(kept);
  // What the groups say now: the archive holds no second copy of it.
  std::unordered_set<std::string> said(names.begin(), names.end());
  said.insert(kTensorNames);
  in.metadata.erase(std::remove_if(in.metadata.begin(), in.metadata.end(),
                                   [&](const importer::Imported::Meta& m) {
                                     return m.entry.empty() && said.count(m.key);
                                   }),
                    in.metadata.end());
}

TorchaoLayout TorchaoSafetensorsLayout(const ArchiveFile& a, const std::vector<TensorInfo>& infos) {
  using OJ = nlohmann::ordered_json;
  TorchaoLayout out;
  const std::vector<GroupInfo> groups = a.groups();
  std::unordered_map<std::string, std::string> key_of;  // member's archive name -> key
  std::unordered_map<std::string, const GroupInfo*> group_of_first;
  std::vector<std::pair<std::string, std::string>> group_meta;  // name, JSON
  for (const GroupInfo& g : groups) {
    const Description d = ParseDescription(g.name, g.description);
    const std::string here = "group " + Quote(g.name) + " (a " + d.library + " " + d.cls +
                             ", written by " + d.library + " " + d.version + ")";
    const Class* cls = d.library == kLibrary ? FindClass(d.cls) : nullptr;
    if (!cls) {
      throw Error(ErrorCode::kUnsupported, a.path(), std::nullopt,
                  here + ": not in tsar's table of torchao classes (" + ClassNames() +
                      "), so tsar cannot write it in torchao's safetensors layout");
    }
    if (d.members.size() != g.members.size()) {
      throw Error(ErrorCode::kInvalidValue, a.path(), std::nullopt,
                  here + ": description: members: expected " + std::to_string(g.members.size()) +
                      " names, one per member tensor, found " + std::to_string(d.members.size()));
    }
    const size_t dot = g.name.rfind('.');
    if (dot == std::string::npos || dot == 0 || dot + 1 == g.name.size()) {
      throw Error(ErrorCode::kUnsupported, a.path(), std::nullopt,
                  here + ": torchao's safetensors keys are \"<module>._<parameter>_<inner>\", "
                         "and this name has no module and parameter");
    }
    const std::string prefix = g.name.substr(0, dot) + "._" + g.name.substr(dot + 1) + "_";
    for (const std::string& m : d.members) {
      if (!cls->TakesTensor(m)) {
        throw Error(ErrorCode::kInvalidValue, a.path(), std::nullopt,
                    here + ": member " + Quote(m) + " is not an inner tensor of " + d.cls +
                        " in tsar's table");
      }
    }
    for (const std::string_view m : cls->tensors) {
      if (std::find(d.members.begin(), d.members.end(), m) == d.members.end()) {
        throw Error(ErrorCode::kInvalidValue, a.path(), std::nullopt,
                    here + ": lacks member " + Quote(std::string(m)) + ", which " + d.cls +
                        " requires");
      }
    }
    for (const auto& [k, v] : d.attributes.items()) {
      if (!cls->TakesAttribute(k)) {
        throw Error(ErrorCode::kInvalidValue, a.path(), std::nullopt,
                    here + ": attribute " + Quote(k) + " is not one " + d.cls +
                        " takes in tsar's table");
      }
    }
    for (const std::string_view k : cls->attributes) {
      if (!d.attributes.contains(std::string(k))) {
        throw Error(ErrorCode::kInvalidValue, a.path(), std::nullopt,
                    here + ": lacks attribute " + Quote(std::string(k)) + ", which " + d.cls +
                        " requires");
      }
    }
    for (size_t k = 0; k < g.members.size(); ++k) key_of[g.members[k]] = prefix + d.members[k];
    // As torchao's encoder: the optional attributes, then the others, each
    // in the class's order; the inner tensors present, optional ones first.
    OJ data = OJ::object();
    for (const auto* list : {&cls->optional_attributes, &cls->attributes}) {
      for (const std::string_view k : *list) {
        const std::string key(k);
        if (d.attributes.contains(key)) {
          data[key] = Untyped(d.attributes[key], g.name, "attribute " + Quote(key));
        }
      }
    }
    OJ tensor_names = OJ::array();
    for (const auto* list : {&cls->optional_tensors, &cls->tensors}) {
      for (const std::string_view m : *list) {
        if (std::find(d.members.begin(), d.members.end(), m) != d.members.end())
          tensor_names.push_back(std::string(m));
      }
    }
    OJ meta = OJ::object();
    meta["_type"] = d.cls;
    meta["_data"] = std::move(data);
    meta["_tensor_data_names"] = std::move(tensor_names);
    std::string text;
    DumpPython(meta, text);
    group_meta.emplace_back(g.name, std::move(text));
    if (!g.members.empty()) group_of_first.emplace(g.members[0], &g);
  }
  // Every parameter in archive order: a group where its first member stands.
  std::vector<std::string> names;
  std::unordered_set<std::string> keys;
  std::unordered_map<std::string, size_t> meta_index;
  for (size_t i = 0; i < group_meta.size(); ++i) meta_index.emplace(group_meta[i].first, i);
  for (const TensorInfo& t : infos) {
    const auto k = key_of.find(t.name);
    const bool in_group = k != key_of.end() && t.role == Role::kSparseComponent;
    const std::string key = in_group ? k->second : t.name;
    if (!keys.insert(key).second) {
      throw Error(ErrorCode::kInvalidArgument, a.path(), std::nullopt,
                  "tensor " + Quote(t.name) + ": its torchao safetensors key " + Quote(key) +
                      " is another tensor's too");
    }
    out.items.push_back({key, &t});
    if (!in_group) {
      names.push_back(t.name);
      out.metadata.emplace_back(t.name, "{\"_type\": \"Tensor\"}");
    } else if (const auto g = group_of_first.find(t.name); g != group_of_first.end()) {
      names.push_back(g->second->name);
      out.metadata.push_back(group_meta[meta_index.at(g->second->name)]);
    }
  }
  std::string list;
  DumpPython(OJ(names), list);
  out.metadata.emplace_back(kTensorNames, std::move(list));
  return out;
}

}  // namespace tsar::torchao
