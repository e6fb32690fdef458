// What every view of an archive keeps alive (ArchiveFile, Archive, each
// tensor): the mapped bytes and the index that describes them, with the
// lookups both use. No LibTorch here. Registered with the fault handler
// while it lives.
#pragma once

#include <memory>
#include <string>
#include <string_view>

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

// Fault handler registry (loader/fault_handler.cc).
void RegisterMapping(const ArchiveCore* core);
void UnregisterMapping(const ArchiveCore* core);

}  // namespace tsar
