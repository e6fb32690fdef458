// The modules the benchmarks bind or copy weights into: the 512 MiB linear
// stack (make_data.py's nn.Sequential of 32 Linear(2048, 2048)) and a module
// of 100,000 small parameters (the archive gen_many.cc writes).
#pragma once

#include <ATen/core/ivalue.h>
#include <torch/csrc/jit/api/module.h>
#include <torch/nn/module.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace tsar::bench {

constexpr int kStackLayers = 32;
constexpr int kStackWidth = 2048;

// Same parameter names as Python's nn.Sequential of Linear layers ("0.weight",
// "0.bias", ...). Parameters start as torch::empty: never touched, so they
// cost no memory until something is copied in, and no init time.
class LinearStack : public torch::nn::Module {
 public:
  LinearStack();
  at::Tensor forward(at::Tensor x);

 private:
  std::vector<std::pair<at::Tensor, at::Tensor>> layers_;  // weight, bias
};

constexpr int kManyBlocks = 1000;
constexpr int kManyPerBlock = 100;
constexpr int kManyTensors = kManyBlocks * kManyPerBlock;

// Name and shape of tensor i of the many-tensors archive: "blocks.B.tJ".
std::string ManyName(int i);
std::vector<int64_t> ManyShape(int i);

// Parameters named ManyName(i) with shapes ManyShape(i), as torch::empty.
std::shared_ptr<torch::nn::Module> MakeManyModule();

// Copies every tensor of a GenericDict (what torch::pickle_load returns for a
// torch.save(dict(state_dict))) into the parameters and buffers of the same
// name: what load_state_dict does. Dies on a missing name.
void CopyInto(torch::nn::Module& module, const c10::IValue& dict);
void CopyInto(torch::jit::Module& module, const c10::IValue& dict);

}  // namespace tsar::bench
