// Importers for Python torch.save zip files (read with minizip,
// writer/zip_reader.h, and our restricted pickle reader, never executing
// anything) and TorchScript archives (torch::jit::load).
#include <torch/csrc/jit/serialization/import.h>

#include <nlohmann/json.hpp>

#include "format/endian.h"
#include "format/reader.h"
#include "format/spec.h"
#include "writer/importer.h"
#include "writer/json_util.h"
#include "writer/pickle.h"
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

// The first line of a c10::Error, without LibTorch's C++ backtrace.
std::string FirstLine(const std::exception& e) {
  std::string s = e.what();
  const size_t nl = s.find('\n');
  return nl == std::string::npos ? s : s.substr(0, nl);
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
  const zip::Reader zip(input->data(), input->size(), path);
  const zip::Record* pkl_record = zip.Find(zip.prefix() + "data.pkl");
  if (!pkl_record) {
    Bad(path, std::nullopt,
        "expected a torch.save zip with a record " + zip.prefix() + "data.pkl, found none");
  }
  const std::string pkl = zip.Read(*pkl_record, kMaxDataPkl);
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
