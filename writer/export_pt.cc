// Export to a Python torch.save zip (readable by torch.load): the archive's
// value tree (spec §4.10) as a protocol-2 pickle written by hand, plus one
// record per storage, through LibTorch's PyTorchStreamWriter. Shared storages
// stay shared: tensors that share a tsar storage reference one record.
#include <caffe2/serialize/inline_container.h>

#include <algorithm>
#include <unordered_map>
#include <unordered_set>

#include "format/reader.h"
#include "format/spec.h"
#include "tsar/value.h"
#include "writer/atomic_file.h"
#include "writer/export_internal.h"
#include "writer/pickler.h"
#include "writer/torchao_table.h"

namespace tsar::exporter {
namespace {

// The torch.<X>Storage class for a dtype (the typed storages torch.load knows).
const char* StorageClass(DType dt) {
  switch (dt) {
    case DType::kBool:
      return "BoolStorage";
    case DType::kUInt8:
      return "ByteStorage";
    case DType::kInt8:
      return "CharStorage";
    case DType::kInt16:
      return "ShortStorage";
    case DType::kInt32:
      return "IntStorage";
    case DType::kInt64:
      return "LongStorage";
    case DType::kFloat16:
      return "HalfStorage";
    case DType::kBFloat16:
      return "BFloat16Storage";
    case DType::kFloat32:
      return "FloatStorage";
    case DType::kFloat64:
      return "DoubleStorage";
    case DType::kComplex64:
      return "ComplexFloatStorage";
    case DType::kComplex128:
      return "ComplexDoubleStorage";
    default:
      return nullptr;
  }
}

// A tensor group (spec §4.13) as torch.save pickles its torchao tensor:
// _rebuild_from_type_v2(_rebuild_wrapper_subclass, Class, (Class, dtype,
// sizes, strides, 0, torch.strided, cpu, False), state), where state is the
// instance's __dict__: every inner tensor of the class (None for an optional
// one the group lacks) and every attribute but `dtype` and `shape`, which
// the wrapper holds (what each class's __init__ sets, torchao 0.18).
struct GroupPlan {
  const GroupInfo* info;
  torchao::Description d;
  const torchao::Class* cls;
};

// Each group of `a` checked against tsar's table, by "entry\0first member";
// throws kUnsupported / kInvalidValue naming the group.
std::unordered_map<std::string, GroupPlan> PlanGroups(const ArchiveFile& a,
                                                      const std::vector<GroupInfo>& groups) {
  std::unordered_map<std::string, GroupPlan> out;
  for (const GroupInfo& g : groups) {
    torchao::Description d = torchao::ParseDescription(g.name, g.description);
    const std::string here = "group " + format::Quote(g.entry + "/" + g.name) + " (a " +
                             d.library + " " + d.cls + ", written by " + d.library + " " +
                             d.version + ")";
    const auto refuse = [&](ErrorCode code, const std::string& why) {
      return Error(code, a.path(), std::nullopt, here + ": " + why);
    };
    const torchao::Class* cls =
        d.library == torchao::kLibrary ? torchao::FindClass(d.cls) : nullptr;
    if (!cls) {
      throw refuse(ErrorCode::kUnsupported, "not in tsar's table of torchao classes (" +
                                                torchao::ClassNames() +
                                                "), so tsar cannot write it as torch.save does");
    }
    if (d.members.size() != g.members.size() || g.members.empty()) {
      throw refuse(ErrorCode::kInvalidValue,
                   "description: members: expected " + std::to_string(g.members.size()) +
                       " names, one per member tensor, found " + std::to_string(d.members.size()));
    }
    for (const std::string& m : d.members) {
      if (!cls->TakesTensor(m)) {
        throw refuse(ErrorCode::kInvalidValue,
                     "member " + format::Quote(m) + " is not an inner tensor of " + d.cls);
      }
    }
    for (const auto list : {&cls->tensors, &cls->attributes, &cls->optional_attributes}) {
      for (const std::string_view n : *list) {
        const std::string name(n);
        const bool tensor = list == &cls->tensors;
        const bool has = tensor ? std::find(d.members.begin(), d.members.end(), name) !=
                                      d.members.end()
                                : d.attributes.contains(name);
        if (has) continue;
        // An optional attribute left out: the value the class's __init__
        // stores without it.
        if (list == &cls->optional_attributes) {
          if (std::optional<nlohmann::json> v = cls->Default(n)) {
            d.attributes[name] = std::move(*v);
            continue;
          }
        }
        throw refuse(ErrorCode::kInvalidValue,
                     "lacks " + std::string(tensor ? "member " : "attribute ") +
                         format::Quote(name) + ", which " + d.cls + " holds");
      }
    }
    for (const auto& [k, v] : d.attributes.items()) {
      if (!cls->TakesAttribute(k)) {
        throw refuse(ErrorCode::kInvalidValue,
                     "attribute " + format::Quote(k) + " is not one " + d.cls + " takes");
      }
    }
    const std::string key = g.entry + '\0' + g.members[0];
    out.emplace(key, GroupPlan{&g, std::move(d), cls});
  }
  return out;
}

// Writes an archive's value tree (spec §4.10; the implied tree of §4.10.3 for
// an archive without one) as the pickle torch.load reads: each tensor as
// torch.save writes it, once (a second reference is a memo lookup, so it is
// the same Python object again); each opaque value's segments as they are.
class TreeWriter {
 public:
  TreeWriter(const ArchiveFile& a, const std::vector<TensorInfo>& infos,
             const std::vector<StorageInfo>& storages,
             const std::unordered_map<std::string, GroupPlan>& groups, pickle::Pickler& p)
      : a_(a), p_(p), infos_(infos), storages_(storages), groups_(groups) {
    for (const auto& [key, g] : groups) {
      for (const auto& m : g.info->members) members_.insert(g.info->entry + '\0' + m);
    }
    for (uint32_t i = 0; i < infos.size(); ++i) {
      const auto& t = infos[i];
      index_.emplace(t.entry + '\0' + t.name, i);
      by_entry_[t.entry].push_back(i);  // linear in tensors, however many entries
    }
  }

  void Write(const Value& v) {
    using K = Value::Kind;
    switch (v.kind()) {
      case K::kNone:
        return p_.None();
      case K::kBool:
        return p_.Bool(v.as_bool());
      case K::kInt:
        return p_.Int(v.as_int());
      case K::kBigInt:
        return p_.BigInt(v.bytes());
      case K::kFloat:
        return p_.Float(v.as_float());
      case K::kStr:
        return p_.Str(v.bytes());
      case K::kBytes:
        return p_.Bytes(v.bytes());
      case K::kList:
        p_.EmptyList();
        if (!v.items().empty()) {
          p_.Mark();
          for (const auto& x : v.items()) Write(x);
          p_.Appends();
        }
        return;
      case K::kTuple:
        p_.Mark();
        for (const auto& x : v.items()) Write(x);
        return p_.Tuple();
      case K::kDict:
        if (v.ordered()) {
          p_.OrderedDict();
        } else {
          p_.EmptyDict();
        }
        if (!v.pairs().empty()) {
          p_.Mark();
          for (const auto& [k, x] : v.pairs()) {
            Write(k);
            Write(x);
          }
          p_.SetItems();
        }
        break;
      case K::kTensor:
        return Tensor(v.entry(), v.name());
      case K::kEntry: {
        if (v.ordered()) {
          p_.OrderedDict();
        } else {
          p_.EmptyDict();
        }
        bool any = false;
        for (uint32_t i : by_entry_[v.entry()]) {
          const TensorInfo& t = infos_[i];
          const std::string key = t.entry + '\0' + t.name;
          // A group stands where its first member does, its members only in it.
          const auto g = groups_.find(key);
          if (g == groups_.end() && members_.count(key)) continue;
          if (!any) p_.Mark();
          any = true;
          if (g != groups_.end()) {
            p_.Str(g->second.info->name);
            Group(g->second);
            continue;
          }
          p_.Str(t.name);
          Tensor(t.entry, t.name);
        }
        if (any) p_.SetItems();
        break;
      }
      case K::kOpaque:
        for (size_t k = 0; k < v.segments().size(); ++k) {
          p_.Raw(v.segments()[k]);
          if (k < v.items().size()) Write(v.items()[k]);
        }
        return;
    }
    if (const Value* attrs = v.attributes()) {  // dict and entry
      Write(*attrs);
      p_.Build();
    }
  }

  // Tensors of the archive that the tree does not reach.
  std::vector<std::string> Unwritten() const {
    std::vector<std::string> out;
    for (const auto& t : infos_) {
      if (t.role != Role::kSparseComponent && !memo_.count(t.entry + '\0' + t.name))
        out.push_back(t.entry + "/" + t.name);
    }
    return out;
  }

 private:
  void Group(const GroupPlan& g) {
    const std::string module(g.cls->module), cls(g.cls->name);
    p_.Global("torch._tensor", "_rebuild_from_type_v2");
    p_.Mark();
    p_.Global("torch._utils", "_rebuild_wrapper_subclass");
    p_.Global(module, cls);
    p_.Mark();
    {
      p_.Global(module, cls);
      p_.Global("torch", std::string(DTypeName(g.info->dtype)));
      p_.Mark();
      for (int64_t s : g.info->sizes) p_.Int(s);
      p_.Tuple();
      p_.Mark();
      for (int64_t s : g.info->strides) p_.Int(s);
      p_.Tuple();
      p_.Int(0);
      p_.Global("torch.serialization", "_get_layout");
      p_.Mark();
      p_.Str("torch.strided");
      p_.Tuple();
      p_.Reduce();
      p_.Global("torch", "device");
      p_.Mark();
      p_.Str("cpu");
      p_.Tuple();
      p_.Reduce();
      p_.Bool(false);
    }
    p_.Tuple();
    p_.EmptyDict();
    p_.Mark();
    for (const auto list : {&g.cls->tensors, &g.cls->optional_tensors}) {
      for (const std::string_view n : *list) {
        p_.Str(std::string(n));
        const auto at = std::find(g.d.members.begin(), g.d.members.end(), n);
        if (at == g.d.members.end()) {
          p_.None();
        } else {
          Tensor(g.info->entry, g.info->members[at - g.d.members.begin()]);
        }
      }
    }
    for (const auto list : {&g.cls->attributes, &g.cls->optional_attributes}) {
      for (const std::string_view n : *list) {
        if (n == "dtype" || n == "shape") continue;  // the wrapper's
        const std::string name(n);
        p_.Str(name);
        Attribute(g.d.attributes[name], g.info->name, "attribute " + format::Quote(name));
      }
    }
    p_.SetItems();
    p_.Tuple();
    p_.Reduce();
  }

  // A typed value (spec §4.13.2, checked by ParseDescription) as the Python
  // object torch.save pickles: its enums and records only through tsar's
  // table.
  void Attribute(const nlohmann::json& v, const std::string& group, const std::string& where) {
    const auto fail = [&](const std::string& why) {
      throw Error(ErrorCode::kInvalidValue, a_.path(), std::nullopt,
                  "group " + format::Quote(group) + ": " + where + ": " + why);
    };
    if (v.is_null()) return p_.None();
    if (v.is_boolean()) return p_.Bool(v.get<bool>());
    if (v.is_number_integer()) return p_.Int(v.get<int64_t>());
    if (v.is_string()) return p_.Str(v.get<std::string>());
    const std::string& tag = v[0].get_ref<const std::string&>();
    if (tag == "float") return p_.Float(*torchao::ParseFloatHex(v[1].get<std::string>()));
    if (tag == "list") {
      p_.EmptyList();
      if (v[1].empty()) return;
      p_.Mark();
      for (const auto& x : v[1]) Attribute(x, group, where);
      return p_.Appends();
    }
    if (tag == "tuple") {
      p_.Mark();
      for (const auto& x : v[1]) Attribute(x, group, where);
      return p_.Tuple();
    }
    if (tag == "size") {  // torch.Size(tuple): its __reduce__
      p_.Global("torch", "Size");
      p_.Mark();
      p_.Mark();
      for (const auto& x : v[1]) p_.Int(x.get<int64_t>());
      p_.Tuple();
      p_.Tuple();
      return p_.Reduce();
    }
    if (tag == "dtype") {
      const std::string& name = v[1].get_ref<const std::string&>();
      if (!torchao::IsTorchDTypeName(name)) fail("dtype " + format::Quote(name) + " is not torch's");
      return p_.Global("torch", name);
    }
    const std::string& type = v[1].get_ref<const std::string&>();
    if (tag == "enum") {  // getattr(Enum, "MEMBER"), as pickle writes an enum
      const torchao::Named* e = torchao::FindEnum(type);
      if (!e) fail("enum " + format::Quote(type) + " is not one of tsar's torchao table");
      p_.Global("__builtin__", "getattr");
      p_.Mark();
      p_.Global(std::string(e->module), type);
      p_.Str(v[2].get<std::string>());
      p_.Tuple();
      return p_.Reduce();
    }
    const torchao::Named* r = torchao::FindRecord(type);  // "record"
    if (!r) fail("record " + format::Quote(type) + " is not one of tsar's torchao table");
    const nlohmann::json& fields = v[2];
    bool exact = fields.size() == r->fields.size();
    for (const std::string_view f : r->fields) exact = exact && fields.contains(std::string(f));
    if (!exact) {
      std::string want;
      for (const std::string_view f : r->fields) want += (want.empty() ? "" : ", ") + std::string(f);
      fail("record " + type + ": expected the fields " + want + ", found " + fields.dump());
    }
    constexpr uint8_t kNewObj = 0x81;
    p_.Global(std::string(r->module), type);
    if (r->named_tuple) {  // cls.__new__(cls, *fields)
      p_.Mark();
      for (const std::string_view f : r->fields)
        Attribute(fields[std::string(f)], group, where + "." + std::string(f));
      p_.Tuple();
      return p_.Op(kNewObj);
    }
    // A dataclass: cls.__new__(cls), then its __dict__.
    p_.EmptyTuple();
    p_.Op(kNewObj);
    p_.EmptyDict();
    if (!r->fields.empty()) {
      p_.Mark();
      for (const std::string_view f : r->fields) {
        p_.Str(std::string(f));
        Attribute(fields[std::string(f)], group, where + "." + std::string(f));
      }
      p_.SetItems();
    }
    p_.Build();
  }

  void Tensor(const std::string& entry, const std::string& name) {
    const std::string key = entry + '\0' + name;
    if (auto it = memo_.find(key); it != memo_.end()) return p_.Get(it->second);
    const auto found = index_.find(key);
    if (found == index_.end()) {
      throw Error(ErrorCode::kNotFound, a_.path(), std::nullopt,
                  "value tree: tensor " + format::Quote(entry + "/" + name) + " not found");
    }
    const TensorInfo& t = infos_[found->second];
    const bool param = t.role == Role::kParameter;
    if (param) p_.Global("torch._utils", "_rebuild_parameter");
    if (param) p_.Mark();
    // A dtype without a typed storage class (float8, uint16-64, complex32) is
    // written as torch 2.x writes it: _rebuild_tensor_v3(..., dtype) over a
    // torch.storage.UntypedStorage counted in bytes.
    const bool v3 = StorageClass(t.dtype) == nullptr;
    p_.Global("torch._utils", v3 ? "_rebuild_tensor_v3" : "_rebuild_tensor_v2");
    p_.Mark();
    {  // persistent id: ('storage', torch.XStorage, key, location, numel)
      p_.Mark();
      p_.Str("storage");
      if (v3) {
        p_.Global("torch.storage", "UntypedStorage");
      } else {
        p_.Global("torch", StorageClass(t.dtype));
      }
      p_.Str(std::to_string(t.storage));
      p_.Str("cpu");
      p_.Int(static_cast<int64_t>(storages_[t.storage].nbytes / (v3 ? 1 : ElementSize(t.dtype))));
      p_.Tuple();
      p_.PersId();
    }
    p_.Int(static_cast<int64_t>(t.storage_offset));
    p_.Mark();
    for (int64_t s : t.sizes) p_.Int(s);
    p_.Tuple();
    p_.Mark();
    for (int64_t s : t.strides) p_.Int(s);
    p_.Tuple();
    p_.Bool(t.requires_grad && !param);
    p_.OrderedDict();  // backward_hooks
    if (v3) p_.Global("torch", std::string(DTypeName(t.dtype)));
    p_.Tuple();
    p_.Reduce();
    if (param) {
      p_.Bool(t.requires_grad);
      p_.OrderedDict();
      p_.Tuple();
      p_.Reduce();
    }
    const uint32_t id = next_memo_++;
    p_.Put(id);
    memo_.emplace(key, id);
  }

  const ArchiveFile& a_;
  pickle::Pickler& p_;
  const std::vector<TensorInfo>& infos_;
  const std::vector<StorageInfo>& storages_;
  std::unordered_map<std::string, uint32_t> index_;  // "entry\0name" -> infos_ index
  std::unordered_map<std::string, uint32_t> memo_;   // tensors written: memo key
  std::unordered_map<std::string, std::vector<uint32_t>> by_entry_;  // entry -> infos_ indices
  const std::unordered_map<std::string, GroupPlan>& groups_;  // by "entry\0first member"
  std::unordered_set<std::string> members_;                   // "entry\0name" of every member
  uint32_t next_memo_ = 0;
};

}  // namespace

std::vector<std::string> ExportTorchSave(const ArchiveFile& a, const std::string& path) {
  std::vector<std::string> notes;
  const auto infos = a.infos();
  const auto storages = a.storages();
  // One dtype per storage: Python's typed storages cannot mix them.
  std::vector<int> storage_dtype(storages.size(), -1);
  for (const auto& t : infos) {
    int& d = storage_dtype[t.storage];
    if (d >= 0 && d != static_cast<int>(t.dtype)) {
      throw Error(
          ErrorCode::kUnsupported, a.path(), std::nullopt,
          "tensor " + format::Quote(t.entry + "/" + t.name) + ": shares storage #" +
              std::to_string(t.storage) +
              " with a tensor of another dtype, which torch.save cannot express");
    }
    d = static_cast<int>(t.dtype);
  }

  // What to write: the stored tree; without one, the implied tree (spec
  // §4.10.3), but for a one-entry archive always that entry's state_dict, as
  // torch.save(state_dict) wrote it, so that load_state_dict(torch.load(x))
  // works whatever archive-level metadata (a safetensors file's "format",
  // tsar.save's metadata=) it holds. A checkpoint that is more than one
  // state_dict is packed with a tree (§4.9 rule 14).
  const bool stored_tree = a.has_value_tree();
  const bool one_state_dict = !stored_tree && a.entries().size() == 1;
  Value root = a.value();
  if (one_state_dict && root.is(Value::Kind::kDict)) {
    Value state_dict = root.pairs().front().second;  // rule 3's first pair: entry #0
    root = std::move(state_dict);
  }

  // Tensor groups: their torchao tensors, each where its first member stands.
  std::vector<GroupInfo> groups;
  for (const auto& e : a.entries()) {
    for (auto& g : a.groups(e)) groups.push_back(std::move(g));
  }
  const std::unordered_map<std::string, GroupPlan> plans = PlanGroups(a, groups);

  std::string pkl;
  pickle::Pickler p(&pkl);
  p.Proto();
  TreeWriter tree(a, infos, storages, plans, p);
  tree.Write(root);
  p.Stop();
  for (const auto& name : tree.Unwritten())
    notes.push_back("tensor " + name + ": not part of the archive's value tree; left out");
  for (const auto& e : a.entries()) {
    for (const auto& [k, v] : a.metadata_items(e)) {
      // A group's description: its torchao tensor says it.
      if (!groups.empty() && k.rfind(format::kGroupKeyPrefix, 0) == 0) continue;
      if (stored_tree || k != "torch._metadata")
        notes.push_back("entry " + e + " metadata " + k +
                        ": torch.save state_dicts have no place for it; left out");
    }
  }
  if (stored_tree) {
    for (const auto& [k, v] : a.metadata_items())
      notes.push_back("metadata " + k + ": not part of the packed checkpoint; left out");
  } else if (one_state_dict) {
    for (const auto& [k, v] : a.metadata_items())
      notes.push_back("metadata " + k +
                      ": a state_dict has no place for archive metadata; left out (tsar inspect "
                      "shows it)");
  }

  AtomicFile out(path);
  SequentialWriter sequential(out);  // the zip writer writes a record header at a time
  uint64_t pos = 0;
  caffe2::serialize::PyTorchStreamWriter writer([&](const void* buf, size_t n) -> size_t {
    sequential.Write(pos, buf, n);
    pos += n;
    return n;
  });
  writer.writeRecord("data.pkl", pkl.data(), pkl.size());
  for (const auto& s : storages) {  // a layer's base storages from the base file
    writer.writeRecord("data/" + std::to_string(s.id), a.storage_values(s.id), s.nbytes);
  }
  writer.writeEndOfFile();
  sequential.Flush();
  out.Publish(/*durable=*/true);
  return notes;
}

}  // namespace tsar::exporter
