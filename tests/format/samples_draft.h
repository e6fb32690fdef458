// The archive under construction (Draft) and the byte-level helpers the
// generator of samples/ builds and mutates archives with (tests/format/
// samples_gen.cc for the valid samples, samples_invalid.cc for the invalid
// ones).
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>

#include "format/checksum.h"
#include "format/encode.h"
#include "format/endian.h"
#include "format/index.h"
#include "format/spec.h"
#include "format/tensor_parallel.h"
#include "format/value_tree.h"
#include "tsar/archive_file.h"
#include "tsar/error.h"

namespace tsar::testing::samples {

using format::DeviceType;
using format::IndexBuilder;
using format::MetadataSpec;
using format::MetaType;
using format::Role;
using format::TensorSpec;

inline std::string Hex64(uint64_t v) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

// One archive under construction: the builder plus the bytes of each storage.
struct Draft {
  explicit Draft(uint32_t alignment = format::kDefaultAlignment) : b(alignment) {}
  IndexBuilder b;
  std::vector<std::string> data;
  std::vector<TensorSpec> tensors;  // as added, for expected.json
  std::vector<std::string> entry_of;
  std::string current_entry;
  struct MetaRecord {
    uint32_t entry;
    std::string key;
    nlohmann::ordered_json json;
  };
  std::vector<MetaRecord> meta;  // as added; Expected() lists them in file order
  // §4.7.1: {name: content as hex} of the attached files, when the sample has any.
  nlohmann::ordered_json files;
  std::vector<std::pair<format::SparseSpec, uint32_t>> sparse;  // with its entry index
  std::vector<format::ValueSpec> values;                        // §4.10; empty: none
  std::optional<format::LayerSpec> layer;                       // §4.11
  std::vector<std::pair<uint32_t, std::string>> base_storages;  // base index, bytes
  uint32_t tp_world = 0;                                        // §4.12; 0: none

  void Entry(const std::string& name) {
    b.AddEntry(name);
    current_entry = name;
  }
  uint32_t Storage(std::string bytes) {
    data.push_back(std::move(bytes));
    return b.AddStorage(data.back().size());
  }
  // §4.11: a layer over the archive `base` (its bytes), found at `path`.
  void Layer(const std::string& base, const std::string& path) {
    const auto index = format::Index::ParseBytes(reinterpret_cast<const uint8_t*>(base.data()),
                                                 base.size(), "base");
    const format::Hash128 id = index.Identity();
    format::LayerSpec l;
    l.base_id_low = id.low;
    l.base_id_high = id.high;
    l.base_file_size = base.size();
    l.base_storage_count = static_cast<uint32_t>(index.storages().size());
    l.depth = 1 + (index.is_layer() ? index.layer().depth : 0);
    l.base_path = path;
    layer = l;
    b.SetLayer(l);
  }
  // Storage `i` of the base, whose bytes are `bytes`.
  uint32_t BaseStorage(uint32_t i, std::string bytes) {
    base_storages.emplace_back(i, std::move(bytes));
    const std::string& x = base_storages.back().second;
    return b.AddBaseStorage(i, x.size(), format::Xxh3(x.data(), x.size()));
  }
  void Tensor(TensorSpec t) {
    tensors.push_back(t);
    entry_of.push_back(current_entry);
    b.AddTensor(std::move(t));
  }
  void Meta(MetadataSpec m) { b.AddMetadata(std::move(m)); }
  uint32_t Sparse(format::SparseSpec s) {
    sparse.emplace_back(s, b.entry_count() - 1);
    return b.AddSparse(std::move(s));
  }

  // The value tree (§4.10) of `root`, whose tensors and entries are this draft's.
  void Tree(const Value& root) {
    values = format::EncodeTree(
        root,
        [this](const std::string& entry, const std::string& name) {
          for (uint32_t i = 0; i < tensors.size(); ++i) {
            if (entry_of[i] == entry && tensors[i].name == name) return i;
          }
          return format::kNone;
        },
        [this](const std::string& entry) {
          std::vector<std::string> seen;
          for (const auto& e : entry_of) {
            if (seen.empty() || seen.back() != e) seen.push_back(e);
          }
          for (uint32_t i = 0; i < seen.size(); ++i) {
            if (seen[i] == entry) return i;
          }
          return format::kNone;
        });
    b.SetValues(values);
  }

  std::string Bytes() {
    b.Plan();
    for (uint32_t i = 0; i < data.size(); ++i) {
      b.SetStorageChecksum(i, format::Xxh3(data[i].data(), data[i].size()));
    }
    const std::vector<uint8_t> head = b.EncodeHead();
    std::string out(b.file_size(), '\0');
    std::memcpy(out.data(), head.data(), head.size());
    for (uint32_t i = 0; i < data.size(); ++i) {
      std::memcpy(out.data() + b.storage_offset(i), data[i].data(), data[i].size());
    }
    return out;
  }

  // The expected decoding a second implementation must reproduce (§8).
  std::string Expected(const std::string& file) {
    nlohmann::ordered_json j;
    j["file_size"] = file.size();
    // §7.1: the lowest version with the features and dtype codes the sample uses.
    bool groups = false;
    for (const auto& sp : sparse) groups |= sp.first.layout == format::SparseLayout::kGroup;
    int minor = groups ? 5 : tp_world ? 4 : layer ? 2 : values.empty() ? 0 : 1;
    for (const TensorSpec& t : tensors) {
      if (static_cast<uint16_t>(t.dtype) >= 19) minor = std::max(minor, 3);
    }
    j["format_version"] = "1." + std::to_string(minor);
    if (tp_world) j["tp_world"] = tp_world;  // §4.12
    nlohmann::ordered_json storages = nlohmann::ordered_json::array();
    for (uint32_t i = 0; i < data.size(); ++i) {
      storages.push_back({{"id", i},
                          {"offset", b.storage_offset(i)},
                          {"nbytes", data[i].size()},
                          {"xxh3", Hex64(format::Xxh3(data[i].data(), data[i].size()))}});
    }
    for (size_t k = 0; k < base_storages.size(); ++k) {  // §4.11: bytes in the base
      const std::string& x = base_storages[k].second;
      storages.push_back({{"id", data.size() + k},
                          {"base_storage", base_storages[k].first},
                          {"nbytes", x.size()},
                          {"xxh3", Hex64(format::Xxh3(x.data(), x.size()))}});
    }
    nlohmann::ordered_json tensors = nlohmann::ordered_json::array();
    for (size_t i = 0; i < this->tensors.size(); ++i) {
      const TensorSpec& t = this->tensors[i];
      static const char* const kRoles[] = {"tensor", "parameter", "buffer", "sparse_component"};
      tensors.push_back({{"entry", entry_of[i]},
                         {"name", t.name},
                         {"dtype", std::string(DTypeName(t.dtype))},
                         {"shape", t.sizes},
                         {"strides", t.strides},
                         {"storage", t.storage},
                         {"storage_offset", t.storage_offset},
                         {"role", kRoles[static_cast<int>(t.role)]},
                         {"requires_grad", t.requires_grad}});
      if (t.shard_dim != format::kNone) tensors.back()["shard_dim"] = t.shard_dim;
    }
    // Metadata in file order: sorted by (entry as u32, key bytewise), §4.7.
    // std::string compares as unsigned bytes, and an archive-level record
    // (entry 0xffffffff) sorts after every per-entry one.
    std::vector<MetaRecord> sorted = meta;
    std::stable_sort(sorted.begin(), sorted.end(), [](const MetaRecord& a, const MetaRecord& b) {
      return a.entry != b.entry ? a.entry < b.entry : a.key < b.key;
    });
    nlohmann::ordered_json metadata = nlohmann::ordered_json::array();
    for (const MetaRecord& m : sorted) metadata.push_back(m.json);
    j["storages"] = storages;
    j["tensors"] = tensors;
    j["metadata"] = metadata;
    if (!files.is_null()) j["files"] = files;
    nlohmann::ordered_json sparse_records = nlohmann::ordered_json::array();
    for (const auto& [sp, entry] : sparse) {
      static const char* const kLayouts[] = {"", "coo", "csr", "csc", "group"};
      nlohmann::ordered_json rec = {{"entry", entry},
                                    {"name", sp.name},
                                    {"layout", kLayouts[static_cast<int>(sp.layout)]},
                                    {"coalesced", sp.coalesced},
                                    {"shape", sp.sizes},
                                    {"first_component", sp.first_component},
                                    {"component_count", format::ComponentCount(sp)}};
      if (sp.layout == format::SparseLayout::kGroup) {  // §4.13: outer dtype and strides
        rec["dtype"] = DTypeName(sp.dtype);
        rec["strides"] = sp.strides;
      }
      sparse_records.push_back(std::move(rec));
    }
    j["sparse"] = sparse_records;
    if (layer) {
      j["layer"] = {{"base_path", layer->base_path},
                    {"base_id", Hex64(layer->base_id_high) + Hex64(layer->base_id_low)},
                    {"base_file_size", layer->base_file_size},
                    {"base_storage_count", layer->base_storage_count},
                    {"depth", layer->depth}};
    }
    if (!values.empty()) {  // §4.10: each value record, then the link table
      nlohmann::ordered_json vals = nlohmann::ordered_json::array();
      nlohmann::ordered_json links = nlohmann::ordered_json::array();
      for (const auto& v : values) {
        nlohmann::ordered_json r = {{"kind", format::ValueKindName(v.kind)},
                                    {"flags", v.flags},
                                    {"count", v.links.size()},
                                    {"first_link", links.size()}};
        if (format::ValueHasBytes(v.kind)) {
          r["bytes"] = format::HexBytes(reinterpret_cast<const uint8_t*>(v.bytes.data()),
                                        v.bytes.size() > 16 ? 16 : v.bytes.size());
          r["value_length"] = v.bytes.size();
        } else {
          r["value"] = v.value;
        }
        vals.push_back(r);
        for (uint32_t t : v.links) links.push_back(t);
      }
      j["values"] = vals;
      j["links"] = links;
    }
    return j.dump(2) + "\n";
  }
};

inline std::string Floats(std::initializer_list<float> v) {
  std::string s(v.size() * 4, '\0');
  size_t i = 0;
  for (float f : v) {
    uint32_t bits;
    std::memcpy(&bits, &f, 4);
    format::StoreU32(reinterpret_cast<uint8_t*>(s.data()) + 4 * (i++), bits);
  }
  return s;
}
inline std::string Pattern(size_t n, uint8_t seed) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>(seed + i * 7);
  return s;
}

inline TensorSpec T(const std::string& name, uint32_t storage, DType dtype,
                    std::vector<int64_t> sizes, std::vector<int64_t> strides, uint64_t offset = 0,
                    Role role = Role::kTensor) {
  TensorSpec t;
  t.name = name;
  t.storage = storage;
  t.dtype = dtype;
  t.sizes = std::move(sizes);
  t.strides = std::move(strides);
  t.storage_offset = offset;
  t.role = role;
  return t;
}

// valid/minimal: one entry "model", one float32 parameter "w" = [1.0, 2.0].
inline Draft Minimal() {
  Draft d;
  d.Entry("model");
  const uint32_t s = d.Storage(Floats({1.0f, 2.0f}));
  d.Tensor(T("w", s, DType::kFloat32, {2}, {1}, 0, Role::kParameter));
  return d;
}

// --- mutation helpers, addressing fields through the index header ---------

inline uint64_t U64At(const std::string& f, uint64_t off) {
  return format::LoadU64(reinterpret_cast<const uint8_t*>(f.data()) + off);
}
inline uint32_t U32At(const std::string& f, uint64_t off) {
  return format::LoadU32(reinterpret_cast<const uint8_t*>(f.data()) + off);
}
inline void Put64(std::string& f, uint64_t off, uint64_t v) {
  format::StoreU64(reinterpret_cast<uint8_t*>(f.data()) + off, v);
}
inline void Put32(std::string& f, uint64_t off, uint32_t v) {
  format::StoreU32(reinterpret_cast<uint8_t*>(f.data()) + off, v);
}
inline void Put16(std::string& f, uint64_t off, uint16_t v) {
  format::StoreU16(reinterpret_cast<uint8_t*>(f.data()) + off, v);
}
// Offset of table t (0 entries, 1 storages, 2 tensors, 3 sparse, 4 metadata, 5 dims, 6 blob).
inline uint64_t Table(const std::string& f, int t) {
  static const uint64_t kSizes[6] = {format::kEntryRecordSize,    format::kStorageRecordSize,
                                     format::kTensorRecordSize,   format::kSparseRecordSize,
                                     format::kMetadataRecordSize, format::kDimSize};
  uint64_t pos = format::kHeaderSize + format::kIndexHeaderSize;
  for (int i = 0; i < t; ++i) pos += U32At(f, format::kHeaderSize + 4 * i) * kSizes[i];
  return pos;
}
// §4.10: the value table at the first multiple of 8 after the blob, then links.
inline uint64_t ValuesAt(const std::string& f) {
  const uint64_t blob_end = Table(f, 6) + U64At(f, format::kHeaderSize + 24);
  return (blob_end + 7) & ~uint64_t{7};
}
inline uint64_t LinksAt(const std::string& f) {
  return ValuesAt(f) + uint64_t{U32At(f, format::kHeaderSize + 32)} * format::kValueRecordSize;
}
// §4.11: the layer record of an archive without a value tree, at the first
// multiple of 8 after the blob; the base storage table after it.
inline uint64_t LayerAt(const std::string& f) { return ValuesAt(f); }
inline uint64_t BaseStoragesAt(const std::string& f) {
  return LayerAt(f) + format::kLayerRecordSize;
}
// §4.12: the shard table of an archive without a value tree or layer, at the
// first multiple of 8 after the blob.
inline uint64_t ShardsAt(const std::string& f) { return ValuesAt(f); }
// Recomputes index_xxh3 so a mutation reaches the checks behind the checksum.
inline void Refix(std::string& f) {
  const uint64_t end = U64At(f, format::kOffIndexOffset) + U64At(f, format::kOffIndexSize);
  Put64(f, format::kOffIndexXxh3,
        format::IndexChecksum(reinterpret_cast<const uint8_t*>(f.data()), end));
}
}  // namespace tsar::testing::samples
