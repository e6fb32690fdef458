// Export to a Python torch.save zip (readable by torch.load): the archive's
// value tree (spec §4.10) as a protocol-2 pickle written by hand, plus one
// record per storage, through LibTorch's PyTorchStreamWriter. Shared storages
// stay shared: tensors that share a tsar storage reference one record.
#include <caffe2/serialize/inline_container.h>

#include <unordered_map>

#include "format/reader.h"
#include "tsar/value.h"
#include "writer/atomic_file.h"
#include "writer/export_internal.h"
#include "writer/pickler.h"

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

// Writes an archive's value tree (spec §4.10; the implied tree of §4.10.3 for
// an archive without one) as the pickle torch.load reads: each tensor as
// torch.save writes it, once (a second reference is a memo lookup, so it is
// the same Python object again); each opaque value's segments as they are.
class TreeWriter {
 public:
  TreeWriter(const ArchiveFile& a, const std::vector<TensorInfo>& infos,
             const std::vector<StorageInfo>& storages, pickle::Pickler& p)
      : a_(a), p_(p), infos_(infos), storages_(storages) {
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
          if (!any) p_.Mark();
          any = true;
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

  std::string pkl;
  pickle::Pickler p(&pkl);
  p.Proto();
  TreeWriter tree(a, infos, storages, p);
  tree.Write(root);
  p.Stop();
  for (const auto& name : tree.Unwritten())
    notes.push_back("tensor " + name + ": not part of the archive's value tree; left out");
  for (const auto& e : a.entries()) {
    for (const auto& [k, v] : a.metadata_items(e)) {
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
