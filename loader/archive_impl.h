// Internals of tsar::Archive shared by the loader's translation units.
#pragma once

#include <c10/core/Storage.h>

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "format/index.h"
#include "loader/mapping.h"
#include "tsar/archive.h"

namespace tsar {

// What every tensor of an archive keeps alive: the bytes and the index that
// describes them. Registered with the fault handler while it lives.
struct ArchiveCore {
  ArchiveCore(std::string path, format::Index index, std::unique_ptr<Mapping> mapping);
  ~ArchiveCore();
  std::string path;
  format::Index index;
  std::unique_ptr<Mapping> mapping;
};

struct Archive::Impl {
  std::shared_ptr<const ArchiveCore> core;

  // The c10::Storage of archive storage i, made on first use (so open() costs
  // no allocation per storage); thread-safe; one per storage for the life of
  // the Archive, which is what makes tensors of one storage alias again.
  const c10::Storage& Storage(uint32_t i) const;

  const format::Index& index() const { return core->index; }
  // Entry index for a user-given entry name ("" = first); throws kNotFound.
  uint32_t Entry(const std::string& entry) const;
  // The entry bind() uses: `entry`, or when it is empty the only entry, the
  // one named "model", or the only one holding parameters or buffers; else
  // kNotFound listing the entries.
  uint32_t BindEntry(const std::string& entry) const;
  // Tensor-table index; throws kNotFound naming what exists.
  uint32_t Find(const std::string& name, const std::string& entry) const;
  at::Tensor Make(uint32_t tensor) const;
  // Sparse records (loader/sparse.cc): index in the sparse table or kNone;
  // the sparse tensor over its component views (kInvalidValue if inconsistent).
  uint32_t FindSparse(uint32_t entry, std::string_view name) const;
  at::Tensor MakeSparse(uint32_t sparse) const;

  // Calls f(name, tensor, sparse) for each tensor a user sees in `entry`, in
  // file order: a dense tensor (sparse == kNone), or a sparse tensor in the
  // place of its first component (tensor == kNone). Components are skipped.
  template <typename F>
  void ForEachVisible(uint32_t entry, F&& f) const {
    const format::EntryRecord& e = index().entries()[entry];
    for (uint32_t t = e.first_tensor; t < e.first_tensor + e.tensor_count; ++t) {
      const format::TensorRecord& rec = index().tensors()[t];
      if (rec.role != format::Role::kSparseComponent) {
        f(rec.name, t, format::kNone);
      } else if (index().sparse()[rec.sparse].first_component == t) {
        f(index().sparse()[rec.sparse].name, format::kNone, rec.sparse);
      }
    }
  }
  std::string QualifiedName(uint32_t tensor) const;

  mutable std::vector<c10::Storage> storages;      // null until first use
  std::unique_ptr<std::once_flag[]> storage_once;  // one per storage
};

// Fault handler registry (loader/fault_handler.cc).
void RegisterMapping(const ArchiveCore* core);
void UnregisterMapping(const ArchiveCore* core);

}  // namespace tsar
