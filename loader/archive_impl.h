// Internals of tsar::Archive shared by the loader's translation units: the
// LibTorch side (storages and tensors) over an ArchiveCore.
#pragma once

#include <c10/core/Storage.h>

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "loader/archive_core.h"
#include "tsar/archive.h"

namespace tsar {

struct Archive::Impl {
  std::shared_ptr<const ArchiveCore> core;

  // The c10::Storage of archive storage i, made on first use (so open() costs
  // no allocation per storage); thread-safe; one per storage for the life of
  // the Archive, which is what makes tensors of one storage alias again.
  const c10::Storage& Storage(uint32_t i) const;

  const format::Index& index() const { return core->index; }
  uint32_t Entry(const std::string& entry) const { return core->Entry(entry); }
  uint32_t BindEntry(const std::string& entry) const { return core->BindEntry(entry); }
  uint32_t Find(const std::string& name, const std::string& entry) const {
    return core->Find(name, entry);
  }
  uint32_t FindSparse(uint32_t entry, std::string_view name) const {
    return core->FindSparse(entry, name);
  }
  std::string QualifiedName(uint32_t tensor) const { return core->QualifiedName(tensor); }
  template <typename F>
  void ForEachVisible(uint32_t entry, F&& f) const {
    core->ForEachVisible(entry, std::forward<F>(f));
  }

  at::Tensor Make(uint32_t tensor) const;
  // The sparse tensor over its component views (kInvalidValue if
  // inconsistent); loader/sparse.cc.
  at::Tensor MakeSparse(uint32_t sparse) const;

  mutable std::vector<c10::Storage> storages;      // null until first use
  std::unique_ptr<std::once_flag[]> storage_once;  // one per storage
};

}  // namespace tsar
