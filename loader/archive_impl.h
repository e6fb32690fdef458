// Internals of tsar::Archive shared by the loader's translation units: the
// LibTorch side (storages and tensors) over an ArchiveCore.
#pragma once

#include <c10/core/Storage.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "loader/archive_core.h"
#include "tsar/archive.h"

namespace tsar {

// What the c10::Storages of one Archive hold: the core, through one count
// for them all (a context per storage was a malloc and a free per tensor, a
// fifth of binding 100,000 tensors). The Impl holds one reference.
struct CoreRefs {
  explicit CoreRefs(std::shared_ptr<const ArchiveCore> c) : core(std::move(c)) {}
  std::atomic<uint64_t> count{1};
  std::shared_ptr<const ArchiveCore> core;
};

struct Archive::Impl {
  explicit Impl(std::shared_ptr<const ArchiveCore> core);
  ~Impl();
  Impl(const Impl&) = delete;
  Impl& operator=(const Impl&) = delete;

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
  // §4.12 (loader/shards.cc): a view of tensor's storage with these sizes,
  // strides and offset (in elements); the full value of a sharded tensor;
  // rank's slice of `world` along `dim` (kShardDimOfArchive: the archive's).
  at::Tensor View(uint32_t tensor, const std::vector<int64_t>& sizes,
                  const std::vector<int64_t>& strides, uint64_t offset) const;
  at::Tensor MakeFull(uint32_t tensor) const;
  at::Tensor MakeShard(uint32_t tensor, int64_t rank, int64_t world, int64_t dim) const;
  // Elements [start, start + length) along `dim` of a sharded tensor, copied
  // from the blocks the slice spans (loader/shards.cc).
  at::Tensor BlockedSlice(uint32_t tensor, int64_t dim, int64_t start, int64_t length) const;
  // The sparse tensor over its component views (kInvalidValue if
  // inconsistent); loader/sparse.cc.
  at::Tensor MakeSparse(uint32_t sparse) const;

  CoreRefs* refs;
  // storages[i] is set once, under make_mutex, before made[i] turns true.
  // (std::call_once was a futex wake, a system call, per storage.)
  mutable std::vector<c10::Storage> storages;
  mutable std::unique_ptr<std::atomic<bool>[]> made;
  mutable std::mutex make_mutex;
};

}  // namespace tsar
