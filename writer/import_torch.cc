// Importers for Python torch.save zip files (read with LibTorch's
// PyTorchStreamReader and our restricted pickle reader, never executing
// anything) and TorchScript archives (torch::jit::load).
#include <caffe2/serialize/inline_container.h>
#include <torch/csrc/jit/serialization/import.h>

#include <nlohmann/json.hpp>

#include "format/endian.h"
#include "format/reader.h"
#include "format/spec.h"
#include "writer/importer.h"
#include "writer/pickle.h"

namespace tsar::importer {
namespace {

[[noreturn]] void Bad(const std::string& path, std::optional<uint64_t> offset,
                      const std::string& msg) {
  throw Error(ErrorCode::kBadInput, path, offset, msg);
}

// The first line of a c10::Error, without LibTorch's C++ backtrace.
std::string FirstLine(const std::exception& e) {
  std::string s = e.what();
  const size_t nl = s.find('\n');
  return nl == std::string::npos ? s : s.substr(0, nl);
}

// Checks the zip local file header in front of the record data at
// `data_offset` (which PyTorchStreamReader located): stored (not
// compressed), and exactly `nbytes` long. Returns nothing; throws kBadInput.
void CheckStoredRecord(const MappedInput& in, uint64_t data_offset, const std::string& key,
                       uint64_t nbytes) {
  const std::string suffix = "/data/" + key;
  const uint8_t* d = in.data();
  if (data_offset < 30 || data_offset > in.size()) {
    Bad(in.path(), data_offset, "record data/" + key + ": expected an offset inside the file");
  }
  // The header is 30 bytes + name + extra field (both < 64 KiB) before the data.
  const uint64_t max_back = 30 + 65535 + 65535;
  const uint64_t lowest = data_offset > max_back ? data_offset - max_back : 0;
  for (uint64_t p = data_offset - 30 + 1; p-- > lowest;) {
    if (d[p] != 'P' || d[p + 1] != 'K' || d[p + 2] != 3 || d[p + 3] != 4) continue;
    const uint16_t flags = format::LoadU16(d + p + 6);
    const uint16_t method = format::LoadU16(d + p + 8);
    uint64_t size = format::LoadU32(d + p + 22);
    const uint16_t name_len = format::LoadU16(d + p + 26);
    const uint16_t extra_len = format::LoadU16(d + p + 28);
    if (p + 30 + name_len + extra_len != data_offset) continue;
    const std::string name(reinterpret_cast<const char*>(d + p + 30), name_len);
    if (name.size() < suffix.size() ||
        name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0)
      break;
    if (method != 0)
      Bad(in.path(), p + 8,
          "record " + format::Quote(name) +
              ": expected stored (method 0), found compression method " + std::to_string(method));
    if (data_offset > in.size() || nbytes > in.size() - data_offset) {
      Bad(in.path(), data_offset,
          "record " + format::Quote(name) + ": expected " + std::to_string(nbytes) +
              " bytes inside the file, found the end of the file");
    }
    if (flags & 0x08) {
      // torch.save streams records, so the sizes follow the data in a data
      // descriptor: [PK 07 08] crc32, compressed size, uncompressed size
      // (4 bytes each, or 8 for zip64).
      uint64_t q = data_offset + nbytes;
      const uint64_t left = in.size() - q;
      if (left >= 4 && d[q] == 'P' && d[q + 1] == 'K' && d[q + 2] == 7 && d[q + 3] == 8) q += 4;
      const uint64_t rest = in.size() - q;
      const bool small = rest >= 12 && format::LoadU32(d + q + 4) == nbytes &&
                         format::LoadU32(d + q + 8) == nbytes;
      const bool big = rest >= 20 && format::LoadU64(d + q + 4) == nbytes &&
                       format::LoadU64(d + q + 12) == nbytes;
      if (!small && !big) {
        Bad(in.path(), data_offset + nbytes,
            "record " + format::Quote(name) + ": expected a data descriptor of " +
                std::to_string(nbytes) +
                " bytes (numel x element size from data.pkl) after the data, found none");
      }
      return;
    }
    if (size == 0xFFFFFFFFu) {  // zip64: the sizes are in extra field 0x0001
      for (uint64_t x = p + 30 + name_len; x + 4 <= data_offset;) {
        const uint16_t id = format::LoadU16(d + x), len = format::LoadU16(d + x + 2);
        if (x + 4 + len > data_offset) break;
        if (id == 0x0001 && len >= 8) size = format::LoadU64(d + x + 4);
        x += 4 + len;
      }
    }
    if (size != nbytes) {
      Bad(in.path(), p + 22,
          "record " + format::Quote(name) + ": expected " + std::to_string(nbytes) +
              " bytes (numel x element size from data.pkl), found " + std::to_string(size));
    }
    return;
  }
  Bad(in.path(), data_offset,
      "record data/" + key + ": expected a zip local header in front of its data, found none");
}

struct Walker {
  const std::string& path;
  const ImportOptions& options;
  const pickle::Result& pk;
  const std::vector<c10::Storage>& storages;
  Imported& out;

  at::Tensor Tensor(const pickle::Value& v, const std::string& name) const {
    const pickle::TensorRef& t = v.tensor;
    const pickle::StorageRef& s = pk.storages[t.storage];
    const DType dt = *DTypeFromName(s.dtype);  // checked when the storage was mapped
    at::Tensor out = MakeView(storages[t.storage], dt, t.sizes, t.strides, t.storage_offset,
                              "tensor " + format::Quote(name), path);
    if (t.requires_grad) {
      if (!format::DTypeCodeMayRequireGrad(static_cast<uint16_t>(dt))) {  // as spec R77
        Bad(path, std::nullopt,
            "tensor " + format::Quote(name) +
                ": requires_grad: expected a floating-point or "
                "complex dtype, found " +
                std::string(DTypeName(dt)) + " (torch.load refuses this tensor too)");
      }
      out.set_requires_grad(true);
    }
    return out;
  }

  static bool IsTensorDict(const pickle::Value& v) {
    if (v.kind != pickle::Value::Kind::kDict || v.items.empty()) return false;
    for (const auto& x : v.items) {
      if (x.kind != pickle::Value::Kind::kTensor) return false;
    }
    return true;
  }

  void Skip(const std::string& where, const std::string& what) const {
    if (options.strict)
      Bad(path, std::nullopt,
          where + ": expected a tensor, a dict of tensors, a number or a string, found " + what +
              " (drop --strict to skip it)");
    out.skipped.push_back(where + ": " + what + " skipped");
  }

  void Entry(const std::string& name, const pickle::Value& dict) const {
    Imported::Entry e{name, {}};
    for (size_t i = 0; i < dict.items.size(); ++i) {
      const auto& t = dict.items[i];
      e.tensors.push_back({dict.keys[i], Tensor(t, dict.keys[i]),
                           t.tensor.is_parameter ? Role::kParameter : Role::kTensor});
    }
    out.entries.push_back(std::move(e));
    if (const pickle::Value* md = dict.Attribute("_metadata")) {
      // Python's state_dict._metadata (per-module versions, read by
      // load_state_dict); kept as JSON so it can be restored on export.
      out.metadata.push_back({name, "torch._metadata", ToJson(*md).dump()});
    }
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
        for (size_t i = 0; i < v.items.size(); ++i) j[v.keys[i]] = ToJson(v.items[i]);
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

  // A dict that is not a state_dict: tensor dicts become entries, scalars
  // metadata, loose tensors go to the default entry, nested dicts recurse.
  void Mixed(const pickle::Value& dict, const std::string& prefix, Imported::Entry& loose) const {
    using K = pickle::Value::Kind;
    for (size_t i = 0; i < dict.items.size(); ++i) {
      const std::string key = prefix + dict.keys[i];
      const pickle::Value& v = dict.items[i];
      switch (v.kind) {
        case K::kTensor:
          loose.tensors.push_back(
              {key, Tensor(v, key), v.tensor.is_parameter ? Role::kParameter : Role::kTensor});
          break;
        case K::kDict:
          if (IsTensorDict(v)) {
            Entry(key, v);
          } else if (v.items.empty()) {
            Skip(key, "an empty dict");
          } else {
            Mixed(v, key + ".", loose);
          }
          break;
        case K::kInt:
          out.metadata.push_back({"", key, v.i});
          break;
        case K::kBool:
          out.metadata.push_back({"", key, int64_t{v.b ? 1 : 0}});
          break;
        case K::kFloat:
          out.metadata.push_back({"", key, v.f});
          break;
        case K::kString:
          out.metadata.push_back({"", key, v.str});
          break;
        case K::kBytes:
          out.metadata.push_back({"", key, Bytes{v.str}});
          break;
        case K::kNone:
          Skip(key, "None");
          break;
        case K::kList:
        case K::kTuple:
          Skip(key, "a list of " + std::to_string(v.items.size()) + " items");
          break;
      }
    }
  }
};

}  // namespace

Imported ImportTorchSave(const std::string& path, const ImportOptions& options) {
  const auto input = MappedInput::Open(path);
  std::unique_ptr<caffe2::serialize::PyTorchStreamReader> reader;
  std::string pkl;
  try {
    reader = std::make_unique<caffe2::serialize::PyTorchStreamReader>(path);
    if (!reader->hasRecord("data.pkl"))
      Bad(path, std::nullopt, "expected a torch.save zip with a data.pkl record, found none");
    auto [ptr, n] = reader->getRecord("data.pkl");
    pkl.assign(static_cast<const char*>(ptr.get()), n);
  } catch (const c10::Error& e) {
    Bad(path, std::nullopt, "not a readable torch.save zip file: " + FirstLine(e));
  }
  const pickle::Result pk =
      pickle::Parse(reinterpret_cast<const uint8_t*>(pkl.data()), pkl.size(), path + ":data.pkl");

  std::vector<c10::Storage> storages;
  for (const auto& s : pk.storages) {
    const auto dt = DTypeFromName(s.dtype);
    if (!dt)
      Bad(path, std::nullopt, "storage " + s.key + ": dtype " + s.dtype + " has no tsar code");
    uint64_t nbytes = 0;
    if (!format::CheckedMul(s.numel, ElementSize(*dt), &nbytes)) {
      throw Error(ErrorCode::kOverflow, path, std::nullopt,
                  "storage " + s.key + ": numel " + std::to_string(s.numel) + " overflows");
    }
    const std::string record = "data/" + s.key;
    uint64_t offset = 0;
    try {
      if (!reader->hasRecord(record))
        Bad(path, std::nullopt,
            "expected a record " + record + " for a storage named in data.pkl, found none");
      offset = reader->getRecordOffset(record);
    } catch (const c10::Error& e) {
      Bad(path, std::nullopt, "record " + record + ": " + FirstLine(e));
    }
    CheckStoredRecord(*input, offset, s.key, nbytes);
    storages.push_back(MappedInput::Storage(input, offset, nbytes));
  }

  Imported out;
  out.kind = InputKind::kTorchSave;
  Walker w{path, options, pk, storages, out};
  using K = pickle::Value::Kind;
  const pickle::Value& root = pk.root;
  if (root.kind == K::kDict && Walker::IsTensorDict(root)) {
    w.Entry(options.default_entry, root);
  } else if (root.kind == K::kDict) {
    Imported::Entry loose{options.default_entry, {}};
    w.Mixed(root, "", loose);
    if (!loose.tensors.empty()) {
      for (const auto& e : out.entries) {
        if (e.name == loose.name)
          Bad(path, std::nullopt,
              "entry " + format::Quote(loose.name) + ": loose tensors and a dict share this name");
      }
      out.entries.insert(out.entries.begin(), std::move(loose));
    }
  } else if (root.kind == K::kTensor) {
    out.entries.push_back(
        {options.default_entry, {{"tensor", w.Tensor(root, "tensor"), Role::kTensor}}});
  } else if ((root.kind == K::kList || root.kind == K::kTuple) && !root.items.empty()) {
    Imported::Entry e{options.default_entry, {}};
    for (size_t i = 0; i < root.items.size(); ++i) {
      if (root.items[i].kind != K::kTensor)
        Bad(path, std::nullopt,
            "item " + std::to_string(i) + ": expected a tensor in a list of tensors");
      e.tensors.push_back(
          {std::to_string(i), w.Tensor(root.items[i], std::to_string(i)), Role::kTensor});
    }
    out.entries.push_back(std::move(e));
  } else {
    Bad(path, std::nullopt,
        "expected a state_dict, a dict of state_dicts or tensors at the top of data.pkl, found no "
        "tensors");
  }
  if (out.entries.empty()) Bad(path, std::nullopt, "expected at least one tensor, found none");
  return out;
}

Imported ImportTorchScript(const std::string& path, const ImportOptions& options) {
  torch::jit::Module m;
  try {
    m = torch::jit::load(path, c10::Device(c10::kCPU));
  } catch (const c10::Error& e) {
    Bad(path, std::nullopt, "not a loadable TorchScript archive: " + FirstLine(e));
  }
  Imported out;
  out.kind = InputKind::kTorchScript;
  Imported::Entry e{options.default_entry, {}};
  // state_dict() order: per module its parameters, its buffers, then children.
  std::function<void(const torch::jit::Module&, const std::string&)> walk =
      [&](const torch::jit::Module& mod, const std::string& prefix) {
        for (const auto& p : mod.named_parameters(false))
          e.tensors.push_back({prefix + p.name, p.value, Role::kParameter});
        for (const auto& b : mod.named_buffers(false))
          e.tensors.push_back({prefix + b.name, b.value, Role::kBuffer});
        for (const auto& c : mod.named_children()) walk(c.value, prefix + c.name + ".");
      };
  walk(m, "");
  if (e.tensors.empty())
    Bad(path, std::nullopt, "expected parameters or buffers in the TorchScript module, found none");
  out.entries.push_back(std::move(e));
  return out;
}

}  // namespace tsar::importer
