// Export to safetensors: an 8-byte little-endian header length, a JSON header
// (padded with spaces to a multiple of 8, as the reference writer does), and
// each tensor's contiguous bytes in tensor order. safetensors forbids shared
// storage, so aliasing tensors are refused or, on request, copied apart.
#include <limits>
#include <map>
#include <unordered_set>
#include <nlohmann/json.hpp>

#include "format/endian.h"
#include "format/reader.h"
#include "format/spec.h"
#include "writer/atomic_file.h"
#include "writer/export_internal.h"
#include "writer/pieces.h"
#include "writer/torchao_safetensors.h"

namespace tsar::exporter {
namespace {

const char* Code(DType dt) {
  switch (dt) {
    case DType::kBool:
      return "BOOL";
    case DType::kUInt8:
      return "U8";
    case DType::kInt8:
      return "I8";
    case DType::kInt16:
      return "I16";
    case DType::kInt32:
      return "I32";
    case DType::kInt64:
      return "I64";
    case DType::kFloat16:
      return "F16";
    case DType::kBFloat16:
      return "BF16";
    case DType::kFloat32:
      return "F32";
    case DType::kFloat64:
      return "F64";
    case DType::kComplex64:
      return "C64";
    case DType::kFloat8E5M2:
      return "F8_E5M2";
    case DType::kFloat8E4M3FN:
      return "F8_E4M3";
    case DType::kUInt16:
      return "U16";
    case DType::kUInt32:
      return "U32";
    case DType::kUInt64:
      return "U64";
    case DType::kFloat8E4M3FNUZ:
      return "F8_E4M3FNUZ";
    case DType::kFloat8E5M2FNUZ:
      return "F8_E5M2FNUZ";
    case DType::kFloat8E8M0FNU:
      return "F8_E8M0";
    case DType::kFloat4E2M1FNx2:
      return "F4";
    default:
      return nullptr;
  }
}

}  // namespace

std::vector<std::string> ExportSafetensors(const ArchiveFile& a, const std::string& path,
                                           const ExportOptions& options) {
  AtomicFile out(path);  // first: a bad destination fails before any work
  std::vector<std::string> notes;
  const auto infos = a.infos();
  const FlatNames flat(a);
  std::map<uint32_t, std::vector<std::string>> users;
  for (const auto& t : infos) {
    users[t.storage].push_back(flat(t));
  }
  if (!options.materialize_shared) {
    std::string shared;
    for (const auto& [id, names] : users) {
      if (names.size() < 2) continue;
      std::string group;
      for (const auto& n : names) group += (group.empty() ? "" : ", ") + format::Quote(n);
      shared += (shared.empty() ? "" : "; ") + group;
    }
    if (!shared.empty()) {
      throw Error(ErrorCode::kInvalidArgument, a.path(), std::nullopt,
                  "safetensors forbids tensors that share storage, and these do: " + shared +
                      " (use --materialize-shared to write each as its own copy)");
    }
  }
  // Tensor groups (spec §4.13): torchao's layout (writer/torchao_safetensors.h),
  // each member under its torchao key, and the metadata torchao's reader needs.
  std::vector<std::string> keys;
  keys.reserve(infos.size());
  std::vector<std::pair<std::string, std::string>> torchao_meta;
  std::unordered_set<std::string> torchao_keys;
  bool groups = false;
  for (const auto& e : a.entries()) groups = groups || !a.groups(e).empty();
  if (groups) {
    if (a.entries().size() != 1) {
      throw Error(ErrorCode::kUnsupported, a.path(), std::nullopt,
                  "the archive holds tensor groups and " + std::to_string(a.entries().size()) +
                      " entries: safetensors in torchao's layout holds one model's state_dict; "
                      "pack each entry on its own (tsar pack ARCHIVE --only ENTRY)");
    }
    torchao::TorchaoLayout layout = torchao::TorchaoSafetensorsLayout(a, infos);
    for (const auto& item : layout.items) keys.push_back(item.key);
    torchao_meta = std::move(layout.metadata);
    for (const auto& [k, v] : torchao_meta) torchao_keys.insert(k);
    if (!a.metadata("format")) torchao_meta.emplace_back("format", "pt");
  } else {
    for (const auto& t : infos) keys.push_back(flat(t));
  }
  // JSON objects are written member by member, in archive order: an ordered
  // JSON object would look each key up by a linear scan (quadratic).
  std::string meta;
  for (const auto& [k, v] : a.metadata_items()) {
    if (torchao_keys.count(k)) {
      notes.push_back("metadata " + k + ": replaced by what torchao's layout of the tensor groups "
                      "writes under that key");
      continue;
    }
    std::string value;
    if (const auto* s = std::get_if<std::string>(&v)) {
      value = *s;
    } else if (const auto* i = std::get_if<int64_t>(&v)) {
      value = std::to_string(*i);
    } else if (const auto* d = std::get_if<double>(&v)) {
      char buf[40];
      std::snprintf(buf, sizeof buf, "%.17g", *d);
      value = buf;
    } else {
      notes.push_back("metadata " + k +
                      ": bytes values cannot be safetensors metadata (strings only); left out");
      continue;
    }
    meta +=
        (meta.empty() ? "" : ",") + nlohmann::json(k).dump() + ":" + nlohmann::json(value).dump();
  }
  for (const auto& [k, v] : torchao_meta) {
    meta += (meta.empty() ? "" : ",") + nlohmann::json(k).dump() + ":" + nlohmann::json(v).dump();
  }
  for (const auto& e : a.entries()) {
    for (const auto& [k, v] : a.metadata_items(e)) {
      // A group's description: what torchao's layout above says again.
      if (groups && k.rfind(format::kGroupKeyPrefix, 0) == 0) continue;
      notes.push_back("entry " + e + " metadata " + k +
                      ": safetensors has no per-entry metadata; left out");
    }
  }
  std::string json = "{";
  if (!meta.empty()) json += "\"__metadata__\":{" + meta + "}";
  uint64_t offset = 0;
  for (size_t i = 0; i < infos.size(); ++i) {
    const TensorInfo& t = infos[i];
    const char* code = Code(t.dtype);
    if (!code) {
      throw Error(ErrorCode::kUnsupported, a.path(), std::nullopt,
                  "tensor " + format::Quote(flat(t)) + ": safetensors has no dtype " +
                      std::string(DTypeName(t.dtype)));
    }
    const std::optional<uint64_t> n = ContiguousBytes(t);
    if (!n) {
      throw Error(ErrorCode::kOverflow, a.path(), std::nullopt,
                  "tensor " + format::Quote(flat(t)) +
                      ": its contiguous copy would be more than 2^64 - 1 bytes");
    }
    uint64_t end = 0;
    if (!format::CheckedAdd(offset, *n, &end)) {
      throw Error(
          ErrorCode::kOverflow, a.path(), std::nullopt,
          "tensor " + format::Quote(flat(t)) + ": the export would be more than 2^64 - 1 bytes");
    }
    std::vector<int64_t> shape = t.sizes;
    if (t.dtype == DType::kFloat4E2M1FNx2) {  // safetensors' F4 shape counts FP4 values
      if (shape.empty() || shape.back() > std::numeric_limits<int64_t>::max() / 2) {
        throw Error(ErrorCode::kUnsupported, a.path(), std::nullopt,
                    "tensor " + format::Quote(flat(t)) +
                        ": safetensors' F4 shape counts FP4 values, two per byte, so it needs a "
                        "last dimension of at most 2^62 - 1, found " +
                        (shape.empty() ? std::string("a 0-dimensional float4_e2m1fn_x2")
                                       : std::to_string(shape.back())));
      }
      shape.back() *= 2;
    }
    if (json.size() > 1) json += ',';
    json += nlohmann::json(keys[i]).dump();
    json += ':';
    json +=
        nlohmann::ordered_json{{"dtype", code}, {"shape", shape}, {"data_offsets", {offset, end}}}
            .dump();
    offset = end;
  }
  json += '}';
  json.append((8 - json.size() % 8) % 8, ' ');
  uint64_t total = 0;
  if (!format::CheckedAdd(8 + json.size(), offset, &total)) {
    throw Error(ErrorCode::kOverflow, a.path(), std::nullopt,
                "the export would be more than 2^64 - 1 bytes");
  }
  out.CheckSpace(total);
  uint8_t len[8];
  format::StoreU64(len, json.size());
  out.WriteAt(0, len, 8);
  out.WriteAt(8, json.data(), json.size());
  uint64_t pos = 8 + json.size();
  // One tensor at a time, strided ones a bounded piece at a time.
  SequentialWriter data(out);
  for (const auto& t : infos) {
    ForEachPiece(ViewOf(a, t), [&](const Piece& p) {
      data.Write(pos, p.data, p.nbytes);
      pos += p.nbytes;
    });
  }
  data.Flush();
  out.Resize(pos);
  out.Publish(/*durable=*/true);
  return notes;
}

}  // namespace tsar::exporter
