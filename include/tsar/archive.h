// tsar::Archive: opens a .tsar file (spec/FORMAT.md) with mmap and hands out
// its tensors zero-copy. See bind.h to rebind a module's parameters in place;
// archive_file.h for everything but tensors, without LibTorch.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/ordered_dict.h>

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

  struct Impl;
  const Impl& impl() const { return *impl_; }

 private:
  Archive(ArchiveFile file, std::shared_ptr<const Impl> impl)
      : ArchiveFile(std::move(file)), impl_(std::move(impl)) {}
  std::shared_ptr<const Impl> impl_;
};

}  // namespace tsar
