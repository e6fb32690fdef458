// tsar::to_device: copies an archive's tensors to a GPU, one device storage
// per archive storage so aliasing is preserved.
#pragma once

#include <c10/core/Device.h>

#include "tsar/archive.h"

namespace tsar {

// Copies every storage of `entry` to `device` through pinned host memory with
// asynchronous copies, then rebuilds the views. Throws kUnsupported when this
// LibTorch has no CUDA or no device is present ("built without CUDA").
torch::OrderedDict<std::string, at::Tensor> to_device(const Archive& archive, c10::Device device,
                                                      const std::string& entry = "");

}  // namespace tsar
