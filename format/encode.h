// The deterministic encoder of spec/FORMAT.md §4: lays out storages and builds
// the bytes of header and index. Pure C++; the writer streams the data itself.
#pragma once

#include <cstdint>
#include <set>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include "format/spec.h"
#include "format/values.h"
#include "tsar/dtype.h"

namespace tsar::format {

// One tensor record (§4.5). `sizes` and `strides` are in elements and have one
// value per dimension; `sparse` is kNone unless `role` is kSparseComponent.
struct TensorSpec {
  std::string name;
  uint32_t storage = 0;
  DType dtype = DType::kFloat32;
  Role role = Role::kTensor;
  bool requires_grad = false;
  std::vector<int64_t> sizes;
  std::vector<int64_t> strides;
  uint64_t storage_offset = 0;  // in elements
  DeviceType device_type = DeviceType::kUnspecified;
  uint16_t device_index = 0;
  uint32_t sparse = kNone;
  // §4.12 (format 1.4): the dimension this tensor is split along for the
  // ranks of SetTensorParallel, or kNone. A sharded tensor is C-contiguous
  // from offset 0, and its storage holds the slices blocked (ShardLayout).
  uint32_t shard_dim = kNone;
};

// One sparse record (§4.6); it belongs to the entry current when it is added.
// Its components are the 2 (COO) or 3 (CSR, CSC) tensors of that entry from
// `first_component` on, each with role kSparseComponent and `sparse` set to
// the index AddSparse returns for it.
//
// With layout kGroup, a tensor group (§4.13, format 1.5, header flag
// kFeatureTensorGroups): `component_count` (1 to 64) components, the outer
// `dtype`, `sizes` and `strides`; its entry needs a string metadata record
// "group:" + name, its description (R112).
struct SparseSpec {
  std::string name;
  SparseLayout layout = SparseLayout::kCoo;
  bool coalesced = false;
  std::vector<int64_t> sizes;
  uint32_t first_component = 0;  // tensor index of its first component
  // Groups only:
  DType dtype = DType::kFloat32;
  std::vector<int64_t> strides;
  uint32_t component_count = 0;
};

// The number of components of a sparse record (§5.5): 2 for COO, 3 for CSR
// and CSC, the spec's own for a group.
inline uint32_t ComponentCount(const SparseSpec& s) {
  return s.layout == SparseLayout::kGroup ? s.component_count
         : s.layout == SparseLayout::kCoo ? 2
                                          : 3;
}

// One metadata record (§4.7).
struct MetadataSpec {
  uint32_t entry = kNone;  // kNone: archive-level
  std::string key;
  MetaType type = MetaType::kInt;
  int64_t int_value = 0;
  double float_value = 0;
  std::string bytes;  // kString, kBytes
};

// §4.11 (format 1.2): the base an archive is a layer over.
struct LayerSpec {
  uint64_t base_id_low = 0;  // XXH3-128 of the base's bytes [0, data_offset)
  uint64_t base_id_high = 0;
  uint64_t base_file_size = 0;
  uint32_t base_storage_count = 0;  // storages a tensor of the base may name
  uint32_t depth = 1;               // 1 + the base's depth (0 for a plain archive)
  std::string base_path;            // relative to the archive's directory
};

// R22-R24 for a name or key: 1 to 65535 bytes of valid UTF-8. `what` is
// "entry", "tensor", "sparse tensor" or "metadata", `field` "name" or "key".
// Throws kInvalidArgument ("tensor \"\": name: expected 1 to 65535 bytes...").
void CheckName(const std::string& what, const std::string& name, const char* field = "name");

// Collects entries, storages, tensors, sparse records, metadata and a value
// tree, then lays them out by the rules of §4.4 and encodes §4.1-§4.10. It
// refuses every input from which it would write an archive that breaks a rule
// of §6 (R1-R75, R77-R93), so whatever EncodeHead() returns passes Index::Parse. A refused call
// throws tsar::Error naming the tensor, sparse tensor, entry or metadata key,
// with no path and no offset, and leaves the builder as it was:
//   kInvalidArgument  a value outside its enumeration, an empty, too long or
//                     non-UTF-8 name, a negative size or stride, a view out of
//                     its storage, requires_grad on a dtype that is not
//                     floating-point or complex (R77), inconsistent sparse
//                     references, a call after Plan() (or EncodeHead() before it);
//   kOverflow         a view whose element count passes 2^63-1 or whose extent
//                     passes 2^64 (R50-R52), an empty view whose non-zero sizes
//                     multiply past 2^63-1 (R78), or a layout past 2^64;
//   kDuplicateName    a name or metadata key used twice in its scope.
// Not thread-safe.
class IndexBuilder {
 public:
  // alignment: a power of two in [64, 2^30]; else kInvalidArgument.
  explicit IndexBuilder(uint32_t alignment = kDefaultAlignment);

  // Starts a new entry; the tensors added next belong to it. Returns its index.
  uint32_t AddEntry(const std::string& name);
  // Adds a storage of `nbytes` bytes; returns its index.
  uint32_t AddStorage(uint64_t nbytes);
  // Adds a tensor to the current entry; returns its index in the tensor table.
  // Checks R35-R53, R77 and R78 for it at once; its sparse references wait
  // for Plan().
  uint32_t AddTensor(TensorSpec t);
  // Adds a sparse record or a group to the current entry; returns its index.
  // Checks R54, R56-R62 and R111 at once; R63-R65 (the components) and R112
  // (a group's description) wait for Plan().
  uint32_t AddSparse(SparseSpec s);
  // Adds a metadata record; `entry` must be kNone or an entry already added.
  void AddMetadata(MetadataSpec m);

  // Sets the value tree (§4.10, format 1.1): values[0] is the root, every
  // link names a later value, and every value but the root is named by one
  // link. An archive with a tree is written as format 1.1 with header flag
  // kFeatureValueTree; one without as 1.0. Checked by Plan() (R82-R93, with
  // what the tree refers to), which refuses a bad tree with kInvalidArgument
  // naming the value.
  void SetValues(std::vector<ValueSpec> values);

  uint32_t entry_count() const { return static_cast<uint32_t>(entries_.size()); }
  // Makes the archive a layer over a base (format 1.2, header flag
  // kFeatureLayers): checks R96 and R97 (kInvalidArgument). Once only.
  void SetLayer(LayerSpec layer);
  // Adds a storage of the base to the base storage table (after SetLayer and
  // every AddStorage): `base_storage` is its index in the base, `nbytes` and
  // `xxh3` its record's. Returns the index tensors name it by (own storages
  // come first). Checks R99.
  uint32_t AddBaseStorage(uint32_t base_storage, uint64_t nbytes, uint64_t xxh3);

  // Lays the archive out for `world` tensor-parallel ranks (format 1.4,
  // header flag kFeatureTensorParallel, §4.12): before any tensor with a
  // shard_dim is added. `world` is 2 to 65536 (R100); else kInvalidArgument.
  void SetTensorParallel(uint32_t world);

  // The archive's own storages (those AddStorage added).
  uint32_t storage_count() const { return static_cast<uint32_t>(storage_nbytes_.size()); }
  uint64_t storage_nbytes(uint32_t i) const { return storage_nbytes_[i]; }

  // Checks what needs the whole input (sparse references R43, R63-R65,
  // unique names R66, group descriptions R112, index_size R8) and computes the layout. After it,
  // storage_offset(), data_offset() and file_size() are valid and every Add*
  // call is refused. Calling it again does nothing.
  void Plan();
  uint64_t data_offset() const { return data_offset_; }
  uint64_t file_size() const { return file_size_; }
  uint64_t storage_offset(uint32_t i) const { return storage_offsets_[i]; }

  // Records storage i's XXH3-64 (§4.4); before or after Plan(). An unknown i
  // is kInvalidArgument.
  void SetStorageChecksum(uint32_t i, uint64_t xxh3);

  // The file's bytes [0, data_offset): header, index and zero padding, with
  // index_xxh3 filled in. Requires Plan().
  std::vector<uint8_t> EncodeHead() const;

 private:
  struct Entry {
    std::string name;
    uint32_t first_tensor;
    uint32_t tensor_count;
  };
  struct SparseItem {
    SparseSpec spec;
    uint32_t entry;
  };

  struct BaseStorage {
    uint32_t base_storage;
    uint64_t nbytes;
    uint64_t xxh3;
  };

  void RequireNotPlanned(const char* call) const;
  // nbytes of storage i, own or of the base (i < storage_count() + base storages).
  uint64_t AnyStorageNbytes(uint32_t i) const;
  uint64_t AnyStorageCount() const { return storage_nbytes_.size() + base_storages_.size(); }
  void CheckSparse() const;
  void CheckGroupDescriptions() const;  // R112
  bool has_groups_ = false;
  void CheckShardedStorages() const;  // R110
  void CheckValues() const;
  // Writes the value and link tables at `values_p` (and its bytes into the
  // blob at `blob_p` + *blob), as §4.10 and the blob order of §4.9 say.
  void EncodeValues(uint8_t* values_p, uint8_t* blob_p, uint64_t* blob) const;

  uint32_t alignment_;
  bool planned_ = false;
  std::vector<Entry> entries_;
  std::unordered_set<std::string> entry_names_;
  std::set<std::pair<uint32_t, std::string>> metadata_keys_;
  std::vector<uint64_t> storage_nbytes_;
  std::vector<uint64_t> storage_xxh3_;
  std::vector<uint64_t> storage_offsets_;
  std::vector<TensorSpec> tensors_;
  std::vector<SparseItem> sparse_;
  std::vector<MetadataSpec> metadata_;
  std::vector<ValueSpec> values_;
  uint16_t dtype_minor_ = 0;  // the lowest minor that defines every dtype added
  bool has_layer_ = false;
  LayerSpec layer_;
  uint32_t tp_world_ = 0;     // SetTensorParallel's world, 0 without
  uint32_t shard_count_ = 0;  // tensors with a shard_dim
  std::vector<BaseStorage> base_storages_;
  uint64_t link_count_ = 0;
  uint64_t index_size_ = 0;
  uint64_t data_offset_ = 0;
  uint64_t file_size_ = 0;
};

}  // namespace tsar::format
