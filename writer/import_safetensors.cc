// Input readers for safetensors files and sharded safetensors checkpoints
// (*.safetensors.index.json): the whole header is validated, stricter than the
// reference reader, before any tensor exists; tensors are views of the mapping.
#include <algorithm>
#include <cctype>
#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "format/endian.h"
#include "format/reader.h"
#include "tsar/dtype.h"
#include "tsar/error.h"
#include "writer/importer.h"
#include "writer/json_util.h"
#include "writer/safe_open.h"
#include "writer/strict_json.h"
#include "writer/torchao_safetensors.h"

namespace tsar::importer {
namespace {

using Json = nlohmann::json;
using format::Quote;

// Largest accepted header (and index file), as safetensors' MAX_HEADER_SIZE.
constexpr uint64_t kMaxHeaderSize = 100'000'000;
// The header is an 8-byte little-endian length, then that many bytes of JSON.
constexpr uint64_t kLengthSize = 8;
constexpr const char* kMetadataKey = "__metadata__";

struct SafetensorsDType {
  const char* name;
  DType dtype;
};
// The dtype strings of the safetensors format and their tsar dtypes.
constexpr SafetensorsDType kDTypes[] = {
    {"BOOL", DType::kBool},
    {"U8", DType::kUInt8},
    {"I8", DType::kInt8},
    {"I16", DType::kInt16},
    {"I32", DType::kInt32},
    {"I64", DType::kInt64},
    {"F16", DType::kFloat16},
    {"BF16", DType::kBFloat16},
    {"F32", DType::kFloat32},
    {"F64", DType::kFloat64},
    {"C64", DType::kComplex64},
    {"F8_E5M2", DType::kFloat8E5M2},
    {"F8_E4M3", DType::kFloat8E4M3FN},
    {"U16", DType::kUInt16},
    {"U32", DType::kUInt32},
    {"U64", DType::kUInt64},
    {"F8_E4M3FNUZ", DType::kFloat8E4M3FNUZ},
    {"F8_E5M2FNUZ", DType::kFloat8E5M2FNUZ},
    {"F8_E8M0", DType::kFloat8E8M0FNU},
    // Two FP4 values per byte; the file's shape counts FP4 values, so its last
    // dimension is twice torch's float4_e2m1fn_x2 one (ParseTensor halves it).
    {"F4", DType::kFloat4E2M1FNx2},
};

[[noreturn]] void Fail(const std::string& path, std::optional<uint64_t> offset,
                       const std::string& message) {
  throw Error(ErrorCode::kBadInput, path, offset, message);
}

struct TensorSpec {
  std::string name;
  std::string dtype_name;  // as in the file, for messages
  DType dtype;
  std::vector<int64_t> shape;
  std::vector<int64_t> strides;
  uint64_t begin = 0;  // relative to the data buffer
  uint64_t end = 0;
};

// A validated safetensors file; nothing in it has been turned into a tensor yet.
struct Parsed {
  std::shared_ptr<const MappedInput> file;
  uint64_t data_start = 0;
  std::vector<TensorSpec> tensors;  // ascending begin (the writer's order)
  std::vector<std::pair<std::string, std::string>> metadata;
};

std::string ShapeText(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

TensorSpec ParseTensor(const std::string& path, const std::string& name, const Json& info,
                       uint64_t buffer_size) {
  const std::string where = "tensor " + Quote(name) + ": ";
  if (!info.is_object()) {
    Fail(path, std::nullopt,
         where + "expected an object with dtype, shape and data_offsets, found " + Describe(info));
  }
  TensorSpec t;
  t.name = name;
  for (const char* field : {"dtype", "shape", "data_offsets"}) {
    if (!info.contains(field)) {
      Fail(path, std::nullopt, where + field + ": expected a value, found none");
    }
  }
  const Json& dtype = info["dtype"];
  if (!dtype.is_string()) {
    Fail(path, std::nullopt, where + "dtype: expected a string, found " + Describe(dtype));
  }
  t.dtype_name = dtype.get<std::string>();
  const auto known =
      std::find_if(std::begin(kDTypes), std::end(kDTypes),
                   [&](const SafetensorsDType& d) { return t.dtype_name == d.name; });
  if (known == std::end(kDTypes)) {
    Fail(path, std::nullopt,
         where +
             "dtype: expected one of BOOL, U8, I8, I16, I32, I64, F16, BF16, F32, F64, C64, "
             "F8_E5M2, F8_E4M3, U16, U32, U64, F8_E4M3FNUZ, F8_E5M2FNUZ, F8_E8M0, F4, found " +
             Quote(t.dtype_name));
  }
  t.dtype = known->dtype;

  const Json& shape = info["shape"];
  if (!shape.is_array()) {
    Fail(path, std::nullopt, where + "shape: expected an array, found " + Describe(shape));
  }
  uint64_t numel = 1;
  bool overflow = false, has_zero = false;
  for (size_t i = 0; i < shape.size(); ++i) {
    const std::optional<uint64_t> d = AsU64(shape[i]);
    if (!d || *d > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      Fail(path, std::nullopt,
           where + "shape[" + std::to_string(i) + "]: expected a non-negative integer, found " +
               Describe(shape[i]));
    }
    t.shape.push_back(static_cast<int64_t>(*d));
    has_zero = has_zero || *d == 0;
    overflow = overflow || !format::CheckedMul(numel, *d, &numel);
  }
  const std::string described = t.dtype_name + " " + ShapeText(t.shape);
  if (t.dtype == DType::kFloat4E2M1FNx2) {  // the file counts FP4 values, two per byte
    if (t.shape.empty() || t.shape.back() % 2 != 0) {
      Fail(path, std::nullopt,
           where + "shape: expected a last dimension of even length for F4 (two values per byte), "
                   "found " + described);
    }
    t.shape.back() /= 2;
    numel /= 2;  // even: its last factor is
  }
  uint64_t nbytes = 0;
  // A zero dimension makes the product zero even after an earlier overflow.
  if (has_zero) {
    numel = 0;
    overflow = false;
  }
  if (overflow || !format::CheckedMul(numel, ElementSize(t.dtype), &nbytes)) {
    Fail(path, std::nullopt,
         where + "shape: expected at most 2^64 - 1 bytes, found more for " + described);
  }
  // Contiguous strides, as LibTorch computes them (zero sizes count as one).
  t.strides.assign(t.shape.size(), 1);
  uint64_t stride = 1;
  for (size_t i = t.shape.size(); i-- > 0;) {
    t.strides[i] = static_cast<int64_t>(stride);
    if (!format::CheckedMul(stride, std::max<uint64_t>(t.shape[i], 1), &stride) ||
        stride > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      Fail(path, std::nullopt,
           where + "shape: expected strides that fit in 64 bits, found " + described);
    }
  }

  const Json& offsets = info["data_offsets"];
  if (!offsets.is_array() || offsets.size() != 2 || !AsU64(offsets[0]) || !AsU64(offsets[1])) {
    Fail(path, std::nullopt,
         where + "data_offsets: expected two non-negative integers [begin, end], found " +
             Describe(offsets));
  }
  t.begin = *AsU64(offsets[0]);
  t.end = *AsU64(offsets[1]);
  const std::string found = "[" + std::to_string(t.begin) + ", " + std::to_string(t.end) + "]";
  if (t.begin > t.end) {
    Fail(path, std::nullopt, where + "data_offsets: expected begin <= end, found " + found);
  }
  if (t.end > buffer_size) {
    Fail(path, std::nullopt,
         where + "data_offsets: expected end <= " + std::to_string(buffer_size) +
             " (the size of the data buffer), found " + found);
  }
  if (t.end - t.begin != nbytes) {
    Fail(path, std::nullopt,
         where + "data_offsets: expected " + std::to_string(nbytes) + " bytes for " + described +
             ", found " + std::to_string(t.end - t.begin));
  }
  return t;
}

Parsed ParseFile(std::shared_ptr<const MappedInput> file) {
  Parsed p;
  p.file = std::move(file);
  const std::string& path = p.file->path();
  const uint64_t size = p.file->size();
  if (size < kLengthSize) {
    throw Error::Field(ErrorCode::kBadInput, path, 0, "header length", "8 bytes",
                       std::to_string(size) + " bytes");
  }
  const uint64_t n = format::LoadU64(p.file->data());
  if (n < 2 || n > kMaxHeaderSize) {
    throw Error::Field(ErrorCode::kBadInput, path, 0, "header length",
                       "2 to " + std::to_string(kMaxHeaderSize), std::to_string(n));
  }
  if (n > size - kLengthSize) {
    throw Error::Field(ErrorCode::kBadInput, path, 0, "header length",
                       "at most " + std::to_string(size - kLengthSize) + " (the bytes after it)",
                       std::to_string(n));
  }
  p.data_start = kLengthSize + n;
  const uint64_t buffer_size = size - p.data_start;
  const std::string_view text(reinterpret_cast<const char*>(p.file->data()) + kLengthSize, n);
  if (text[0] != '{') {
    Fail(path, kLengthSize,
         "header: expected '{' as its first byte (safetensors headers start with the JSON "
         "object, no whitespace), found " +
             (std::isprint(static_cast<unsigned char>(text[0]))
                  ? Quote(std::string(1, text[0]))
                  : "byte " + std::to_string(static_cast<unsigned char>(text[0]))));
  }
  const Json header = ParseStrictJson(text, path, kLengthSize, "header", "tensor", nullptr);
  if (!header.is_object()) {
    Fail(path, kLengthSize, "header: expected a JSON object, found " + Describe(header));
  }
  for (const auto& [name, info] : header.items()) {
    if (name == kMetadataKey) {
      if (!info.is_object()) {
        Fail(
            path, std::nullopt,
            std::string(kMetadataKey) + ": expected an object of strings, found " + Describe(info));
      }
      for (const auto& [key, value] : info.items()) {
        if (!value.is_string()) {
          Fail(path, std::nullopt,
               std::string(kMetadataKey) + ": " + Quote(key) + ": expected a string, found " +
                   Describe(value));
        }
        p.metadata.emplace_back(key, value.get<std::string>());
      }
      continue;
    }
    p.tensors.push_back(ParseTensor(path, name, info, buffer_size));
  }
  std::sort(p.tensors.begin(), p.tensors.end(), [](const TensorSpec& a, const TensorSpec& b) {
    return std::tie(a.begin, a.end, a.name) < std::tie(b.begin, b.end, b.name);
  });
  // As the reference reader: sorted by data_offsets, the tensors tile the data
  // buffer exactly, from 0 to its end, with no gap, overlap or trailing byte
  // (bytes no tensor claims could hide anything from a reviewer's tools).
  uint64_t expected = 0;
  const TensorSpec* last = nullptr;
  for (const TensorSpec& t : p.tensors) {
    if (t.begin != expected) {
      const std::string after =
          last ? "the end of tensor " + Quote(last->name) : std::string("the start of the data");
      Fail(path, std::nullopt,
           "tensor " + Quote(t.name) + ": data_offsets: expected begin " +
               std::to_string(expected) + " (" + after + "), found [" + std::to_string(t.begin) +
               ", " + std::to_string(t.end) + "]" +
               (t.begin > expected
                    ? ": " + std::to_string(t.begin - expected) + " bytes that no tensor holds"
                    : ": overlapping bytes"));
    }
    expected = t.end;
    last = &t;
  }
  if (expected != buffer_size) {
    Fail(path, p.data_start + expected,
         "data: expected the tensors to fill the " + std::to_string(buffer_size) +
             " bytes after the header, found " + std::to_string(buffer_size - expected) +
             " bytes after the last tensor that no tensor holds");
  }
  return p;
}

void AppendTensors(const Parsed& p, std::vector<Imported::Tensor>* out) {
  for (const TensorSpec& t : p.tensors) {
    auto storage = MappedInput::Storage(p.file, p.data_start + t.begin, t.end - t.begin);
    out->push_back({t.name,
                    MakeView(storage, t.dtype, t.shape, t.strides, 0, "tensor " + Quote(t.name),
                             p.file->path()),
                    Role::kTensor});
  }
}

// Why shard path `s` (from an index's weight_map) could name a file outside
// the index's directory, or "" when it cannot: what it is, as the message
// says it.
std::string UnsafeRelativePath(const std::string& s) {
  if (s.empty()) return "an empty path";
  if (s.find('\0') != std::string::npos) return "a path with a NUL byte";
  if (s[0] == '/') return "an absolute path";
  size_t start = 0;
  while (start <= s.size()) {
    size_t slash = s.find('/', start);
    if (slash == std::string::npos) slash = s.size();
    if (s.compare(start, slash - start, "..") == 0 && slash - start == 2)
      return "a path with a \"..\" component";
    start = slash + 1;
  }
  return "";
}

}  // namespace

Imported ImportSafetensors(const std::string& path, const ImportOptions& options) {
  return ImportSafetensorsMapped(MappedInput::Open(path), options);
}

Imported ImportSafetensorsMapped(const std::shared_ptr<const MappedInput>& input,
                                 const ImportOptions& options) {
  const Parsed p = ParseFile(input);
  Imported out;
  out.kind = InputKind::kSafetensors;
  out.entries.push_back({options.default_entry, {}});
  AppendTensors(p, &out.entries.back().tensors);
  for (const auto& [key, value] : p.metadata) out.metadata.push_back({"", key, value});
  // torchao's quantized tensors (transformers' TorchAoConfig): groups.
  torchao::GroupTorchaoSafetensors(out, input->path(), options.strict);
  return out;
}

Imported ImportSafetensorsIndex(const std::string& path, const ImportOptions& options) {
  const std::shared_ptr<const MappedInput> file = MappedInput::Open(path);
  if (file->size() > kMaxHeaderSize) {
    Fail(path, std::nullopt,
         "index: expected at most " + std::to_string(kMaxHeaderSize) + " bytes, found " +
             std::to_string(file->size()));
  }
  KeyOrder key_order;
  const Json index =
      ParseStrictJson(std::string_view(reinterpret_cast<const char*>(file->data()), file->size()),
                      path, 0, "index", "key", &key_order);
  if (!index.is_object()) Fail(path, 0, "index: expected a JSON object, found " + Describe(index));
  if (!index.contains("weight_map") || !index["weight_map"].is_object()) {
    Fail(path, std::nullopt,
         "weight_map: expected an object of tensor name to shard file, found " +
             (index.contains("weight_map") ? Describe(index["weight_map"]) : std::string("none")));
  }
  const Json& weight_map = index["weight_map"];

  Imported out;
  out.kind = InputKind::kSafetensorsIndex;
  for (const auto& [key, value] : index.items()) {
    if (key != "weight_map" && key != "metadata") {
      out.skipped.push_back("key " + Quote(key) + " of the index is not used");
    }
  }
  if (index.contains("metadata") && !index["metadata"].is_null()) {
    const Json& meta = index["metadata"];
    if (!meta.is_object()) {
      Fail(path, std::nullopt, "metadata: expected an object, found " + Describe(meta));
    }
    for (const auto& [key, value] : meta.items()) {
      if (value.is_string()) {
        out.metadata.push_back({"", key, value.get<std::string>()});
      } else if (value.is_number_integer() &&
                 (!value.is_number_unsigned() ||
                  value.get<uint64_t>() <=
                      static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))) {
        out.metadata.push_back({"", key, value.get<int64_t>()});
      } else if (value.is_number_float()) {
        out.metadata.push_back({"", key, value.get<double>()});
      } else {
        out.skipped.push_back("metadata " + Quote(key) + ": " + Describe(value) +
                              " is not an integer, a float or a string");
      }
    }
  }

  // Shards in order of first appearance; their paths are relative to the index.
  const size_t slash = path.rfind('/');
  const std::string dir = slash == std::string::npos ? std::string() : path.substr(0, slash + 1);
  std::vector<std::string> shards;
  std::unordered_set<std::string> shard_set;
  for (const std::string& name : key_order.members["weight_map"]) {
    const Json& shard = weight_map[name];
    if (!shard.is_string()) {
      Fail(path, std::nullopt,
           "weight_map: tensor " + Quote(name) + ": expected a shard file name, found " +
               Describe(shard));
    }
    const std::string& file_name = shard.get_ref<const std::string&>();
    if (const std::string why = UnsafeRelativePath(file_name); !why.empty()) {
      Fail(path, std::nullopt,
           "weight_map: tensor " + Quote(name) +
               ": expected a shard path relative to the index's directory, without \"..\", "
               "found " +
               why + " " + Quote(file_name));
    }
    if (shard_set.insert(file_name).second) shards.push_back(file_name);
  }

  // Every shard is validated, and every name accounted for, before any view exists.
  // Shards are opened below the index's directory, component by component:
  // none may be (or lie under) a symbolic link that leaves it (safe_open.h).
  const InputDir shard_dir(dir, path, options.follow_symlinks);
  std::vector<Parsed> parsed;
  std::unordered_map<std::string, const std::string*> found_in;  // tensor -> shard
  for (const std::string& shard : shards) {
    struct stat st;
    const int fd = shard_dir.OpenFile(shard, &st);
    parsed.push_back(
        ParseFile(MappedInput::Open(fd, static_cast<uint64_t>(st.st_size), dir + shard)));
    for (const TensorSpec& t : parsed.back().tensors) {
      const auto seen = found_in.find(t.name);
      if (seen != found_in.end()) {
        Fail(path, std::nullopt,
             "tensor " + Quote(t.name) + ": expected in one shard, found in " +
                 Quote(*seen->second) + " and " + Quote(shard));
      }
      if (!weight_map.contains(t.name)) {
        Fail(path, std::nullopt,
             "tensor " + Quote(t.name) + ": expected in weight_map, found only in shard " +
                 Quote(shard));
      }
      const std::string& listed = weight_map[t.name].get_ref<const std::string&>();
      if (listed != shard) {
        Fail(path, std::nullopt,
             "tensor " + Quote(t.name) + ": expected in shard " + Quote(listed) +
                 " as weight_map says, found in " + Quote(shard));
      }
      found_in.emplace(t.name, &shard);
    }
  }
  for (const std::string& name : key_order.members["weight_map"]) {
    if (found_in.count(name) == 0) {
      Fail(path, std::nullopt,
           "tensor " + Quote(name) + ": expected in shard " +
               Quote(weight_map[name].get_ref<const std::string&>()) +
               " as weight_map says, found none");
    }
  }

  out.entries.push_back({options.default_entry, {}});
  std::unordered_set<std::string> index_keys;
  for (const Imported::Meta& m : out.metadata) index_keys.insert(m.key);
  std::map<std::string, std::string> shard_meta;
  for (size_t i = 0; i < parsed.size(); ++i) {
    AppendTensors(parsed[i], &out.entries.back().tensors);
    for (const auto& [key, value] : parsed[i].metadata) {
      // The index's metadata wins; shards agreeing on a key give it once.
      const auto prev = shard_meta.find(key);
      if (index_keys.count(key) != 0) {
        out.skipped.push_back("shard " + shards[i] + ": __metadata__ " + Quote(key) +
                              ": the index's metadata sets that key");
      } else if (prev == shard_meta.end()) {
        shard_meta.emplace(key, value);
        out.metadata.push_back({"", key, value});
      } else if (prev->second != value) {
        out.skipped.push_back("shard " + shards[i] + ": __metadata__ " + Quote(key) +
                              ": differs from the value in an earlier shard");
      }
    }
  }
  // torchao's quantized tensors, whose inner tensors may lie in different
  // shards (each shard holds the whole model's torchao metadata).
  torchao::GroupTorchaoSafetensors(out, path, options.strict);
  return out;
}

}  // namespace tsar::importer
