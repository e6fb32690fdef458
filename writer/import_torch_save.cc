// The importer of Python torch.save zip files, without LibTorch: the zip is
// read with minizip (writer/zip_reader.h), data.pkl with our restricted
// pickle reader (writer/pickle.h), which never executes anything. A
// torchao quantized tensor in a state_dict becomes a tensor group (spec
// §4.13) where the reader's table knows its class (writer/torchao_table.h).
#include <nlohmann/json.hpp>
#include <unordered_map>
#include <unordered_set>

#include "format/endian.h"
#include "format/reader.h"
#include "format/spec.h"
#include "writer/importer.h"
#include "writer/json_util.h"
#include "writer/pickle.h"
#include "writer/torchao_table.h"
#include "writer/zip_reader.h"

namespace tsar::importer {
namespace {

[[noreturn]] void Bad(const std::string& path, std::optional<uint64_t> offset,
                      const std::string& msg) {
  throw Error(ErrorCode::kBadInput, path, offset, msg);
}

// data.pkl holds the structure only (tensor bytes are records of their own):
// a few bytes per tensor name and shape, tens of MB for 100,000 tensors. A
// larger one is refused before it is inflated.
constexpr uint64_t kMaxDataPkl = uint64_t{256} << 20;

struct Walker {
  const std::string& path;
  const ImportOptions& options;
  const pickle::Result& pk;
  const std::vector<std::shared_ptr<const writer::Storage>>& storages;
  Imported& out;

  writer::TensorRef Tensor(const pickle::Value& v, const std::string& name) const {
    const pickle::TensorRef& t = v.tensor;
    const pickle::StorageRef& s = pk.storages[t.storage];
    const DType dt = *DTypeFromName(s.dtype);  // checked when the storage was mapped
    writer::TensorRef out = MakeView(storages[t.storage], dt, t.sizes, t.strides, t.storage_offset,
                                     "tensor " + format::Quote(name), path);
    if (t.requires_grad) {
      if (!format::DTypeCodeMayRequireGrad(static_cast<uint16_t>(dt))) {  // as spec R77
        Bad(path, std::nullopt,
            "tensor " + format::Quote(name) +
                ": requires_grad: expected a floating-point or "
                "complex dtype, found " +
                std::string(DTypeName(dt)) + " (torch.load refuses this tensor too)");
      }
      out.requires_grad = true;
    }
    return out;
  }

  // A state_dict: a non-empty dict of tensors and torchao tensors (tensor
  // groups, spec §4.13) with str keys. It becomes an entry; every other
  // tensor goes to the entry of loose tensors.
  static bool IsTensorDict(const pickle::Value& v) {
    if (v.kind != pickle::Value::Kind::kDict || v.items.empty()) return false;
    for (size_t k = 0; k < v.items.size(); ++k) {
      if ((v.items[k].kind != pickle::Value::Kind::kTensor && !v.items[k].group) ||
          v.key_values[k].kind != pickle::Value::Kind::kString)
        return false;
    }
    return true;
  }

  static std::string Join(const std::string& where, const std::string& key) {
    return where.empty() ? key : where + "." + key;
  }
  // `base`, or base#2, base#3... whichever `taken` does not hold yet.
  static std::string Unique(std::unordered_set<std::string>& taken, const std::string& base) {
    std::string name = base;
    for (int n = 2; !taken.insert(name).second; ++n) name = base + "#" + std::to_string(n);
    return name;
  }

  // Names every state_dict's entry by its path (the root's: the default
  // entry), in the order Build meets them, and then the loose entry.
  void NameEntries(const pickle::Value& v, const std::string& where) {
    using K = pickle::Value::Kind;
    if (IsTensorDict(v)) {
      entry_names[&v] = Unique(taken, where.empty() ? options.default_entry : where);
      return;
    }
    if (v.kind == K::kDict) {
      for (size_t k = 0; k < v.items.size(); ++k) NameEntries(v.items[k], Join(where, v.keys[k]));
    } else if (v.kind == K::kList || v.kind == K::kTuple || v.kind == K::kOpaque) {
      for (size_t k = 0; k < v.items.size(); ++k)
        NameEntries(v.items[k], Join(where, std::to_string(k)));
    }
  }

  // A tensor outside a state_dict goes to the loose entry, named by its path,
  // unless the same tensor object was met before: then the tree names that one.
  Value Loose(const pickle::Value& v, const std::string& where) {
    if (auto it = placed.find(v.tensor.object); it != placed.end())
      return Value::Tensor(it->second.first, it->second.second);
    const std::string name = Unique(loose_taken, where.empty() ? "tensor" : where);
    placed.emplace(v.tensor.object, std::make_pair(loose.name, name));
    loose.tensors.push_back(
        {name, Tensor(v, name), v.tensor.is_parameter ? Role::kParameter : Role::kTensor});
    return Value::Tensor(loose.name, name);
  }

  // The tree of `v` (spec §4.10), adding its tensors to entries as it goes.
  Value Build(const pickle::Value& v, const std::string& where) {
    using K = pickle::Value::Kind;
    Value out_value;
    switch (v.kind) {
      case K::kNone:
        return Value::None();
      case K::kBool:
        return Value::Bool(v.b);
      case K::kInt:
        return Value::Int(v.i);
      case K::kBigInt:
        return Value::BigInt(v.str);
      case K::kFloat:
        return Value::Float(v.f);
      case K::kString:
        return Value::Str(v.str);
      case K::kBytes:
        return Value::Bytes(v.str);
      case K::kTensor:
        return Loose(v, where);
      case K::kList:
      case K::kTuple: {
        std::vector<Value> items;
        for (size_t k = 0; k < v.items.size(); ++k)
          items.push_back(Build(v.items[k], Join(where, std::to_string(k))));
        return v.kind == K::kList ? Value::List(std::move(items)) : Value::Tuple(std::move(items));
      }
      case K::kOpaque: {
        const std::string what =
            where.empty() ? std::string("the top object") : format::Quote(where);
        // A torchao tensor is a group only where an entry holds it (a tree
        // cannot name a group, spec §4.13.3); elsewhere, or when tsar's
        // table does not know it, it stays a fragment and its inner tensors
        // loose tensors, with a note.
        const std::string why =
            v.group ? "a torchao " + v.group->cls +
                          " is stored as a tensor group only in a state_dict (a dict of tensors)"
                    : v.not_group;
        if (options.strict) {
          Bad(path, std::nullopt,
              what + ": a " + v.str +
                  " object would be kept as an opaque pickle fragment, which --strict refuses" +
                  (why.empty() ? "" : " (" + why + ")"));
        }
        if (!why.empty()) {
          out.skipped.push_back(what +
                                ": kept as an opaque pickle fragment, its tensors loose, "
                                "not as a tensor group: " +
                                why);
        }
        std::vector<Value> items;
        for (size_t k = 0; k < v.items.size(); ++k)
          items.push_back(Build(v.items[k], Join(where, std::to_string(k))));
        return Value::Opaque(v.str, v.segments, std::move(items));
      }
      case K::kDict: {
        if (auto it = entry_names.find(&v); it != entry_names.end()) {
          Entry(it->second, v);
          out_value = Value::Entry(it->second, v.ordered);
        } else {
          std::vector<std::pair<Value, Value>> pairs;
          pairs.reserve(v.items.size());
          for (size_t k = 0; k < v.items.size(); ++k) {
            const std::string at = Join(where, v.keys[k]);
            Value key = Build(v.key_values[k], at);
            pairs.emplace_back(std::move(key), Build(v.items[k], at));
          }
          out_value = Value::Dict(std::move(pairs), v.ordered);
        }
        if (v.attributes) out_value.set_attributes(Build(*v.attributes, where));
        return out_value;
      }
    }
    return out_value;
  }

  void Entry(const std::string& name, const pickle::Value& dict) {
    Imported::Entry e{name, {}, {}};
    for (size_t i = 0; i < dict.items.size(); ++i) {
      const auto& t = dict.items[i];
      if (t.group) {
        e.groups.push_back(Group(dict.keys[i], t, e.tensors.size()));
        continue;
      }
      e.tensors.push_back({dict.keys[i], Tensor(t, dict.keys[i]),
                           t.tensor.is_parameter ? Role::kParameter : Role::kTensor});
      placed.emplace(t.tensor.object, std::make_pair(name, dict.keys[i]));
    }
    out.entries.push_back(std::move(e));
    if (const pickle::Value* md = dict.Attribute("_metadata")) {
      // Python's state_dict._metadata (per-module versions, read by
      // load_state_dict), kept as JSON: the implied tree (spec §4.10.3)
      // restores it when the archive has no tree of its own.
      out.metadata.push_back({name, "torch._metadata", ToJson(*md).dump()});
    }
  }

  // The tensor group (spec §4.13) of torchao tensor `v` (a kOpaque value
  // with a group), named `name` in its entry, before tensors[before]: its
  // members are the value's items, named "<name>.<member>".
  Imported::Group Group(const std::string& name, const pickle::Value& v, size_t before) const {
    const pickle::Group& g = *v.group;
    Imported::Group out{name, {}, before};
    out.group.layout = format::SparseLayout::kGroup;
    out.group.dtype = *torchao::DTypeOfName(g.dtype);  // the reader took only such a dtype
    out.group.sizes = g.sizes;
    out.group.strides = g.strides;
    out.group.description = g.description;
    for (const auto& [member, item] : g.members) {
      out.group.components.emplace_back("." + member, Tensor(v.items[item], name + "." + member));
    }
    return out;
  }

  static nlohmann::ordered_json ToJson(const pickle::Value& v) {
    using K = pickle::Value::Kind;
    switch (v.kind) {
      case K::kBool:
        return v.b;
      case K::kInt:
        return v.i;
      case K::kFloat:
        return v.f;
      case K::kString:
        return v.str;
      case K::kDict: {
        nlohmann::ordered_json j = nlohmann::ordered_json::object();
        for (size_t i = 0; i < v.items.size(); ++i) json::Append(j, v.keys[i], ToJson(v.items[i]));
        return j;
      }
      case K::kList:
      case K::kTuple: {
        nlohmann::ordered_json j = nlohmann::ordered_json::array();
        for (const auto& x : v.items) j.push_back(ToJson(x));
        return j;
      }
      default:
        return nullptr;
    }
  }

  // Archive-level metadata for the top-level numbers, strings and bytes of a
  // dict: what the implied tree (spec §4.10.3) of an archive without a tree
  // gives back. (Whether it gives back exactly the input is for the caller to
  // check: with_tree() in pack_files.cc.)
  void RootMetadata(const pickle::Value& root) const {
    using K = pickle::Value::Kind;
    if (root.kind != K::kDict || IsTensorDict(root)) return;
    for (size_t i = 0; i < root.items.size(); ++i) {
      if (root.key_values[i].kind != K::kString) continue;
      const std::string& key = root.keys[i];
      const pickle::Value& v = root.items[i];
      if (v.kind == K::kInt) out.metadata.push_back({"", key, v.i});
      if (v.kind == K::kFloat) out.metadata.push_back({"", key, v.f});
      if (v.kind == K::kString) out.metadata.push_back({"", key, v.str});
      if (v.kind == K::kBytes) out.metadata.push_back({"", key, Bytes{v.str}});
    }
  }

  std::unordered_map<const pickle::Value*, std::string> entry_names;
  std::unordered_set<std::string> taken;  // entry names
  std::unordered_set<std::string> loose_taken;
  Imported::Entry loose;
  std::unordered_map<uint32_t, std::pair<std::string, std::string>> placed;  // object: entry, name
};

}  // namespace

Imported ImportTorchSave(const std::string& path, const ImportOptions& options) {
  const auto input = MappedInput::Open(path);
  const zip::Reader zip(input->data(), input->size(), path);
  return ImportTorchSave(path, input, zip, options);
}

Imported ImportTorchSave(const std::string& path, const std::shared_ptr<const MappedInput>& input,
                         const zip::Reader& zip, const ImportOptions& options) {
  const zip::Record* pkl_record = zip.Find(zip.prefix() + "data.pkl");
  if (!pkl_record) {
    Bad(path, std::nullopt,
        "expected a torch.save zip with a record " + zip.prefix() + "data.pkl, found none");
  }
  const std::string pkl = zip.Read(*pkl_record, kMaxDataPkl);
  const pickle::Result pk =
      pickle::Parse(reinterpret_cast<const uint8_t*>(pkl.data()), pkl.size(), path + ":data.pkl");

  std::vector<std::shared_ptr<const writer::Storage>> storages;
  for (const auto& s : pk.storages) {
    const auto dt = DTypeFromName(s.dtype);
    if (!dt)
      Bad(path, std::nullopt, "storage " + s.key + ": dtype " + s.dtype + " has no tsar code");
    uint64_t nbytes = 0;
    if (!format::CheckedMul(s.numel, ElementSize(*dt), &nbytes)) {
      throw Error(ErrorCode::kOverflow, path, std::nullopt,
                  "storage " + s.key + ": numel " + std::to_string(s.numel) + " overflows");
    }
    const std::string record = zip.prefix() + "data/" + s.key;
    const zip::Record* r = zip.Find(record);
    if (!r) {
      Bad(path, std::nullopt,
          "expected a record " + record + " for a storage named in data.pkl, found none");
    }
    storages.push_back(MappedInput::Storage(input, zip.StoredData(*r, nbytes), nbytes));
  }

  Imported out;
  out.kind = InputKind::kTorchSave;
  Walker w{path, options, pk, storages, out, {}, {}, {}, {}, {}};
  w.NameEntries(pk.root, "");
  w.loose.name = Walker::Unique(
      w.taken, w.taken.count(options.default_entry) ? "tensors" : options.default_entry);
  out.value = w.Build(pk.root, "");
  w.RootMetadata(pk.root);
  if (!w.loose.tensors.empty()) out.entries.insert(out.entries.begin(), std::move(w.loose));
  return out;
}

}  // namespace tsar::importer
