// tsar::Archive: opens a .tsar file (spec/FORMAT.md) with mmap and hands out
// its tensors zero-copy. See bind.h to rebind a module's parameters in place;
// archive_file.h for everything but tensors, without LibTorch.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/ordered_dict.h>

#include <climits>
#include <memory>
#include <string>

#include "tsar/archive_file.h"

namespace tsar {

// An open archive: an ArchiveFile (index, metadata, value tree, verify) that
// also hands out tensors. Cheap to copy (copies share the mapping).
// Immutable after open(): every const member may be called from many threads
// at once.
//
// Every tensor returned keeps the mapping alive, so the Archive may be
// destroyed right after use; the mapping goes away with the last tensor.
// In kShared mode tensors alias read-only memory (see MapMode).
class Archive : public ArchiveFile {
 public:
  // Opens and validates header and index (spec §6) before any tensor exists.
  // Throws tsar::Error: kNotFound / kIo for the file, any decode code for
  // bad bytes, kChecksumMismatch under VerifyMode::kFull.
  static Archive open(const std::string& path, const OpenOptions& options = {});

  // The tensor, a zero-copy view of the mapping (kNotFound if absent). A
  // sparse tensor is built over zero-copy views of its components, after
  // LibTorch checked its indices (kInvalidValue naming it if they are wrong).
  // Tensors that shared a storage when packed share one c10::Storage again,
  // with the same storage offsets and strides. requires_grad is as packed.
  at::Tensor tensor(const std::string& name, const std::string& entry = "") const;
  // Every tensor of an entry in file order (the state_dict order packed).
  torch::OrderedDict<std::string, at::Tensor> state_dict(const std::string& entry = "") const;

  // Tensor parallelism (spec §4.12): rank `rank`'s slice of tensor `name`
  // split `world` ways along `dim`, equal to
  // torch.chunk(tensor(name), world, dim)[rank]. In an archive packed for W
  // ranks (pack --tp W) a sharded tensor's own slice (world == W, dim its
  // packed dim or kShardDimOfArchive) is a zero-copy, C-contiguous view of
  // one run of the file, which is all a rank touches; world a multiple of W
  // is a zero-copy view inside one run; any other world or dim is a copy. A
  // tensor stored whole gives a zero-copy strided view (dim is then needed).
  // Such an archive's tensor() and state_dict() give sharded tensors whole:
  // a copy, except where the runs lie back to back in C order. kNotFound for
  // an unknown name, kInvalidArgument for a bad rank, world or dim.
  static constexpr int64_t kShardDimOfArchive = INT64_MIN;
  at::Tensor shard(const std::string& name, int64_t rank, int64_t world,
                   int64_t dim = kShardDimOfArchive, const std::string& entry = "") const;

  struct Impl;
  const Impl& impl() const { return *impl_; }

 private:
  Archive(ArchiveFile file, std::shared_ptr<const Impl> impl)
      : ArchiveFile(std::move(file)), impl_(std::move(impl)) {}
  std::shared_ptr<const Impl> impl_;
};

}  // namespace tsar
