// LibTorch tensors as the packer's Torch-free views (writer/tensor_ref.h):
// what tsar::Writer and the TorchScript importer hand to ArchiveWriter.
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <string>
#include <unordered_map>

#include "writer/tensor_ref.h"

namespace tsar::writer {

// Why `t` cannot be packed as a strided tensor (quantized, sparse, on a
// device other than the CPU or CUDA, a dtype without a tsar code), or "".
std::string WhyNotPackable(const at::Tensor& t);

// Makes TensorRefs of at::Tensors, one Storage per LibTorch storage, so that
// tensors sharing a storage still share one. Each Storage keeps its LibTorch
// storage alive; a CUDA storage's bytes are copied to the host when read.
class TensorRefs {
 public:
  // `t`: defined and packable (WhyNotPackable gave "").
  TensorRef Of(const at::Tensor& t);

 private:
  std::unordered_map<const c10::StorageImpl*, std::shared_ptr<const Storage>> storages_;
};

// The other way: a CPU at::Tensor viewing `t`'s host bytes (no copy, no
// dispatcher), which keeps `t.storage` alive. Throws kUnsupported for a
// dtype this LibTorch lacks.
at::Tensor ToTensor(const TensorRef& t);

}  // namespace tsar::writer
