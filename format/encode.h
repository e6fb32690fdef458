// The deterministic encoder of spec/FORMAT.md §4: lays out storages and builds
// the bytes of header and index. Pure C++; the writer streams the data itself.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "format/spec.h"
#include "tsar/dtype.h"

namespace tsar::format {

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
};

struct SparseSpec {
  std::string name;
  SparseLayout layout = SparseLayout::kCoo;
  bool coalesced = false;
  std::vector<int64_t> sizes;
  uint32_t first_component = 0;  // tensor index of its first component
};

struct MetadataSpec {
  uint32_t entry = kNone;  // kNone: archive-level
  std::string key;
  MetaType type = MetaType::kInt;
  int64_t int_value = 0;
  double float_value = 0;
  std::string bytes;  // kString, kBytes
};

// Collects entries, storages, tensors and metadata, then lays them out by the
// rules of §4.4 and encodes §4.1-§4.8. Misuse (a duplicate name, a view out of
// its storage...) throws tsar::Error kInvalidArgument or kDuplicateName naming
// the tensor. Not thread-safe.
class IndexBuilder {
 public:
  // alignment: a power of two in [64, 2^30]; else kInvalidArgument.
  explicit IndexBuilder(uint32_t alignment = kDefaultAlignment);

  // Starts a new entry; the tensors added next belong to it. Returns its index.
  uint32_t AddEntry(const std::string& name);
  uint32_t AddStorage(uint64_t nbytes);
  // Adds a tensor to the current entry; returns its index in the tensor table.
  uint32_t AddTensor(TensorSpec t);
  uint32_t AddSparse(SparseSpec s);
  void AddMetadata(MetadataSpec m);

  uint32_t entry_count() const { return static_cast<uint32_t>(entries_.size()); }
  uint32_t storage_count() const { return static_cast<uint32_t>(storage_nbytes_.size()); }
  uint64_t storage_nbytes(uint32_t i) const { return storage_nbytes_[i]; }

  // Computes the layout. After it, storage_offset(), data_offset() and
  // file_size() are valid and nothing more may be added.
  void Plan();
  uint64_t data_offset() const { return data_offset_; }
  uint64_t file_size() const { return file_size_; }
  uint64_t storage_offset(uint32_t i) const { return storage_offsets_[i]; }

  void SetStorageChecksum(uint32_t i, uint64_t xxh3) { storage_xxh3_[i] = xxh3; }

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

  uint32_t alignment_;
  bool planned_ = false;
  std::vector<Entry> entries_;
  std::vector<uint64_t> storage_nbytes_;
  std::vector<uint64_t> storage_xxh3_;
  std::vector<uint64_t> storage_offsets_;
  std::vector<TensorSpec> tensors_;
  std::vector<SparseItem> sparse_;
  std::vector<MetadataSpec> metadata_;
  uint64_t index_size_ = 0;
  uint64_t data_offset_ = 0;
  uint64_t file_size_ = 0;
};

}  // namespace tsar::format
