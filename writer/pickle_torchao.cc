// The restricted pickle machine's torchao tensors (writer/pickle_machine.h):
// a torchao quantized tensor, as torch.save pickles it, read as the tensor
// group tsar stores it as (spec §4.13), through tsar's table of torchao
// classes, enums and records (writer/torchao_table.h). Nothing is resolved
// or run: the pickle's objects are only compared with the table's names.
//
// torch.save writes a wrapper subclass (torch.Tensor._make_wrapper_subclass)
// as
//   torch._tensor._rebuild_from_type_v2(
//       torch._utils._rebuild_wrapper_subclass, <class>,
//       (<class>, <outer dtype>, <sizes>, <strides>, <storage offset>,
//        torch.serialization._get_layout("torch.strided"), torch.device(...),
//        <requires_grad>),
//       <the object's __dict__>)
// whose __dict__ holds the inner tensors (plain _rebuild_tensor_v2/v3
// tensors) and the attributes; a Parameter's also holds _is_param. An enum is
// getattr(<enum class>, "MEMBER"); a dataclass is NEWOBJ of its class with ()
// and BUILD of its __dict__ (none when empty); a named tuple is NEWOBJ of its
// class with its fields; a torch.Size is torch.Size(<tuple>); a dtype is the
// global torch.<name>. The memo may share any of them.
//
// The group is what python/tsar/_torchao.py's flatten() and describe() make
// of the same tensor: members in the class's order, attributes as typed
// values (encode()), "dtype" and "shape" from the wrapper's arguments.
#include <algorithm>
#include <nlohmann/json.hpp>
#include <string_view>
#include <unordered_map>

#include "format/reader.h"
#include "writer/pickle_machine.h"
#include "writer/torchao_table.h"

namespace tsar::pickle::detail {
namespace {

using format::Quote;

// Why a torchao tensor is not a group: caught by TorchaoGroup.
struct NotGroup {
  std::string why;
};

bool Has(const std::vector<std::string_view>& v, std::string_view s) {
  return std::find(v.begin(), v.end(), s) != v.end();
}

}  // namespace

// Reads one torchao tensor's objects. Every failure is a NotGroup naming
// what tsar's table does not hold; the input itself is never refused here.
class TorchaoReader {
 public:
  using Pairs = std::vector<std::pair<std::string, uint32_t>>;
  explicit TorchaoReader(Machine& m) : m_(m) {}

  // module and name of global node `id`, or false.
  bool Global(uint32_t id, std::string_view* module, std::string_view* name) const {
    const Node& n = m_.At(id);
    if (n.kind != NodeKind::kGlobal) return false;
    const size_t nl = n.s.find('\n');
    *module = std::string_view(n.s).substr(0, nl);
    *name = std::string_view(n.s).substr(nl + 1);
    return true;
  }
  bool IsGlobal(uint32_t id, std::string_view module, std::string_view name) const {
    std::string_view m, n;
    return Global(id, &m, &n) && m == module && n == name;
  }
  // The object that node `id` is, made by `how` without later opcodes, or nullptr.
  const Object* Made(uint32_t id, uint8_t how) const {
    const Node& n = m_.At(id);
    if (n.kind != NodeKind::kObject) return nullptr;
    const Object& o = m_.objects_[n.i];
    return o.how == how ? &o : nullptr;
  }
  const std::vector<uint32_t>& Items(uint32_t id) const { return m_.At(id).items; }
  NodeKind KindOf(uint32_t id) const { return m_.At(id).kind; }

  // What node `id` is, for messages: "torch.int4", "argparse.Namespace", "list".
  std::string Name(uint32_t id) {
    const Node& n = m_.At(id);
    if (n.kind == NodeKind::kGlobal || n.kind == NodeKind::kObject) return m_.Label(id);
    return KindName(n.kind);
  }
  std::string What(uint32_t id) { return "a " + Name(id); }

  // A tuple (or list) of ints >= 0, at most kMaxRank of them.
  std::vector<int64_t> Dims(uint32_t id, const std::string& what) {
    const Node& n = m_.At(id);
    if (n.kind != NodeKind::kTuple && n.kind != NodeKind::kList) {
      throw NotGroup{what + ": expected a tuple of ints, found " + What(id)};
    }
    if (n.items.size() > kMaxRank) {
      throw NotGroup{what + ": expected at most " + std::to_string(kMaxRank) + " dims"};
    }
    std::vector<int64_t> out;
    for (uint32_t d : n.items) {
      const Node& x = m_.At(d);
      if (x.kind != NodeKind::kInt || x.i < 0) {
        throw NotGroup{what + ": expected ints >= 0, found " +
                       (x.kind == NodeKind::kInt ? std::to_string(x.i) : What(d))};
      }
      out.push_back(x.i);
    }
    return out;
  }

  // The typed value (spec §4.13.2) of node `id`, as _torchao.encode() writes it.
  // `level` is 1 for an attribute's value, 2 for an item of it...: a value
  // with a tag (["float", ...], ["list", ...]) at a level past 32 nests past
  // the 32 deep that spec §4.13.2 allows.
  nlohmann::json Typed(uint32_t id, int level, const std::string& where) {
    const Node& n = m_.At(id);
    switch (n.kind) {
      case NodeKind::kNone:
        return nullptr;
      case NodeKind::kBool:
        return n.i != 0;
      case NodeKind::kInt:
        return n.i;
      case NodeKind::kString:
        return n.s;
      default:
        break;
    }
    if (level > 32) throw NotGroup{where + ": typed values nested more than 32 deep"};
    // A node read again costs what a copy of it would (Convert's budget):
    // sharing cannot make a small pickle a huge description.
    if (m_.typed_[id]) m_.Charge(sizeof(Node) + n.s.size() + n.items.size() * 16);
    m_.typed_[id] = true;
    switch (n.kind) {
      case NodeKind::kFloat:
        return nlohmann::json::array({"float", torchao::FloatHex(n.f)});
      case NodeKind::kList:
      case NodeKind::kTuple: {
        nlohmann::json items = nlohmann::json::array();
        for (uint32_t x : n.items) items.push_back(Typed(x, level + 1, where));
        return nlohmann::json::array({n.kind == NodeKind::kList ? "list" : "tuple", items});
      }
      case NodeKind::kGlobal: {
        std::string_view module, name;
        Global(id, &module, &name);
        if (module == "torch" && torchao::IsTorchDTypeName(name)) {
          return nlohmann::json::array({"dtype", std::string(name)});
        }
        break;
      }
      case NodeKind::kObject:
        return TypedObject(id, level, where);
      default:
        break;
    }
    throw NotGroup{where + ": " + What(id) +
                   ", which a tensor group cannot hold (None, bools, ints, floats, strings, "
                   "lists, tuples, dtypes, torch.Size and the enums and records of tsar's "
                   "torchao table)"};
  }

  nlohmann::json TypedObject(uint32_t id, int level, const std::string& where) {
    const Object& o = m_.objects_[m_.At(id).i];
    std::string_view module, name;
    const bool global = Global(o.callable, &module, &name);
    const std::vector<uint32_t>& args = Items(o.args);
    // An enum member: getattr(<enum class>, "MEMBER").
    if (global && o.how == op::kReduce && o.ops.empty() && name == "getattr" &&
        (module == "builtins" || module == "__builtin__") && args.size() == 2 &&
        KindOf(args[1]) == NodeKind::kString) {
      std::string_view em, en;
      const torchao::Named* row = nullptr;
      if (Global(args[0], &em, &en)) row = torchao::FindEnum(en);
      if (row == nullptr || row->module != em) {
        throw NotGroup{where + ": enum " + Name(args[0]) + " is not in tsar's torchao table (" +
                       torchao::EnumNames() + ")"};
      }
      return nlohmann::json::array({"enum", std::string(en), m_.At(args[1]).s});
    }
    // torch.Size(<tuple of ints>).
    if (global && o.how == op::kReduce && o.ops.empty() && module == "torch" && name == "Size" &&
        args.size() == 1) {
      const std::vector<int64_t> dims = Dims(args[0], where + ": torch.Size");
      return nlohmann::json::array({"size", dims});
    }
    // Python before 3.11 pickles an enum member by value (<enum class>(value)):
    // the table has no values, so it cannot say which member that is.
    if (const torchao::Named* e = global ? torchao::FindEnum(name) : nullptr;
        e != nullptr && e->module == module && o.how == op::kReduce) {
      throw NotGroup{where + ": enum " + std::string(name) +
                     " pickled by value (Python before 3.11), which tsar does not read"};
    }
    // A record: a dataclass (NEWOBJ of its class with (), BUILD of its
    // __dict__) or a named tuple (NEWOBJ of its class with its fields).
    const torchao::Named* row = global ? torchao::FindRecord(name) : nullptr;
    if (row == nullptr || row->module != module) {
      throw NotGroup{where + ": " + What(id) +
                     ", which is not an enum or record of tsar's torchao table (" +
                     torchao::EnumNames() + "; " + torchao::RecordNames() + ")"};
    }
    const std::string here = where + ": record " + std::string(name);
    if (o.how != op::kNewObj) throw NotGroup{here + ": expected NEWOBJ of its class"};
    Pairs given;  // field: node
    if (row->named_tuple) {
      if (!o.ops.empty() || args.size() != row->fields.size()) {
        throw NotGroup{here + ": expected the " + std::to_string(row->fields.size()) +
                       " fields of the named tuple, found " + std::to_string(args.size())};
      }
      for (size_t k = 0; k < args.size(); ++k) given.emplace_back(row->fields[k], args[k]);
    } else {
      if (!args.empty() || o.ops.size() > 1 ||
          (o.ops.size() == 1 && (o.ops[0].first != op::kBuild || o.ops[0].second.size() != 1))) {
        throw NotGroup{here +
                       ": expected the dataclass's class, NEWOBJ () and BUILD of its "
                       "fields"};
      }
      if (!o.ops.empty()) given = StrDict(o.ops[0].second[0], here + " state");
    }
    nlohmann::json fields = nlohmann::json::object();
    for (const auto& [field, value] : given) {
      if (!Has(row->fields, field)) {
        throw NotGroup{here + ": field " + Quote(field) + " is not one of tsar's table"};
      }
      fields[field] = Typed(value, level + 1, where);
    }
    for (std::string_view field : row->fields) {
      if (!Holds(given, field)) {
        throw NotGroup{here + ": field " + Quote(std::string(field)) + " is missing"};
      }
    }
    return nlohmann::json::array({"record", std::string(name), fields});
  }

  // A dict of str keys: (key, value node) in order (a repeated key keeps its
  // first position and takes the last value, as in Python).
  Pairs StrDict(uint32_t id, const std::string& what) {
    const Node& n = m_.At(id);
    if (n.kind != NodeKind::kDict || n.attrs >= 0) {
      throw NotGroup{what + ": expected a dict, found " + What(id)};
    }
    Pairs out;
    std::unordered_map<std::string, size_t> position;
    for (size_t k = 0; k + 1 < n.items.size(); k += 2) {
      if (KindOf(n.items[k]) != NodeKind::kString) {
        throw NotGroup{what + ": expected str keys, found " + What(n.items[k])};
      }
      const std::string& key = m_.At(n.items[k]).s;
      const auto [it, fresh] = position.emplace(key, out.size());
      if (fresh) {
        out.emplace_back(key, n.items[k + 1]);
      } else {
        out[it->second].second = n.items[k + 1];
      }
    }
    return out;
  }
  static bool Holds(const Pairs& pairs, std::string_view key) {
    return std::any_of(pairs.begin(), pairs.end(), [&](const auto& p) { return p.first == key; });
  }

  // The group of object `id` (a REDUCE of _rebuild_from_type_v2), whose
  // opaque value is `v`; the class is `row`.
  Group Read(const Object& o, const torchao::Class& row, const Value& v) {
    const std::vector<uint32_t>& a = Items(o.args);  // func, new_type, args, state
    if (!IsGlobal(a[0], "torch._utils", "_rebuild_wrapper_subclass")) {
      throw NotGroup{"rebuilt by " + Name(a[0]) + ", not torch._utils._rebuild_wrapper_subclass"};
    }
    // (cls, dtype, size, stride, storage_offset, layout, device, requires_grad)
    if (KindOf(a[2]) != NodeKind::kTuple || Items(a[2]).size() != 8) {
      throw NotGroup{"expected the 8 arguments of _rebuild_wrapper_subclass"};
    }
    const std::vector<uint32_t>& w = Items(a[2]);
    if (w[0] != a[1] && !(KindOf(w[0]) == NodeKind::kGlobal && m_.At(w[0]).s == m_.At(a[1]).s)) {
      throw NotGroup{"the wrapper's class is " + Name(w[0])};
    }
    Group g;
    g.cls = std::string(row.name);
    std::string_view dm, dn;
    if (!Global(w[1], &dm, &dn) || dm != "torch" || !torchao::IsTorchDTypeName(dn) ||
        !torchao::DTypeOfName(dn)) {
      throw NotGroup{"outer dtype: expected a torch dtype tsar has a code for, found " +
                     Name(w[1])};
    }
    g.dtype = std::string(dn);
    g.sizes = Dims(w[2], "outer sizes");
    g.strides = Dims(w[3], "outer strides");
    if (g.sizes.size() != g.strides.size()) {
      throw NotGroup{"outer sizes and strides of different ranks"};
    }
    if (KindOf(w[4]) != NodeKind::kInt || m_.At(w[4]).i != 0) {
      throw NotGroup{"outer storage offset: expected 0"};
    }
    const Object* layout = Made(w[5], op::kReduce);
    const bool strided =
        IsGlobal(w[5], "torch", "strided") ||
        (layout != nullptr && layout->ops.empty() &&
         IsGlobal(layout->callable, "torch.serialization", "_get_layout") &&
         Items(layout->args).size() == 1 && KindOf(Items(layout->args)[0]) == NodeKind::kString &&
         m_.At(Items(layout->args)[0]).s == "torch.strided");
    if (!strided) throw NotGroup{"layout: expected torch.strided"};
    if (KindOf(w[7]) != NodeKind::kBool) throw NotGroup{"requires_grad: expected a bool"};

    const auto state = StrDict(a[3], "state");
    nlohmann::json attributes = nlohmann::json::object();
    std::unordered_map<std::string, uint32_t> tensors;  // member: its tensor node
    for (const auto& [key, value] : state) {
      if (key == "_is_param" && KindOf(value) == NodeKind::kBool) continue;  // a Parameter
      if (row.TakesTensor(key)) {
        if (KindOf(value) == NodeKind::kTensor) {
          tensors[key] = value;
        } else if (!(KindOf(value) == NodeKind::kNone && Has(row.optional_tensors, key))) {
          throw NotGroup{"inner tensor " + Quote(key) + ": expected a plain tensor, found " +
                         What(value)};
        }
        continue;
      }
      if (row.TakesAttribute(key) && key != "dtype" && key != "shape") {
        attributes[key] = Typed(value, 1, "attribute " + Quote(key));
        continue;
      }
      throw NotGroup{"holds " + Quote(key) + ", which tsar's table of " + g.cls + " does not list"};
    }
    for (std::string_view t : row.tensors) {
      if (!tensors.count(std::string(t))) {
        throw NotGroup{"inner tensor " + Quote(std::string(t)) + " is missing"};
      }
    }
    for (std::string_view k : row.attributes) {
      if (k != "dtype" && k != "shape" && !attributes.contains(std::string(k))) {
        throw NotGroup{"attribute " + Quote(std::string(k)) + " is missing"};
      }
    }
    if (row.TakesAttribute("dtype"))
      attributes["dtype"] = nlohmann::json::array({"dtype", g.dtype});
    if (row.TakesAttribute("shape")) attributes["shape"] = nlohmann::json::array({"size", g.sizes});

    std::vector<std::string> members;
    for (const auto* names : {&row.tensors, &row.optional_tensors}) {
      for (std::string_view name : *names) {
        auto it = tensors.find(std::string(name));
        if (it == tensors.end()) continue;
        const uint32_t object = m_.tensors_[m_.At(it->second).i].object;
        size_t item = 0;
        while (item < v.items.size() && !(v.items[item].kind == Value::Kind::kTensor &&
                                          v.items[item].tensor.object == object)) {
          ++item;
        }
        if (item == v.items.size()) throw NotGroup{"inner tensor " + Quote(it->first) + " lost"};
        g.members.emplace_back(it->first, item);
        members.push_back(it->first);
      }
    }
    try {
      g.description = torchao::DescriptionText({std::string(torchao::kLibrary),
                                                std::string(torchao::kUnknownVersion), g.cls,
                                                std::move(members), std::move(attributes)});
    } catch (const std::exception& e) {  // not expected: the values are JSON's
      throw NotGroup{std::string("description: ") + e.what()};
    }
    return g;
  }

 private:
  Machine& m_;
};

void Machine::TorchaoGroup(uint32_t id, Value& v) {
  const Object& o = objects_[At(id).i];
  TorchaoReader r(*this);
  if (o.how != op::kReduce || !o.ops.empty() ||
      !r.IsGlobal(o.callable, "torch._tensor", "_rebuild_from_type_v2")) {
    return;
  }
  const std::vector<uint32_t>& a = r.Items(o.args);
  std::string_view module, name;
  if (a.size() != 4 || !r.Global(a[1], &module, &name)) return;
  // Only torchao's classes are its business; any other subclass stays as it was.
  if (module != "torchao" && module.substr(0, 8) != "torchao.") return;
  const torchao::Class* row = torchao::FindClass(name);
  try {
    if (row == nullptr || row->module != module) {
      throw NotGroup{"class " + std::string(module) + "." + std::string(name) +
                     " is not in tsar's table of torchao classes (" + torchao::ClassNames() + ")"};
    }
    v.group = std::make_shared<const Group>(r.Read(o, *row, v));
  } catch (const NotGroup& e) {
    v.not_group = "a torchao " + std::string(name) + ": " + e.why;
  }
}

}  // namespace tsar::pickle::detail
