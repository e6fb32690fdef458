// The decoded header and index of a tsar archive (spec/FORMAT.md §4) and the
// validating decoder of §6. Pure C++: no LibTorch, no file I/O.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "format/checksum.h"
#include "format/name_table.h"
#include "format/spec.h"
#include "format/tensor_parallel.h"
#include "format/values.h"
#include "tsar/dtype.h"
#include "tsar/error.h"

namespace tsar::format {

class ByteReader;  // format/reader.h

// §4.1, decoded.
struct Header {
  uint16_t major = 0;
  uint16_t minor = 0;
  uint32_t header_size = 0;
  uint64_t file_size = 0;
  uint64_t index_offset = 0;
  uint64_t index_size = 0;
  uint64_t data_offset = 0;
  uint32_t alignment = 0;
  uint32_t flags = 0;
  uint64_t index_xxh3 = 0;
};

// §4.3
struct EntryRecord {
  std::string_view name;
  uint32_t first_tensor = 0;
  uint32_t tensor_count = 0;
};

// §4.4; `offset` is absolute in the file. In a layer (§4.11) the storages of
// the base storage table follow the archive's own: their `base_storage` is the
// storage's index in the base archive, their `offset` 0 (their bytes are in
// the base); own storages have base_storage kNone.
struct StorageRecord {
  uint64_t offset = 0;
  uint64_t nbytes = 0;
  uint64_t xxh3 = 0;
  uint32_t base_storage = kNone;
};

// §4.11 (format 1.2): the layer record of an archive with header flag
// kFeatureLayers. The base is identified by the XXH3-128 of its head.
struct LayerRecord {
  uint64_t base_id_low = 0;
  uint64_t base_id_high = 0;
  uint64_t base_file_size = 0;
  uint32_t base_storage_count = 0;
  uint32_t depth = 0;
  std::string_view base_path;  // relative to the archive's directory
};

// §4.5. `dims_index` indexes Index::dims(): sizes are dims()[dims_index ..
// dims_index + ndim), strides follow at dims_index + ndim.
struct TensorRecord {
  std::string_view name;
  uint32_t storage = 0;
  DType dtype = DType::kFloat32;
  Role role = Role::kTensor;
  bool requires_grad = false;
  uint32_t ndim = 0;
  uint32_t dims_index = 0;
  uint64_t storage_offset = 0;  // in elements
  uint32_t sparse = kNone;
  DeviceType device_type = DeviceType::kUnspecified;
  uint16_t device_index = 0;
  uint32_t entry = 0;           // derived from the entry table
  uint64_t numel = 0;           // derived: product of sizes
  uint64_t nbytes_spanned = 0;  // derived: bytes of the storage this view can reach
  // §4.12 (format 1.4): the dimension a tensor-parallel archive splits this
  // tensor along (its storage then holds the world's slices, blocked), or
  // kNone for a tensor stored whole.
  uint32_t shard_dim = kNone;
};

// §4.6; with layout kGroup, a tensor group (§4.13, format 1.5): `dtype` is
// its outer dtype, and its dims are 2 x ndim values, outer sizes then strides.
struct SparseRecord {
  std::string_view name;
  uint32_t entry = 0;
  SparseLayout layout = SparseLayout::kCoo;
  bool coalesced = false;
  DType dtype = DType::kFloat32;  // groups only
  uint32_t ndim = 0;
  uint32_t dims_index = 0;
  uint32_t first_component = 0;
  uint32_t component_count = 0;
};

// §4.7
struct MetadataRecord {
  std::string_view key;
  MetaType type = MetaType::kInt;
  uint32_t entry = kNone;  // kNone: archive-level
  int64_t int_value = 0;
  double float_value = 0;
  std::string_view bytes;  // kString and kBytes
};

// Decodes §4.1 from the first bytes of a file, checking rules R1-R13 and R79 of §6.3
// (the rules that need only the header), in order. `data` holds the file's
// bytes [0, size); `file_size` is the actual size of the file. The result does
// not point into `data`. Throws tsar::Error: kBadMagic (R1), kTruncated (R2,
// R5), kUnsupportedVersion (R3, R79), kInvalidValue (R4, R6-R8, R10, R12),
// kOutOfBounds (R9, R11), kReservedNonZero (R13). Thread-safe.
Header DecodeHeader(const uint8_t* data, uint64_t size, uint64_t file_size,
                    const std::string& path);

// A fully validated index. It owns a private copy of the bytes [0,
// data_offset) of the file, so nothing it returns changes if the file does.
// Move-only; immutable after Parse, so const access is thread-safe.
class Index {
 public:
  // Decodes and validates header and index: rules R1-R75 and R77-R99 of
  // §6.3, in the order §6.3 lists them (not R76, the storage checksums). `head` holds the file's
  // bytes [0, n) with n >= the header's data_offset (extra bytes are dropped; fewer is R14,
  // kTruncated); `file_size` is the actual size of the file. Throws tsar::Error with the code,
  // offset and message of the first rule broken (§6.2, §6.7), naming `path`.
  static Index Parse(std::vector<uint8_t> head, uint64_t file_size, const std::string& path);

  // Convenience for in-memory archives: parses the whole byte string.
  static Index ParseBytes(const uint8_t* data, uint64_t size, const std::string& path);

  Index(Index&&) noexcept = default;
  Index& operator=(Index&&) noexcept = default;
  Index(const Index&) = delete;
  Index& operator=(const Index&) = delete;

  const Header& header() const { return header_; }
  const std::vector<EntryRecord>& entries() const { return entries_; }
  // Every storage a tensor may name: the archive's own, then (in a layer)
  // those of its base storage table.
  const std::vector<StorageRecord>& storages() const { return storages_; }
  uint32_t own_storage_count() const { return own_storage_count_; }
  // §4.11: whether the archive is a layer over a base (flag kFeatureLayers),
  // and its layer record (valid only then).
  bool is_layer() const { return (header_.flags & kFeatureLayers) != 0; }
  const LayerRecord& layer() const { return layer_; }
  // §4.12 (format 1.4): the number of ranks a tensor-parallel archive (flag
  // kFeatureTensorParallel) is laid out for, else 0. Its sharded tensors have
  // a shard_dim; ShardLayoutOf gives where each rank's slice lies.
  uint32_t tp_world() const { return tp_world_; }
  uint32_t shard_count() const { return shard_count_; }
  // Where sharded tensor `t`'s slices lie in its storage (t.shard_dim set).
  ShardLayout ShardLayoutOf(const TensorRecord& t) const;
  // §4.11: the identity a layer records of this archive as its base: the
  // XXH3-128 of the validated bytes [0, data_offset).
  Hash128 Identity() const { return Xxh3x128(head_.data(), head_.size()); }
  const std::vector<TensorRecord>& tensors() const { return tensors_; }
  const std::vector<SparseRecord>& sparse() const { return sparse_; }
  const std::vector<MetadataRecord>& metadata() const { return metadata_; }
  // The metadata record (entry, key) (entry kNone: archive-level), or nullptr.
  const MetadataRecord* FindMetadata(uint32_t entry, std::string_view key) const;
  // §4.13 (format 1.5): whether sparse record s is a tensor group, and its
  // description (the JSON text of its "group:" metadata record, R112).
  bool IsGroup(uint32_t s) const { return sparse_[s].layout == SparseLayout::kGroup; }
  std::string_view GroupDescription(uint32_t s) const;
  const std::vector<int64_t>& dims() const { return dims_; }
  // §4.10 (format 1.1): the value tree, empty when the archive has none
  // (header flag kFeatureValueTree clear). Value #0 is the root; value i's
  // links are links()[first_link .. first_link + count).
  const std::vector<ValueRecord>& values() const { return values_; }
  const std::vector<uint32_t>& links() const { return links_; }

  const int64_t* sizes(const TensorRecord& t) const { return dims_.data() + t.dims_index; }
  const int64_t* strides(const TensorRecord& t) const {
    return dims_.data() + t.dims_index + t.ndim;
  }
  // Index of the entry named `name`, or kNone.
  uint32_t FindEntry(std::string_view name) const { return entry_names_.Find(name); }
  // Tensor-table index of tensor `name` in entry `entry`, or kNone. (A name
  // that belongs to a sparse record is not a tensor: kNone.)
  uint32_t FindTensor(uint32_t entry, std::string_view name) const {
    const uint32_t i = tensor_names_[entry].Find(name);
    return i < entries_[entry].tensor_count ? entries_[entry].first_tensor + i : kNone;
  }
  // Absolute file offset of tensor record i (for error messages).
  uint64_t TensorRecordOffset(uint32_t i) const;
  // Of storage i's record: in the storage table, or for a base storage in
  // the base storage table (§4.11).
  uint64_t StorageRecordOffset(uint32_t i) const;
  // Absolute file offset of the layer record (§4.11); valid in a layer.
  uint64_t LayerRecordOffset() const { return table_offset_[9]; }
  // Absolute file offset of shard record j (§4.12); valid in a tensor-parallel archive.
  uint64_t ShardRecordOffset(uint32_t j) const { return table_offset_[11] + uint64_t{j} * kShardRecordSize; }

 private:
  Index() = default;
  void Decode(const std::string& path);
  void DecodeLayer(const ByteReader& r, uint64_t blob, uint64_t blob_size, uint32_t ref_count);
  void DecodeShards(const ByteReader& r);
  void DecodeSparse(const ByteReader& r, uint64_t blob, uint64_t blob_size);
  void DecodeMetadata(const ByteReader& r, uint64_t blob, uint64_t blob_size);
  void CheckGroupDescriptions(const ByteReader& r) const;

  std::vector<uint8_t> head_;
  Header header_;
  // §4.2 tables, blob, then §4.10 values and links, §4.11 layer record and
  // base storage table, §4.12 shard table.
  uint64_t table_offset_[12] = {};
  uint32_t tp_world_ = 0;
  uint32_t shard_count_ = 0;
  uint32_t own_storage_count_ = 0;
  LayerRecord layer_;
  std::vector<EntryRecord> entries_;
  std::vector<StorageRecord> storages_;
  std::vector<TensorRecord> tensors_;
  std::vector<SparseRecord> sparse_;
  std::vector<MetadataRecord> metadata_;
  std::vector<int64_t> dims_;
  std::vector<ValueRecord> values_;
  std::vector<uint32_t> links_;
  NameTable entry_names_;
  std::vector<NameTable> tensor_names_;  // per entry: tensors then sparse records
};

}  // namespace tsar::format
