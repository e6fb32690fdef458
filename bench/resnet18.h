// torchvision's resnet18 written with torch::nn::Module and ATen ops: the
// architecture as C++ code, with the parameter and buffer names of
// torchvision's state_dict. Parameters start as torch::empty (no init, no
// memory) and are meant to be bound from an archive (P2).
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

namespace tsar::bench {

class ResNet18 : public torch::nn::Module {
 public:
  ResNet18();
  at::Tensor forward(const at::Tensor& x);  // eval-mode forward, [N,3,H,W] -> [N,1000]

 private:
  struct Parts;
  std::shared_ptr<Parts> parts_;
};

}  // namespace tsar::bench
