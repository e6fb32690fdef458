// Builds every file of samples/ from scratch with format/encode.h and
// hand-made mutations. tests/format/samples_test.cc checks the committed files
// are byte-identical to this output; tsar_gen_samples writes them.
#include "tests/format/samples_gen.h"

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

namespace tsar::testing {
namespace {

using format::DeviceType;
using format::IndexBuilder;
using format::MetadataSpec;
using format::MetaType;
using format::Role;
using format::TensorSpec;

std::string Hex64(uint64_t v) {
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
    int minor = tp_world ? 4 : layer ? 2 : values.empty() ? 0 : 1;
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
      static const char* const kLayouts[] = {"", "coo", "csr", "csc"};
      sparse_records.push_back(
          {{"entry", entry},
           {"name", sp.name},
           {"layout", kLayouts[static_cast<int>(sp.layout)]},
           {"coalesced", sp.coalesced},
           {"shape", sp.sizes},
           {"first_component", sp.first_component},
           {"component_count", sp.layout == format::SparseLayout::kCoo ? 2 : 3}});
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

std::string Floats(std::initializer_list<float> v) {
  std::string s(v.size() * 4, '\0');
  size_t i = 0;
  for (float f : v) {
    uint32_t bits;
    std::memcpy(&bits, &f, 4);
    format::StoreU32(reinterpret_cast<uint8_t*>(s.data()) + 4 * (i++), bits);
  }
  return s;
}
std::string Pattern(size_t n, uint8_t seed) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>(seed + i * 7);
  return s;
}

TensorSpec T(const std::string& name, uint32_t storage, DType dtype, std::vector<int64_t> sizes,
             std::vector<int64_t> strides, uint64_t offset = 0, Role role = Role::kTensor) {
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
Draft Minimal() {
  Draft d;
  d.Entry("model");
  const uint32_t s = d.Storage(Floats({1.0f, 2.0f}));
  d.Tensor(T("w", s, DType::kFloat32, {2}, {1}, 0, Role::kParameter));
  return d;
}

// --- mutation helpers, addressing fields through the index header ---------

uint64_t U64At(const std::string& f, uint64_t off) {
  return format::LoadU64(reinterpret_cast<const uint8_t*>(f.data()) + off);
}
uint32_t U32At(const std::string& f, uint64_t off) {
  return format::LoadU32(reinterpret_cast<const uint8_t*>(f.data()) + off);
}
void Put64(std::string& f, uint64_t off, uint64_t v) {
  format::StoreU64(reinterpret_cast<uint8_t*>(f.data()) + off, v);
}
void Put32(std::string& f, uint64_t off, uint32_t v) {
  format::StoreU32(reinterpret_cast<uint8_t*>(f.data()) + off, v);
}
void Put16(std::string& f, uint64_t off, uint16_t v) {
  format::StoreU16(reinterpret_cast<uint8_t*>(f.data()) + off, v);
}
// Offset of table t (0 entries, 1 storages, 2 tensors, 3 sparse, 4 metadata, 5 dims, 6 blob).
uint64_t Table(const std::string& f, int t) {
  static const uint64_t kSizes[6] = {format::kEntryRecordSize,    format::kStorageRecordSize,
                                     format::kTensorRecordSize,   format::kSparseRecordSize,
                                     format::kMetadataRecordSize, format::kDimSize};
  uint64_t pos = format::kHeaderSize + format::kIndexHeaderSize;
  for (int i = 0; i < t; ++i) pos += U32At(f, format::kHeaderSize + 4 * i) * kSizes[i];
  return pos;
}
// §4.10: the value table at the first multiple of 8 after the blob, then links.
uint64_t ValuesAt(const std::string& f) {
  const uint64_t blob_end = Table(f, 6) + U64At(f, format::kHeaderSize + 24);
  return (blob_end + 7) & ~uint64_t{7};
}
uint64_t LinksAt(const std::string& f) {
  return ValuesAt(f) + uint64_t{U32At(f, format::kHeaderSize + 32)} * format::kValueRecordSize;
}
// §4.11: the layer record of an archive without a value tree, at the first
// multiple of 8 after the blob; the base storage table after it.
uint64_t LayerAt(const std::string& f) { return ValuesAt(f); }
uint64_t BaseStoragesAt(const std::string& f) { return LayerAt(f) + format::kLayerRecordSize; }
// §4.12: the shard table of an archive without a value tree or layer, at the
// first multiple of 8 after the blob.
uint64_t ShardsAt(const std::string& f) { return ValuesAt(f); }
// Recomputes index_xxh3 so a mutation reaches the checks behind the checksum.
void Refix(std::string& f) {
  const uint64_t end = U64At(f, format::kOffIndexOffset) + U64At(f, format::kOffIndexSize);
  Put64(f, format::kOffIndexXxh3,
        format::IndexChecksum(reinterpret_cast<const uint8_t*>(f.data()), end));
}

struct Invalid {
  const char* name;
  std::function<std::string()> make;
  ErrorCode code;
  std::function<uint64_t(const std::string&)> offset;
  const char* what;  // MANIFEST.tsv's description column
};

std::vector<Invalid> InvalidCatalogue(const std::string& minimal, const std::string& shared,
                                      const std::string& meta, const std::string& sparse,
                                      const std::string& aligned, const std::string& empty_views,
                                      const std::string& tree, const std::string& layer,
                                      const std::string& tp) {
  auto fixed = [](uint64_t o) { return [o](const std::string&) { return o; }; };
  auto tensor0 = [](uint64_t field) {
    return [field](const std::string& f) { return Table(f, 2) + field; };
  };
  auto with = [](std::string base, std::function<void(std::string&)> edit, bool refix) {
    return [base, edit, refix]() {
      std::string f = base;
      edit(f);
      if (refix) Refix(f);
      return f;
    };
  };
  const uint64_t ih = format::kHeaderSize;
  std::vector<Invalid> v = {
      {"empty_file", [] { return std::string(); }, ErrorCode::kBadMagic, fixed(0), "zero bytes"},
      {"bad_magic",
       with(
           minimal, [](std::string& f) { f[1] = 't'; }, false),
       ErrorCode::kBadMagic, fixed(0), "magic byte 1 is 't'"},
      {"text_mode_crlf",
       with(
           minimal, [](std::string& f) { f.erase(5, 1); }, false),
       ErrorCode::kBadMagic, fixed(0), "the CR of the magic was stripped in transit"},
      {"truncated_header", [minimal] { return minimal.substr(0, 40); }, ErrorCode::kTruncated,
       fixed(0), "only 40 bytes of the header"},
      {"truncated_data", [minimal] { return minimal.substr(0, minimal.size() - 1); },
       ErrorCode::kTruncated, fixed(format::kOffFileSize), "the last data byte is missing"},
      {"trailing_byte", [minimal] { return minimal + std::string(1, '\0'); },
       ErrorCode::kInvalidValue, fixed(format::kOffFileSize), "one byte past file_size"},
      {"major_2",
       with(
           minimal, [](std::string& f) { Put16(f, format::kOffMajor, 2); }, false),
       ErrorCode::kUnsupportedVersion, fixed(format::kOffMajor), "a future major version"},
      {"header_size_72",
       with(
           minimal, [](std::string& f) { Put32(f, format::kOffHeaderSize, 72); }, false),
       ErrorCode::kInvalidValue, fixed(format::kOffHeaderSize), "minor 0 with a 72-byte header"},
      {"index_size_huge",
       with(
           minimal, [](std::string& f) { Put64(f, format::kOffIndexSize, uint64_t{1} << 40); },
           false),
       ErrorCode::kInvalidValue, fixed(format::kOffIndexSize), "index_size of 1 TiB"},
      {"data_offset_wrong",
       with(
           minimal, [](std::string& f) { Put64(f, format::kOffDataOffset, 128); }, false),
       ErrorCode::kInvalidValue, fixed(format::kOffDataOffset), "data_offset inside the index"},
      {"alignment_100",
       with(
           minimal, [](std::string& f) { Put32(f, format::kOffAlignment, 100); }, false),
       ErrorCode::kInvalidValue, fixed(format::kOffAlignment), "alignment not a power of two"},
      {"flags_set",
       with(
           minimal, [](std::string& f) { Put32(f, format::kOffFlags, 1); }, false),
       ErrorCode::kReservedNonZero, fixed(format::kOffFlags), "a reserved header flag"},
      {"index_checksum",
       with(
           minimal, [](std::string& f) { f[Table(f, 6)] ^= 0x20; }, false),
       ErrorCode::kChecksumMismatch, fixed(format::kOffIndexXxh3),
       "a name byte changed, checksum not updated"},
      {"index_padding_nonzero",
       with(
           minimal, [](std::string& f) { f[U64At(f, format::kOffDataOffset) - 1] = 1; }, true),
       ErrorCode::kReservedNonZero,
       [](const std::string& f) { return U64At(f, format::kOffDataOffset) - 1; },
       "a non-zero byte between index and data"},
      {"index_reserved",
       with(
           minimal, [ih](std::string& f) { f[ih + 40] = 1; }, true),
       ErrorCode::kReservedNonZero, fixed(ih + 40), "a reserved index header byte"},
      {"tensor_count_huge",
       with(
           minimal, [ih](std::string& f) { Put32(f, ih + 8, 0xFFFFFFFFu); }, true),
       ErrorCode::kOutOfBounds, fixed(ih + 8), "4 billion tensors in a 182-byte index"},
      {"blob_size_huge",
       with(
           minimal, [ih](std::string& f) { Put64(f, ih + 24, UINT64_MAX); }, true),
       ErrorCode::kOutOfBounds, fixed(ih + 24), "blob_size near 2^64"},
      {"entry_partition",
       with(
           minimal, [](std::string& f) { Put32(f, Table(f, 0) + 8, 1); }, true),
       ErrorCode::kInvalidValue, [](const std::string& f) { return Table(f, 0) + 8; },
       "entry #0 does not start at tensor 0"},
      {"storage_misaligned",
       with(
           minimal,
           [](std::string& f) {
             Put64(f, Table(f, 1), U64At(f, Table(f, 1)) + 8);
             Put64(f, Table(f, 1) + 8, 0);
           },
           true),
       ErrorCode::kMisaligned, [](const std::string& f) { return Table(f, 1); },
       "storage offset off by 8"},
      {"storage_hole",
       with(
           shared,
           [](std::string& f) { Put64(f, Table(f, 1) + 32, U64At(f, Table(f, 1) + 32) + 64); },
           true),
       ErrorCode::kInvalidValue, [](const std::string& f) { return Table(f, 1) + 32; },
       "a 64-byte hole before storage #1"},
      {"storage_out_of_bounds",
       with(
           minimal, [](std::string& f) { Put64(f, Table(f, 1) + 8, 16); }, true),
       ErrorCode::kOutOfBounds, [](const std::string& f) { return Table(f, 1) + 8; },
       "storage nbytes past the end of the file"},
      {"storage_nbytes_overflow",
       with(
           minimal, [](std::string& f) { Put64(f, Table(f, 1) + 8, UINT64_MAX - 100); }, true),
       ErrorCode::kOutOfBounds, [](const std::string& f) { return Table(f, 1) + 8; },
       "storage nbytes near 2^64"},
      {"storage_overlap",
       with(
           shared, [](std::string& f) { Put64(f, Table(f, 1) + 32, U64At(f, Table(f, 1))); }, true),
       ErrorCode::kOverlap, [](const std::string& f) { return Table(f, 1) + 32; },
       "storage #1 starts where storage #0 does"},
      {"name_out_of_blob",
       with(
           minimal, [](std::string& f) { Put32(f, Table(f, 2), 0x7FFFFFF0u); }, true),
       ErrorCode::kOutOfBounds, tensor0(0), "tensor name_offset past the blob"},
      {"name_empty",
       with(
           minimal, [](std::string& f) { Put32(f, Table(f, 2) + 4, 0); }, true),
       ErrorCode::kInvalidValue, tensor0(4), "an empty tensor name"},
      {"name_not_utf8",
       with(
           minimal, [](std::string& f) { f[Table(f, 6) + U32At(f, Table(f, 2))] = '\xff'; }, true),
       ErrorCode::kInvalidValue, tensor0(0), "tensor name byte 0xff"},
      {"tensor_storage_index",
       with(
           minimal, [](std::string& f) { Put32(f, Table(f, 2) + 8, 5); }, true),
       ErrorCode::kOutOfBounds, tensor0(8), "tensor refers to storage #5 of 1"},
      {"tensor_bad_dtype",
       with(
           minimal, [](std::string& f) { Put16(f, Table(f, 2) + 12, 99); }, true),
       ErrorCode::kBadDtype, tensor0(12), "dtype code 99"},
      {"tensor_dtype_needs_1_3",
       with(
           minimal, [](std::string& f) { Put16(f, Table(f, 2) + 12, 19); }, true),
       ErrorCode::kBadDtype, tensor0(12),
       "dtype code 19 (float8_e4m3fnuz, added by format 1.3) in a minor 0 archive"},
      {"tensor_bad_role",
       with(
           minimal, [](std::string& f) { f[Table(f, 2) + 14] = 9; }, true),
       ErrorCode::kInvalidValue, tensor0(14), "role 9"},
      {"tensor_flags_reserved",
       with(
           minimal, [](std::string& f) { f[Table(f, 2) + 15] = '\x80'; }, true),
       ErrorCode::kReservedNonZero, tensor0(15), "tensor flag bit 7"},
      {"requires_grad_int",
       with(
           aligned, [](std::string& f) { f[Table(f, 2) + 15] = 1; }, true),
       ErrorCode::kInvalidValue, tensor0(15), "requires_grad on an int64 tensor"},
      {"tensor_ndim_65",
       with(
           minimal, [](std::string& f) { Put32(f, Table(f, 2) + 16, 65); }, true),
       ErrorCode::kBadShape, tensor0(16), "65 dimensions"},
      {"tensor_dims_out_of_table",
       with(
           minimal, [](std::string& f) { Put32(f, Table(f, 2) + 20, 1); }, true),
       ErrorCode::kOutOfBounds, tensor0(20), "sizes and strides past the dims table"},
      {"tensor_extent",
       with(
           minimal, [](std::string& f) { Put64(f, Table(f, 5), 3); }, true),
       ErrorCode::kOutOfBounds, tensor0(24), "3 floats in an 8-byte storage"},
      {"tensor_storage_offset",
       with(
           minimal, [](std::string& f) { Put64(f, Table(f, 2) + 24, 1); }, true),
       ErrorCode::kOutOfBounds, tensor0(24), "storage_offset 1 pushes the view past its storage"},
      {"tensor_size_negative",
       with(
           minimal, [](std::string& f) { Put64(f, Table(f, 5), UINT64_MAX); }, true),
       ErrorCode::kBadShape, [](const std::string& f) { return Table(f, 5); }, "size -1 (2^64-1)"},
      {"tensor_extent_overflow",
       with(
           minimal,
           [](std::string& f) {
             Put64(f, Table(f, 5), uint64_t{1} << 62);
             Put64(f, Table(f, 5) + 8, uint64_t{1} << 62);
           },
           true),
       ErrorCode::kOverflow, [](const std::string& f) { return Table(f, 5) + 8; },
       "size and stride 2^62: the last element offset overflows at the stride"},
      {"tensor_numel_overflow",
       with(
           shared,
           [](std::string& f) {
             // Tensor #1 ("part"): sizes [2^62, 3], strides [0, 0].
             const uint64_t dims = Table(f, 5) + 8 * uint64_t{U32At(f, Table(f, 2) + 48 + 20)};
             Put64(f, dims, uint64_t{1} << 62);
             Put64(f, dims + 8, 3);
             Put64(f, dims + 16, 0);
             Put64(f, dims + 24, 0);
           },
           true),
       ErrorCode::kOverflow,
       [](const std::string& f) {
         return Table(f, 5) + 8 * uint64_t{U32At(f, Table(f, 2) + 48 + 20)} + 8;
       },
       "sizes [2^62, 3] with zero strides: 3 * 2^62 elements, above 2^63-1, at size 1"},
      {"empty_numel_overflow",
       with(
           empty_views,
           [](std::string& f) {
             // Tensor #1 ("huge"): sizes [2^62, 2^62, 0], which LibTorch refuses.
             const uint64_t dims = Table(f, 5) + 8 * uint64_t{U32At(f, Table(f, 2) + 48 + 20)};
             Put64(f, dims, uint64_t{1} << 62);
             Put64(f, dims + 8, uint64_t{1} << 62);
             Put64(f, dims + 16, 0);
           },
           true),
       ErrorCode::kOverflow,
       [](const std::string& f) {
         return Table(f, 5) + 8 * uint64_t{U32At(f, Table(f, 2) + 48 + 20)} + 8;
       },
       "empty, but sizes [2^62, 2^62, 0]: the non-zero sizes multiply past 2^63-1 at size 1"},
      {"tensor_sparse_without_role",
       with(
           minimal, [](std::string& f) { Put32(f, Table(f, 2) + 32, 0); }, true),
       ErrorCode::kInvalidValue, tensor0(32), "sparse index on a dense parameter"},
      {"tensor_device_type",
       with(
           minimal, [](std::string& f) { f[Table(f, 2) + 36] = 7; }, true),
       ErrorCode::kInvalidValue, tensor0(36), "device_type 7"},
      {"tensor_reserved",
       with(
           minimal, [](std::string& f) { f[Table(f, 2) + 44] = 1; }, true),
       ErrorCode::kReservedNonZero, tensor0(44), "a reserved tensor byte"},
      {"duplicate_tensor_name",
       with(
           shared,
           [](std::string& f) {
             const uint64_t t0 = Table(f, 2);
             Put32(f, t0 + 48, U32At(f, t0));  // tensor #1 takes tensor #0's name
             Put32(f, t0 + 48 + 4, U32At(f, t0 + 4));
           },
           true),
       ErrorCode::kDuplicateName, [](const std::string& f) { return Table(f, 2) + 48; },
       "two tensors named alike in one entry"},
      {"metadata_bad_type",
       with(
           meta, [](std::string& f) { f[Table(f, 4) + 8] = 9; }, true),
       ErrorCode::kInvalidValue, [](const std::string& f) { return Table(f, 4) + 8; },
       "metadata type 9"},
      {"metadata_unsorted",
       with(
           meta,
           [](std::string& f) {
             const uint64_t m = Table(f, 4);
             std::string a = f.substr(m, 32);
             f.replace(m, 32, f.substr(m + 32, 32));
             f.replace(m + 32, 32, a);
           },
           true),
       ErrorCode::kInvalidValue, [](const std::string& f) { return Table(f, 4) + 32; },
       "metadata records out of (entry, key) order"},
      {"sparse_bad_layout",
       with(
           sparse, [](std::string& f) { f[Table(f, 3) + 12] = 4; }, true),
       ErrorCode::kInvalidValue, [](const std::string& f) { return Table(f, 3) + 12; },
       "sparse layout 4"},
      {"sparse_component_elsewhere",
       with(
           sparse, [](std::string& f) { Put32(f, Table(f, 2) + 48 + 32, 1); }, true),
       ErrorCode::kInvalidValue, [](const std::string& f) { return Table(f, 2) + 48 + 32; },
       "the first component of sparse #0 names sparse #1"},
      // Format 1.1 (§4.10, R79-R93).
      {"flags_unknown_feature",
       with(
           minimal,
           [](std::string& f) {
             Put16(f, format::kOffMinor, 2);
             Put32(f, format::kOffFlags, 4);
           },
           false),
       ErrorCode::kUnsupportedVersion, fixed(format::kOffFlags),
       "minor 2 with feature bit 2, which format 1.2 does not define"},
      {"value_kind_bad",
       with(
           tree, [](std::string& f) { f[ValuesAt(f) + 32] = 99; }, true),
       ErrorCode::kInvalidValue, [](const std::string& f) { return ValuesAt(f) + 32; },
       "value #1 has kind 99"},
      {"value_link_backward",
       with(
           tree, [](std::string& f) { Put32(f, LinksAt(f), 0); }, true),
       ErrorCode::kInvalidValue, [](const std::string& f) { return LinksAt(f); },
       "the root's first link names the root itself"},
      {"value_two_parents",
       with(
           tree, [](std::string& f) { Put32(f, LinksAt(f) + 8, U32At(f, LinksAt(f))); }, true),
       ErrorCode::kInvalidValue, [](const std::string& f) { return LinksAt(f) + 8; },
       "two links of the root name value #1"},
      {"value_orphan",
       with(
           tree,
           [](std::string& f) {
             // The last list ("tail": ["x", "y"]) loses its last link: value
             // "y" is left without a parent. The link table gets 4 bytes
             // shorter, the index too; data_offset does not move.
             const uint32_t values = U32At(f, ih + 32), links = U32At(f, ih + 36);
             const uint64_t list = ValuesAt(f) + uint64_t{values - 3} * format::kValueRecordSize;
             Put32(f, list + 4, 1);
             for (uint32_t i = values - 2; i < values; ++i)
               Put32(f, ValuesAt(f) + uint64_t{i} * format::kValueRecordSize + 8, links - 1);
             Put32(f, LinksAt(f) + uint64_t{links - 1} * 4, 0);
             Put32(f, ih + 36, links - 1);
             Put64(f, format::kOffIndexSize, U64At(f, format::kOffIndexSize) - 4);
           },
           true),
       ErrorCode::kInvalidValue,
       [](const std::string& f) {
         return ValuesAt(f) + uint64_t{U32At(f, ih + 32) - 1} * format::kValueRecordSize;
       },
       "value \"y\" is named by no link"},
      {"layer_reserved",
       with(
           layer, [](std::string& f) { f[LayerAt(f) + 40] = 1; }, true),
       ErrorCode::kReservedNonZero, [](const std::string& f) { return LayerAt(f) + 40; },
       "a reserved byte of the layer record"},
      {"layer_depth_0",
       with(
           layer, [](std::string& f) { Put32(f, LayerAt(f) + 28, 0); }, true),
       ErrorCode::kInvalidValue, [](const std::string& f) { return LayerAt(f) + 28; },
       "a layer of depth 0 (a layer lies over at least one base)"},
      {"layer_path_absolute",
       with(
           layer, [](std::string& f) { f[Table(f, 6) + U32At(f, LayerAt(f) + 32)] = '/'; }, true),
       ErrorCode::kInvalidValue, [](const std::string& f) { return LayerAt(f) + 32; },
       "the base path \"/hared.tsar\" is absolute"},
      {"layer_tables_past_the_index",
       with(
           layer, [](std::string& f) { Put32(f, ih + 40, 1000); }, true),
       ErrorCode::kOutOfBounds, fixed(ih + 40),
       "base_storage_count 1000: a base storage table that does not fit in the index"},
      {"layer_base_storage_reserved",
       with(
           layer, [](std::string& f) { f[BaseStoragesAt(f) + 24] = 1; }, true),
       ErrorCode::kReservedNonZero, [](const std::string& f) { return BaseStoragesAt(f) + 24; },
       "a reserved byte of base storage #0"},
      {"layer_base_storage_out_of_range",
       with(
           layer, [](std::string& f) { Put32(f, BaseStoragesAt(f), 99); }, true),
       ErrorCode::kOutOfBounds, [](const std::string& f) { return BaseStoragesAt(f); },
       "base storage #0 names storage #99 of a base of 4 storages"},
      // Format 1.4 (§4.12, R100-R110), mutations of valid/tensor_parallel.
      {"tp_world_1",
       with(
           tp, [](std::string& f) { Put32(f, ih + 44, 1); }, true),
       ErrorCode::kInvalidValue, fixed(ih + 44), "a tensor-parallel archive for 1 rank"},
      {"shard_unsorted",
       with(
           tp, [](std::string& f) { Put32(f, ShardsAt(f) + 8, 0); }, true),
       ErrorCode::kInvalidValue, [](const std::string& f) { return ShardsAt(f) + 8; },
       "shard #1 names tensor #0 again"},
      {"shard_dim_out_of_range",
       with(
           tp, [](std::string& f) { Put32(f, ShardsAt(f) + 4, 5); }, true),
       ErrorCode::kBadShape, [](const std::string& f) { return ShardsAt(f) + 4; },
       "shard #0 splits the 2-d \"q.weight\" along dim 5"},
      {"shard_not_divisible",
       with(
           tp, [](std::string& f) { Put32(f, ShardsAt(f) + 4, 1); }, true),
       ErrorCode::kBadShape, [](const std::string& f) { return ShardsAt(f); },
       "shard #0 splits \"q.weight\" [4, 3] along dim 1, whose size 3 is not a multiple of 2"},
      {"shard_storage_nbytes",
       with(
           tp, [](std::string& f) { Put32(f, ih + 44, 4); }, true),
       ErrorCode::kInvalidValue, [](const std::string& f) { return ShardsAt(f); },
       "tp_world 4 in an archive laid out for 2: storage #0 is not 4 slices long"},
      {"shard_tied_unsharded",
       with(
           tp, [](std::string& f) { Put32(f, ShardsAt(f) + 3 * 8 + 4, 1); }, true),
       ErrorCode::kInvalidValue, [](const std::string& f) { return Table(f, 2) + 3 * 48 + 8; },
       "\"head.weight\" shares \"emb.weight\"'s storage but is split along dim 1, not 0"},
  };
  return v;
}

// valid/tensor_parallel (format 1.4, §4.12): an archive laid out for 2
// ranks, alignment 128. "q.weight" [4, 3] is split along dim 0 and "o.weight"
// [3, 4] along dim 1: slices of 24 bytes, 64 apart. "emb.weight" [4, 32] and
// its tied "head.weight" share one storage split along dim 0: slices of 256
// bytes, back to back, so the storage is the tensor in C order. "norm" is
// stored whole.
Draft TensorParallel() {
  Draft d(128);
  d.tp_world = 2;
  d.b.SetTensorParallel(2);
  d.Entry("model");
  auto sharded = [&d](const std::string& name, std::vector<int64_t> sizes, uint32_t dim,
                      uint8_t seed) {
    uint64_t numel = 1;
    for (int64_t x : sizes) numel *= static_cast<uint64_t>(x);
    const std::string c_order = Pattern(numel * 4, seed);
    format::ShardLayout l;
    format::ComputeShardLayout(sizes.data(), static_cast<uint32_t>(sizes.size()), dim, 4, 2, 128,
                               &l);
    std::string blocked(l.nbytes, '\0');
    format::GatherBlocked(l, reinterpret_cast<const uint8_t*>(c_order.data()), 0, l.nbytes,
                          reinterpret_cast<uint8_t*>(blocked.data()));
    const uint32_t s = d.Storage(blocked);
    TensorSpec t =
        T(name, s, DType::kFloat32, sizes, format::ShardStrides(sizes), 0, Role::kParameter);
    t.shard_dim = dim;
    d.Tensor(t);
    return t;
  };
  sharded("q.weight", {4, 3}, 0, 1);
  sharded("o.weight", {3, 4}, 1, 2);
  TensorSpec head = sharded("emb.weight", {4, 32}, 0, 3);
  head.name = "head.weight";
  d.Tensor(head);
  d.Tensor(T("norm", d.Storage(Floats({1.0f, 0.5f, 0.25f})), DType::kFloat32, {3}, {1}, 0,
             Role::kParameter));
  return d;
}

// valid/shared: views of one storage, a tied weight, 0-d and empty tensors.
Draft Shared() {
  Draft d;
  d.Entry("model");
  const uint32_t full = d.Storage(Floats({0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}));
  const uint32_t emb = d.Storage(Floats({0.5f, -0.5f, 1.5f, -1.5f, 2.5f, -2.5f}));
  const uint32_t scalar = d.Storage(Floats({42.0f}));
  const uint32_t none = d.Storage(std::string());
  d.Tensor(T("full", full, DType::kFloat32, {16}, {1}, 0, Role::kBuffer));
  d.Tensor(T("part", full, DType::kFloat32, {2, 4}, {4, 1}, 4, Role::kBuffer));
  d.Tensor(T("tr", full, DType::kFloat32, {4, 3}, {1, 4}, 0, Role::kBuffer));
  d.Tensor(T("emb.weight", emb, DType::kFloat32, {3, 2}, {2, 1}, 0, Role::kParameter));
  d.Tensor(T("head.weight", emb, DType::kFloat32, {3, 2}, {2, 1}, 0, Role::kParameter));
  d.Tensor(T("scalar", scalar, DType::kFloat32, {}, {}, 0, Role::kBuffer));
  d.Tensor(T("empty", none, DType::kFloat32, {0, 3}, {3, 1}, 0, Role::kBuffer));
  return d;
}

// valid/dtypes: one 2-element tensor of every dtype code of format 1.0 (1-18);
// valid/dtypes_1_3: the same for the codes format 1.3 added (19-22), a minor 3 archive.
Draft DtypesOf(uint16_t first, uint16_t last) {
  Draft d;
  d.Entry("zoo");
  for (DType dt : kAllDTypes) {
    const auto code = static_cast<uint16_t>(dt);
    if (code < first || code > last) continue;
    const uint32_t s = d.Storage(Pattern(2 * ElementSize(dt), static_cast<uint8_t>(dt)));
    d.Tensor(T(std::string(DTypeName(dt)), s, dt, {2}, {1}));
  }
  return d;
}
Draft Dtypes() { return DtypesOf(1, format::kLastDTypeCodeOfMinor2); }
Draft Dtypes13() { return DtypesOf(format::kFirstMinor3DTypeCode, format::kLastDTypeCode); }

// valid/entries_meta: two entries, metadata of every type at both scopes,
// requires_grad and a device hint.
Draft EntriesMeta() {
  Draft d;
  d.Entry("model");
  const uint32_t s = d.Storage(Floats({1, 2, 3, 4}));
  TensorSpec w = T("w", s, DType::kFloat32, {2, 2}, {2, 1}, 0, Role::kParameter);
  w.requires_grad = true;
  w.device_type = DeviceType::kCuda;
  w.device_index = 1;
  d.Tensor(w);
  d.Entry("ema");
  const uint32_t s2 = d.Storage(Floats({1.5f, 2.5f, 3.5f, 4.5f}));
  d.Tensor(T("w", s2, DType::kFloat32, {2, 2}, {2, 1}, 0, Role::kParameter));
  auto meta = [&](uint32_t entry, std::string key, MetaType type, int64_t i, double x,
                  std::string bytes, nlohmann::ordered_json value) {
    MetadataSpec m;
    m.entry = entry;
    m.key = key;
    m.type = type;
    m.int_value = i;
    m.float_value = x;
    m.bytes = bytes;
    d.Meta(m);
    static const char* const kTypes[] = {"", "string", "int", "float", "bytes"};
    d.meta.push_back({entry,
                      key,
                      {{"entry", entry == format::kNone ? nlohmann::ordered_json(nullptr)
                                                        : nlohmann::ordered_json(entry)},
                       {"key", key},
                       {"type", kTypes[static_cast<int>(type)]},
                       {"value", value}}});
  };
  meta(format::kNone, "step", MetaType::kInt, -10, 0, "", -10);
  meta(format::kNone, "lr", MetaType::kFloat, 0, 0.25, "", 0.25);
  meta(format::kNone, "arch", MetaType::kString, 0, 0, "tiny\xc3\xa9", "tiny\xc3\xa9");
  meta(format::kNone, "blob", MetaType::kBytes, 0, 0, std::string("\x00\xff\x10", 3), "00ff10");
  meta(1, "decay", MetaType::kFloat, 0, 0.999, "", 0.999);
  return d;
}

// valid/attached_files: attached files (§4.7.1) beside records that are not
// files: a name the grammar refuses, a string record, a per-entry record.
Draft AttachedFiles() {
  Draft d;
  d.Entry("model");
  d.Tensor(T("w", d.Storage(Floats({1, 2})), DType::kFloat32, {2}, {1}));
  auto meta = [&](uint32_t entry, std::string key, MetaType type, std::string value) {
    MetadataSpec m;
    m.entry = entry;
    m.key = key;
    m.type = type;
    m.bytes = value;
    d.Meta(m);
    std::string hex;
    for (const unsigned char c : value) {
      static const char kHex[] = "0123456789abcdef";
      hex += kHex[c >> 4];
      hex += kHex[c & 15];
    }
    d.meta.push_back({entry,
                      key,
                      {{"entry", entry == format::kNone ? nlohmann::ordered_json(nullptr)
                                                        : nlohmann::ordered_json(entry)},
                       {"key", key},
                       {"type", type == MetaType::kBytes ? "bytes" : "string"},
                       {"value", type == MetaType::kBytes ? hex : value}}});
    return hex;
  };
  d.files = nlohmann::ordered_json::object();
  d.files["config.json"] = meta(format::kNone, "file:config.json", MetaType::kBytes, "{}\n");
  d.files["t/v.txt"] = meta(format::kNone, "file:t/v.txt", MetaType::kBytes, "");
  meta(format::kNone, "file:../up", MetaType::kBytes, "x");  // ".." refused: metadata
  meta(format::kNone, "file:s.txt", MetaType::kString, "s");  // not bytes: metadata
  meta(0, "file:e.txt", MetaType::kBytes, "e");                // per entry: metadata
  return d;
}

// valid/aligned: alignment 128, so a 128-byte storage takes the large-storage
// rule of §4.4 and a 64-byte one the small rule, in a file under 4 KiB.
Draft Aligned() {
  Draft d(128);
  d.Entry("model");
  const uint32_t small = d.Storage(Pattern(8, 1));
  const uint32_t big = d.Storage(Pattern(128, 2));
  const uint32_t small2 = d.Storage(Pattern(64, 3));
  d.Tensor(T("a", small, DType::kInt64, {1}, {1}));
  d.Tensor(T("b", big, DType::kFloat64, {4, 4}, {4, 1}));
  d.Tensor(T("c", small2, DType::kUInt8, {64}, {1}));
  return d;
}

// valid/empty_views: views with a size of 0 reach no byte, so they are valid
// whatever their strides (§4.5, E3), as long as each size and stride is at
// most 2^63-1, their non-zero sizes multiply to at most 2^63-1 (R78) and
// storage_offset * element size is within the storage. "huge" sits on the R78
// limit: 7 * (2^63-1)/7 = 2^63-1, with the 0 between the two factors.
Draft EmptyViews() {
  Draft d;
  d.Entry("model");
  const uint32_t s = d.Storage(Floats({1.0f, 2.0f}));
  constexpr int64_t kMax = INT64_MAX;
  d.Tensor(T("at_end", s, DType::kFloat32, {0}, {1}, 2));
  d.Tensor(T("huge", s, DType::kFloat32, {7, 0, kMax / 7}, {kMax, kMax, kMax}));
  d.Tensor(T("wide", s, DType::kInt64, {0, 3}, {kMax, 1}, 1));
  return d;
}

// valid/sparse: a COO and a CSR sparse tensor (§4.6) next to a dense one,
// so that readers meet sparse records and rules R54-R65. Each component is a
// dense tensor of role 3 on its own storage.
Draft SparseTensors() {
  Draft d;
  d.Entry("model");
  auto component = [&d](const std::string& name, DType dtype, std::string bytes,
                        std::vector<int64_t> sizes, std::vector<int64_t> strides, uint32_t sparse) {
    TensorSpec t = T(name, d.Storage(std::move(bytes)), dtype, std::move(sizes), std::move(strides),
                     0, Role::kSparseComponent);
    t.sparse = sparse;
    d.Tensor(std::move(t));
  };
  auto ints = [](std::initializer_list<int64_t> v, size_t width) {
    std::string s(v.size() * width, '\0');
    size_t i = 0;
    for (int64_t x : v) {
      auto* p = reinterpret_cast<uint8_t*>(s.data()) + width * i++;
      if (width == 8) {
        format::StoreU64(p, static_cast<uint64_t>(x));
      } else {
        format::StoreU32(p, static_cast<uint32_t>(x));
      }
    }
    return s;
  };
  d.Tensor(
      T("bias", d.Storage(Floats({0.5f, -0.5f})), DType::kFloat32, {2}, {1}, 0, Role::kParameter));
  // adj = sparse_coo_tensor([[0, 2], [1, 0]], [1.0, 2.0], (3, 3)), coalesced.
  format::SparseSpec coo;
  coo.name = "adj";
  coo.layout = format::SparseLayout::kCoo;
  coo.coalesced = true;
  coo.sizes = {3, 3};
  coo.first_component = 1;
  const uint32_t adj = d.Sparse(coo);
  component("adj.indices", DType::kInt64, ints({0, 2, 1, 0}, 8), {2, 2}, {2, 1}, adj);
  component("adj.values", DType::kFloat32, Floats({1.0f, 2.0f}), {2}, {1}, adj);
  // m = sparse_csr_tensor([0, 1, 2], [1, 0], [3.0, 4.0], (2, 2)).
  format::SparseSpec csr;
  csr.name = "m";
  csr.layout = format::SparseLayout::kCsr;
  csr.sizes = {2, 2};
  csr.first_component = 3;
  const uint32_t m = d.Sparse(csr);
  component("m.crow_indices", DType::kInt32, ints({0, 1, 2}, 4), {3}, {1}, m);
  component("m.col_indices", DType::kInt32, ints({1, 0}, 4), {2}, {1}, m);
  component("m.values", DType::kFloat32, Floats({3.0f, 4.0f}), {2}, {1}, m);
  return d;
}

// valid/value_tree (format 1.1): what a training checkpoint holds, as a value
// tree (§4.10) with one value of every kind: a state_dict entry with
// attributes, a loose tensor, numbers of each kind, a bigint, strings, bytes,
// a list of a tuple, an int key, and an opaque argparse.Namespace whose pickle
// fragment has the parameter "model/w" in its one hole.
Draft ValueTree() {
  Draft d;
  d.Entry("model");
  d.Tensor(T("w", d.Storage(Floats({1.0f, 2.0f})), DType::kFloat32, {2}, {1}, 0, Role::kParameter));
  d.Entry("tensors");
  std::string step(8, '\0');
  step[0] = 5;
  d.Tensor(T("step", d.Storage(step), DType::kInt64, {}, {}, 0, Role::kTensor));
  using V = Value;
  V model = V::Entry("model", /*ordered=*/true);
  model.set_attributes(V::Dict(
      {{V::Str("_metadata"), V::Dict({{V::Str(""), V::Dict({{V::Str("version"), V::Int(1)}})}},
                                     /*ordered=*/true)}}));
  std::string big(9, '\0');  // 2^64
  big[8] = 1;
  const std::string ns_head = std::string("cargparse\nNamespace\n)\x81}(X\x01\x00\x00\x00w", 30);
  d.Tree(V::Dict({
      {V::Str("model"), model},
      {V::Str("step"), V::Tensor("tensors", "step")},
      {V::Str("epoch"), V::Int(3)},
      {V::Str("lr"), V::Float(0.25)},
      {V::Str("flag"), V::Bool(true)},
      {V::Str("none"), V::None()},
      {V::Str("big"), V::BigInt(big)},
      {V::Str("name"), V::Str("run\xc3\xa9")},
      {V::Str("raw"), V::Bytes(std::string("\x00\xff", 2))},
      {V::Str("groups"), V::List({V::Tuple({V::Int(1), V::Str("a")})})},
      {V::Int(7), V::Str("int key")},
      {V::Str("args"), V::Opaque("argparse.Namespace", {ns_head, "ub"}, {V::Tensor("model", "w")})},
      {V::Str("tail"), V::List({V::Str("x"), V::Str("y")})},
  }));
  return d;
}

// valid/layer: a layer over valid/shared.tsar (recorded as `path`): a new
// "full", the embedding (tied) and the scalar from the base.
Draft LayerOver(const std::string& shared, const std::string& path) {
  Draft d;
  d.Layer(shared, path);
  d.Entry("model");
  const uint32_t full =
      d.Storage(Floats({16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31}));
  const uint32_t emb = d.BaseStorage(1, Floats({0.5f, -0.5f, 1.5f, -1.5f, 2.5f, -2.5f}));
  const uint32_t scalar = d.BaseStorage(2, Floats({42.0f}));
  d.Tensor(T("full", full, DType::kFloat32, {16}, {1}, 0, Role::kBuffer));
  d.Tensor(T("emb.weight", emb, DType::kFloat32, {3, 2}, {2, 1}, 0, Role::kParameter));
  d.Tensor(T("head.weight", emb, DType::kFloat32, {3, 2}, {2, 1}, 0, Role::kParameter));
  d.Tensor(T("scalar", scalar, DType::kFloat32, {}, {}, 0, Role::kBuffer));
  return d;
}

std::string Tsv(std::string s) {
  for (char& c : s) {
    if (c == '\t' || c == '\n') c = ' ';
  }
  return s;
}

// The manifest of samples/layers/ (§8): each file opened, with its bases,
// from a scratch copy of samples/ whose working directory is layers/, so that
// messages name files as a reader in samples/layers/ sees them.
std::string LayersManifest(const std::vector<SampleFile>& files,
                           const std::vector<std::pair<std::string, std::string>>& layers) {
  char dir[] = "/tmp/tsar-samples-XXXXXX";
  if (mkdtemp(dir) == nullptr) throw std::runtime_error("mkdtemp failed");
  const std::string root = dir;
  for (const char* sub : {"/valid", "/layers"}) mkdir((root + sub).c_str(), 0755);
  for (const auto& f : files) {
    std::ofstream(root + "/" + f.path, std::ios::binary) << f.bytes;
  }
  const int cwd = open(".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (cwd < 0 || chdir((root + "/layers").c_str()) != 0) throw std::runtime_error("chdir failed");
  std::string manifest = "file\tcode\toffset\tmessage\tdescription\n";
  std::string failure;
  for (const auto& [file, what] : layers) {
    try {
      (void)ArchiveFile::open(file);
      failure = file + ": opened, but it was built to fail";
    } catch (const Error& e) {
      manifest += file + "\t" + ErrorCodeName(e.code()) + "\t" +
                  (e.offset() ? std::to_string(*e.offset()) : "") + "\t" + Tsv(e.what()) + "\t" +
                  Tsv(what) + "\n";
    }
  }
  if (fchdir(cwd) != 0) failure = "cannot return to the working directory";
  close(cwd);
  std::filesystem::remove_all(root);
  if (!failure.empty()) throw std::logic_error(failure);
  return manifest;
}

}  // namespace

std::vector<SampleFile> GenerateSamples() {
  std::vector<SampleFile> out;
  std::string minimal, shared, meta, sparse, aligned, empty_views, tree, tp;
  struct Named {
    const char* name;
    Draft (*make)();
  };
  const Named valid[] = {{"empty", [] { return Draft(); }},
                         {"minimal", Minimal},
                         {"shared", Shared},
                         {"dtypes", Dtypes},
                         {"dtypes_1_3", Dtypes13},
                         {"entries_meta", EntriesMeta},
                         {"attached_files", AttachedFiles},
                         {"aligned", Aligned},
                         {"empty_views", EmptyViews},
                         {"sparse", SparseTensors},
                         {"value_tree", ValueTree},
                         {"tensor_parallel", TensorParallel}};
  for (const Named& n : valid) {
    Draft d = n.make();
    const std::string bytes = d.Bytes();
    out.push_back({std::string("valid/") + n.name + ".tsar", bytes});
    out.push_back({std::string("valid/") + n.name + ".expected.json", d.Expected(bytes)});
    if (std::string(n.name) == "minimal") minimal = bytes;
    if (std::string(n.name) == "shared") shared = bytes;
    if (std::string(n.name) == "entries_meta") meta = bytes;
    if (std::string(n.name) == "sparse") sparse = bytes;
    if (std::string(n.name) == "aligned") aligned = bytes;
    if (std::string(n.name) == "empty_views") empty_views = bytes;
    if (std::string(n.name) == "value_tree") tree = bytes;
    if (std::string(n.name) == "tensor_parallel") tp = bytes;
  }
  std::string layer;
  {
    Draft d = LayerOver(shared, "shared.tsar");
    layer = d.Bytes();
    out.push_back({"valid/layer.tsar", layer});
    out.push_back({"valid/layer.expected.json", d.Expected(layer)});
  }
  std::string manifest = "file\tcode\toffset\tmessage\tdescription\n";
  for (const Invalid& inv :
       InvalidCatalogue(minimal, shared, meta, sparse, aligned, empty_views, tree, layer, tp)) {
    const std::string bytes = inv.make();
    const std::string file = std::string(inv.name) + ".tsar";
    try {
      format::Index::ParseBytes(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), file);
      throw std::logic_error(file + ": parsed, but it was built to fail");
    } catch (const Error& e) {
      const uint64_t want = inv.offset(bytes);
      if (e.code() != inv.code || e.offset().value_or(UINT64_MAX) != want) {
        throw std::logic_error(file + ": expected " + ErrorCodeName(inv.code) + " at " +
                               std::to_string(want) + ", got " + e.what());
      }
      manifest += file + "\t" + ErrorCodeName(e.code()) + "\t" + std::to_string(want) + "\t" +
                  Tsv(e.what()) + "\t" + Tsv(inv.what) + "\n";
    }
    out.push_back({"invalid/" + file, bytes});
  }
  out.push_back({"invalid/MANIFEST.tsv", manifest});

  // §4.11 resolution failures: valid alone, refused when opened with their bases.
  // The last three name the right base but lie about it in their layer
  // record or base storage table (refixed): B4, B5, B6.
  const auto lying = [&](const std::function<void(std::string&)>& edit) {
    std::string f = LayerOver(shared, "../valid/shared.tsar").Bytes();
    edit(f);
    Refix(f);
    return f;
  };
  const std::vector<std::pair<std::string, std::string>> layers = {
      {"wrong_base.tsar",
       "a layer over valid/shared.tsar whose base path names valid/minimal.tsar"},
      {"missing_base.tsar", "a layer whose base file does not exist"},
      {"cycle.tsar", "a layer whose base path names itself"},
      {"impostor_base.tsar",
       "a layer over valid/shared.tsar whose base path names other_shared.tsar, of the same "
       "size, whose tensor \"full\" is named \"fuLL\""},
      {"depth_wrong.tsar", "a layer over valid/shared.tsar (a plain archive) that says depth 2"},
      {"storage_count_wrong.tsar",
       "a layer over valid/shared.tsar (4 storages) that says its base has 5"},
      {"base_storage_differs.tsar",
       "a layer over valid/shared.tsar whose base storage #0 says 32 bytes, where the base's "
       "storage #1 has 24"}};
  const std::string bytes[] = {
      LayerOver(shared, "../valid/minimal.tsar").Bytes(),
      LayerOver(shared, "missing.tsar").Bytes(),
      LayerOver(shared, "cycle.tsar").Bytes(),
      LayerOver(shared, "other_shared.tsar").Bytes(),
      lying([](std::string& f) { Put32(f, LayerAt(f) + 28, 2); }),
      lying([](std::string& f) { Put32(f, LayerAt(f) + 24, 5); }),
      lying([](std::string& f) { Put64(f, BaseStoragesAt(f) + 8, 32); })};
  {
    std::string other = shared;  // same size, one name changed: a different index
    const size_t at = other.find("full");
    other.replace(at, 4, "fuLL");
    Refix(other);
    out.push_back({"layers/other_shared.tsar", other});
  }
  for (size_t i = 0; i < layers.size(); ++i) {
    out.push_back({"layers/" + layers[i].first, bytes[i]});
  }
  out.push_back({"layers/MANIFEST.tsv", LayersManifest(out, layers)});
  return out;
}

}  // namespace tsar::testing
