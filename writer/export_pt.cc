// Export to a Python torch.save zip (readable by torch.load): a protocol-2
// pickle written by hand (only the opcodes torch.save itself uses) plus one
// record per storage, through LibTorch's PyTorchStreamWriter. Shared storages
// stay shared: tensors that share a tsar storage reference one record.
#include <caffe2/serialize/inline_container.h>

#include <nlohmann/json.hpp>

#include "format/endian.h"
#include "format/reader.h"
#include "writer/atomic_file.h"
#include "writer/export_internal.h"
#include "writer/json_util.h"

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

class Pickler {
 public:
  void Proto() { out_ += "\x80\x02"; }
  void Stop() { out_ += '.'; }
  void Mark() { out_ += '('; }
  void Tuple() { out_ += 't'; }
  void EmptyTuple() { out_ += ')'; }
  void EmptyDict() { out_ += '}'; }
  void SetItems() { out_ += 'u'; }
  void Reduce() { out_ += 'R'; }
  void Build() { out_ += 'b'; }
  void PersId() { out_ += 'Q'; }
  void Global(const std::string& module, const std::string& name) {
    out_ += "c" + module + "\n" + name + "\n";
  }
  void Bool(bool b) { out_ += b ? '\x88' : '\x89'; }
  void None() { out_ += 'N'; }
  void Str(const std::string& s) {
    out_ += 'X';
    Raw32(static_cast<uint32_t>(s.size()));
    out_ += s;
  }
  void Bytes(
      const std::string& s) {  // protocol 3 opcode; Python's unpickler reads it in any protocol
    out_ += 'B';
    Raw32(static_cast<uint32_t>(s.size()));
    out_ += s;
  }
  void Int(int64_t v) {
    if (v >= INT32_MIN && v <= INT32_MAX) {
      out_ += 'J';
      Raw32(static_cast<uint32_t>(static_cast<int32_t>(v)));
      return;
    }
    out_ += '\x8a';  // LONG1: little-endian two's complement
    out_ += '\x08';
    uint8_t b[8];
    format::StoreU64(b, static_cast<uint64_t>(v));
    out_.append(reinterpret_cast<const char*>(b), 8);
  }
  void Float(double d) {  // BINFLOAT is big-endian
    out_ += 'G';
    const uint64_t bits = format::DoubleToBits(d);
    for (int i = 7; i >= 0; --i) out_ += static_cast<char>(bits >> (8 * i));
  }
  void OrderedDict() {
    Global("collections", "OrderedDict");
    EmptyTuple();
    Reduce();
  }
  void Json(const nlohmann::ordered_json& j, bool ordered_outer) {
    if (j.is_object()) {
      if (ordered_outer) {
        OrderedDict();
      } else {
        EmptyDict();
      }
      if (!j.empty()) {
        Mark();
        for (auto it = j.begin(); it != j.end(); ++it) {
          Str(it.key());
          Json(it.value(), false);
        }
        SetItems();
      }
    } else if (j.is_boolean()) {
      Bool(j.get<bool>());
    } else if (j.is_number_integer()) {
      Int(j.get<int64_t>());
    } else if (j.is_number()) {
      Float(j.get<double>());
    } else if (j.is_string()) {
      Str(j.get<std::string>());
    } else {
      None();
    }
  }
  const std::string& bytes() const { return out_; }

 private:
  void Raw32(uint32_t v) {
    uint8_t b[4];
    format::StoreU32(b, v);
    out_.append(reinterpret_cast<const char*>(b), 4);
  }
  std::string out_;
};

void Meta(Pickler& p, const MetadataValue& v) {
  if (const auto* s = std::get_if<std::string>(&v)) return p.Str(*s);
  if (const auto* i = std::get_if<int64_t>(&v)) return p.Int(*i);
  if (const auto* d = std::get_if<double>(&v)) return p.Float(*d);
  p.Bytes(std::get<tsar::Bytes>(v).data);
}

}  // namespace

std::vector<std::string> ExportTorchSave(const Archive& a, const std::string& path) {
  std::vector<std::string> notes;
  const auto infos = a.infos();
  const auto storages = a.storages();
  // One dtype per storage: Python's typed storages cannot mix them.
  std::vector<int> storage_dtype(storages.size(), -1);
  for (const auto& t : infos) {
    if (!StorageClass(t.dtype)) {
      throw Error(
          ErrorCode::kUnsupported, a.path(), std::nullopt,
          "tensor " + format::Quote(t.entry + "/" + t.name) + ": dtype " +
              std::string(DTypeName(t.dtype)) +
              " cannot be written for torch.load of LibTorch 1.13; export to .safetensors instead");
    }
    int& d = storage_dtype[t.storage];
    if (d >= 0 && d != static_cast<int>(t.dtype)) {
      throw Error(
          ErrorCode::kUnsupported, a.path(), std::nullopt,
          "tensor " + format::Quote(t.entry + "/" + t.name) + ": shares storage #" +
              std::to_string(t.storage) +
              " with a tensor of another dtype, which torch.save's typed storages cannot express");
    }
    d = static_cast<int>(t.dtype);
  }

  Pickler p;
  p.Proto();
  const auto entries = a.entries();
  const auto archive_meta = a.metadata_items();
  const bool single = entries.size() == 1 && archive_meta.empty();
  auto state_dict = [&](const std::string& entry) {
    p.OrderedDict();
    bool any = false;
    for (const auto& t : infos) {
      if (t.entry != entry) continue;
      if (!any) p.Mark();
      any = true;
      p.Str(t.name);
      const bool param = t.role == Role::kParameter;
      if (param) p.Global("torch._utils", "_rebuild_parameter");
      if (param) p.Mark();
      p.Global("torch._utils", "_rebuild_tensor_v2");
      p.Mark();
      {  // persistent id: ('storage', torch.XStorage, key, location, numel)
        p.Mark();
        p.Str("storage");
        p.Global("torch", StorageClass(t.dtype));
        p.Str(std::to_string(t.storage));
        p.Str("cpu");
        p.Int(static_cast<int64_t>(storages[t.storage].nbytes / ElementSize(t.dtype)));
        p.Tuple();
        p.PersId();
      }
      p.Int(static_cast<int64_t>(t.storage_offset));
      p.Mark();
      for (int64_t s : t.sizes) p.Int(s);
      p.Tuple();
      p.Mark();
      for (int64_t s : t.strides) p.Int(s);
      p.Tuple();
      p.Bool(t.requires_grad && !param);
      p.OrderedDict();  // backward_hooks
      p.Tuple();
      p.Reduce();
      if (param) {
        p.Bool(t.requires_grad);
        p.OrderedDict();
        p.Tuple();
        p.Reduce();
      }
    }
    if (any) p.SetItems();
    // state_dict._metadata, as Python's load_state_dict reads it.
    if (const auto md = a.metadata("torch._metadata", entry)) {
      if (const auto* s = std::get_if<std::string>(&*md)) {
        const auto parsed = json::ParseOrdered(*s);
        if (parsed && parsed->is_object()) {
          const nlohmann::ordered_json& j = *parsed;
          p.EmptyDict();
          p.Mark();
          p.Str("_metadata");
          p.Json(j, /*ordered_outer=*/true);
          p.SetItems();
          p.Build();
        }
      }
    }
    for (const auto& [k, v] : a.metadata_items(entry)) {
      if (k != "torch._metadata")
        notes.push_back("entry " + entry + " metadata " + k +
                        ": torch.save state_dicts have no place for it; left out");
    }
  };
  if (single) {
    state_dict(entries[0]);
  } else {
    p.EmptyDict();
    p.Mark();
    for (const auto& e : entries) {
      p.Str(e);
      state_dict(e);
    }
    for (const auto& [k, v] : archive_meta) {
      p.Str(k);
      Meta(p, v);
    }
    p.SetItems();
  }
  p.Stop();

  AtomicFile out(path);
  uint64_t pos = 0;
  caffe2::serialize::PyTorchStreamWriter writer([&](const void* buf, size_t n) -> size_t {
    out.WriteAt(pos, buf, n);
    pos += n;
    return n;
  });
  writer.writeRecord("data.pkl", p.bytes().data(), p.bytes().size());
  const auto* base = static_cast<const uint8_t*>(a.data());
  for (const auto& s : storages) {
    writer.writeRecord("data/" + std::to_string(s.id), base + s.offset, s.nbytes);
  }
  writer.writeEndOfFile();
  out.Publish(/*durable=*/true);
  return notes;
}

}  // namespace tsar::exporter
