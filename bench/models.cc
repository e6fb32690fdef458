// Modules of the benchmarks (bench/models.h).
#include "bench/models.h"

#include <ATen/ops/addmm.h>
#include <ATen/ops/empty.h>
#include <c10/core/GradMode.h>

#include <unordered_map>

#include "bench/common.h"

namespace tsar::bench {
namespace {

class Layer : public torch::nn::Module {
 public:
  Layer() {
    weight = register_parameter("weight", at::empty({kStackWidth, kStackWidth}));
    bias = register_parameter("bias", at::empty({kStackWidth}));
  }
  at::Tensor weight, bias;
};

std::unordered_map<std::string, at::Tensor> ToMap(const c10::IValue& dict) {
  if (!dict.isGenericDict())
    Die("expected a dict from torch::pickle_load, found " + dict.tagKind());
  std::unordered_map<std::string, at::Tensor> out;
  for (const auto& kv : dict.toGenericDict())
    out.emplace(kv.key().toStringRef(), kv.value().toTensor());
  return out;
}

void CopyOne(const std::unordered_map<std::string, at::Tensor>& from, const std::string& name,
             at::Tensor& to) {
  const auto it = from.find(name);
  if (it == from.end()) Die("pickle_load: no tensor " + name);
  to.copy_(it->second);
}

}  // namespace

LinearStack::LinearStack() {
  for (int i = 0; i < kStackLayers; ++i) {
    auto layer = register_module(std::to_string(i), std::make_shared<Layer>());
    layers_.emplace_back(layer->weight, layer->bias);
  }
}

at::Tensor LinearStack::forward(at::Tensor x) {
  for (const auto& [w, b] : layers_) x = at::addmm(b, x, w.t());
  return x;
}

std::string ManyName(int i) {
  return "blocks." + std::to_string(i / kManyPerBlock) + ".t" + std::to_string(i % kManyPerBlock);
}

std::vector<int64_t> ManyShape(int i) {
  static const std::vector<std::vector<int64_t>> kShapes = {{16},   {4, 8}, {2, 3, 4},  {64},
                                                            {8, 8}, {3, 5}, {1, 1, 32}, {7}};
  return kShapes[static_cast<size_t>(i) % kShapes.size()];
}

std::shared_ptr<torch::nn::Module> MakeManyModule() {
  auto root = std::make_shared<torch::nn::Module>();
  auto blocks = root->register_module("blocks", std::make_shared<torch::nn::Module>());
  for (int b = 0; b < kManyBlocks; ++b) {
    auto block = blocks->register_module(std::to_string(b), std::make_shared<torch::nn::Module>());
    for (int j = 0; j < kManyPerBlock; ++j) {
      block->register_parameter("t" + std::to_string(j),
                                at::empty(ManyShape(b * kManyPerBlock + j)));
    }
  }
  return root;
}

void CopyInto(torch::nn::Module& module, const c10::IValue& dict) {
  const auto from = ToMap(dict);
  c10::AutoGradMode no_grad(false);
  for (auto& p : module.named_parameters(true)) CopyOne(from, p.key(), p.value());
  for (auto& b : module.named_buffers(true)) CopyOne(from, b.key(), b.value());
}

void CopyInto(torch::jit::Module& module, const c10::IValue& dict) {
  const auto from = ToMap(dict);
  c10::AutoGradMode no_grad(false);
  for (const auto& p : module.named_parameters(true)) {
    at::Tensor t = p.value;
    CopyOne(from, p.name, t);
  }
  for (const auto& b : module.named_buffers(true)) {
    at::Tensor t = b.value;
    CopyOne(from, b.name, t);
  }
}

}  // namespace tsar::bench
