// What every view of an archive keeps alive (ArchiveFile, Archive, each
// tensor): the mapped bytes and the index that describes them, with the
// lookups both use. No LibTorch here. Registered with the fault handler
// while it lives.
#pragma once

#include <sys/types.h>

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "format/index.h"
#include "loader/mapping.h"
#include "tsar/archive_file.h"

namespace tsar {

struct ArchiveCore {
  ArchiveCore(std::string path, format::Index index, std::unique_ptr<Mapping> mapping);
  ~ArchiveCore();
  std::string path;
  format::Index index;
  std::unique_ptr<Mapping> mapping;

  // Where storage i's bytes are: in this file's mapping, or (a layer, spec
  // §4.11) in a base's, `layer` files down the chain, as storage `storage` of
  // `owner`.
  struct Source {
    uint8_t* data = nullptr;
    const ArchiveCore* owner = nullptr;
    uint32_t storage = 0;
    uint32_t layer = 0;
  };
  std::vector<Source> sources;  // one per index.storages()
  // The base of a layer (null for a plain archive): it keeps the base's
  // mapping, and its own base's, alive while this archive lives.
  std::shared_ptr<const ArchiveCore> base;

  uint8_t* StorageData(uint32_t i) const { return sources[i].data; }

  // §4.12: storages holding a sharded tensor's slices, copied to C order on
  // first use by ArchiveFile::storage_values (loader/unblocked.cc).
  mutable std::mutex unblocked_mutex;
  mutable std::map<uint32_t, std::vector<uint8_t>> unblocked;
  mutable std::vector<uint32_t> sharded_tensor_of;  // storage -> a sharded tensor or kNone

  // Entry index for a user-given entry name ("" = first); throws kNotFound.
  uint32_t Entry(const std::string& entry) const;
  // The entry bind() uses: `entry`, or when it is empty the only entry, the
  // one named "model", or the only one holding parameters or buffers; else
  // kNotFound listing the entries.
  uint32_t BindEntry(const std::string& entry) const;
  // Tensor-table index; throws kNotFound naming what exists.
  uint32_t Find(const std::string& name, const std::string& entry) const;
  // Index in the sparse table of the sparse tensor `name` of `entry`, or kNone.
  uint32_t FindSparse(uint32_t entry, std::string_view name) const;
  // "entry/name" of a tensor record.
  std::string QualifiedName(uint32_t tensor) const;

  // Calls f(name, tensor, sparse) for each tensor a user sees in `entry`, in
  // file order: a dense tensor (sparse == kNone), or a sparse tensor in the
  // place of its first component (tensor == kNone). Components are skipped.
  template <typename F>
  void ForEachVisible(uint32_t entry, F&& f) const {
    const format::EntryRecord& e = index.entries()[entry];
    for (uint32_t t = e.first_tensor; t < e.first_tensor + e.tensor_count; ++t) {
      const format::TensorRecord& rec = index.tensors()[t];
      if (rec.role != format::Role::kSparseComponent) {
        f(rec.name, t, format::kNone);
      } else if (index.sparse()[rec.sparse].first_component == t) {
        f(index.sparse()[rec.sparse].name, format::kNone, rec.sparse);
      }
    }
  }
};

// A metadata record's value, as ArchiveFile::metadata() gives it.
MetadataValue MetadataValueOf(const format::MetadataRecord& m);

// The files of a layer chain being opened, by device and inode: a file met
// twice is a cycle (loader/layers.cc).
using LayerChain = std::vector<std::pair<dev_t, ino_t>>;

// Opens, validates and maps one archive and, for a layer, its bases
// (loader/archive_file.cc).
std::shared_ptr<const ArchiveCore> OpenCore(const std::string& path, const OpenOptions& options,
                                            LayerChain* chain);
// §4.11: finds the base of `core` (a layer), opens it through OpenCore,
// checks it is the base the layer was packed against and points the layer's
// base storages at its bytes (loader/layers.cc).
void AttachBase(ArchiveCore& core, const OpenOptions& options, LayerChain* chain);

// Fault handler registry (loader/fault_handler.cc).
void RegisterMapping(const ArchiveCore* core);
void UnregisterMapping(const ArchiveCore* core);

}  // namespace tsar
