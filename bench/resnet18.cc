// resnet18 as C++ code (bench/resnet18.h), following torchvision's
// models/resnet.py: BasicBlock, [2, 2, 2, 2] blocks, eval-mode BatchNorm.
#include "bench/resnet18.h"

#include <ATen/ops/adaptive_avg_pool2d.h>
#include <ATen/ops/batch_norm.h>
#include <ATen/ops/conv2d.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/linear.h>
#include <ATen/ops/max_pool2d.h>
#include <ATen/ops/relu.h>

#include <string>
#include <vector>

namespace tsar::bench {
namespace {

class Conv : public torch::nn::Module {
 public:
  Conv(int64_t in, int64_t out, int64_t k, int64_t stride, int64_t padding)
      : stride_(stride), padding_(padding) {
    weight_ = register_parameter("weight", at::empty({out, in, k, k}), /*requires_grad=*/false);
  }
  at::Tensor operator()(const at::Tensor& x) const {
    return at::conv2d(x, weight_, {}, {stride_, stride_}, {padding_, padding_});
  }

 private:
  int64_t stride_, padding_;
  at::Tensor weight_;
};

class BatchNorm : public torch::nn::Module {
 public:
  explicit BatchNorm(int64_t c) {
    weight_ = register_parameter("weight", at::empty({c}), false);
    bias_ = register_parameter("bias", at::empty({c}), false);
    mean_ = register_buffer("running_mean", at::empty({c}));
    var_ = register_buffer("running_var", at::empty({c}));
    register_buffer("num_batches_tracked", at::empty({}, at::kLong));
  }
  at::Tensor operator()(const at::Tensor& x) const {
    return at::batch_norm(x, weight_, bias_, mean_, var_, /*training=*/false, 0.1, 1e-5, true);
  }

 private:
  at::Tensor weight_, bias_, mean_, var_;
};

class Block : public torch::nn::Module {
 public:
  Block(int64_t in, int64_t out, int64_t stride) {
    conv1_ = register_module("conv1", std::make_shared<Conv>(in, out, 3, stride, 1));
    bn1_ = register_module("bn1", std::make_shared<BatchNorm>(out));
    conv2_ = register_module("conv2", std::make_shared<Conv>(out, out, 3, 1, 1));
    bn2_ = register_module("bn2", std::make_shared<BatchNorm>(out));
    if (stride != 1 || in != out) {
      auto down = register_module("downsample", std::make_shared<torch::nn::Module>());
      down_conv_ = down->register_module("0", std::make_shared<Conv>(in, out, 1, stride, 0));
      down_bn_ = down->register_module("1", std::make_shared<BatchNorm>(out));
    }
  }
  at::Tensor operator()(const at::Tensor& x) const {
    at::Tensor y = at::relu((*bn1_)((*conv1_)(x)));
    y = (*bn2_)((*conv2_)(y));
    y += down_conv_ ? (*down_bn_)((*down_conv_)(x)) : x;
    return at::relu(y);
  }

 private:
  std::shared_ptr<Conv> conv1_, conv2_, down_conv_;
  std::shared_ptr<BatchNorm> bn1_, bn2_, down_bn_;
};

class Linear : public torch::nn::Module {
 public:
  Linear(int64_t in, int64_t out) {
    weight_ = register_parameter("weight", at::empty({out, in}), false);
    bias_ = register_parameter("bias", at::empty({out}), false);
  }
  at::Tensor operator()(const at::Tensor& x) const { return at::linear(x, weight_, bias_); }

 private:
  at::Tensor weight_, bias_;
};

}  // namespace

struct ResNet18::Parts {
  std::shared_ptr<Conv> conv1;
  std::shared_ptr<BatchNorm> bn1;
  std::vector<std::shared_ptr<Block>> blocks;
  std::shared_ptr<Linear> fc;
};

ResNet18::ResNet18() : parts_(std::make_shared<Parts>()) {
  parts_->conv1 = register_module("conv1", std::make_shared<Conv>(3, 64, 7, 2, 3));
  parts_->bn1 = register_module("bn1", std::make_shared<BatchNorm>(64));
  int64_t in = 64;
  const int64_t widths[] = {64, 128, 256, 512};
  for (int l = 0; l < 4; ++l) {
    auto layer =
        register_module("layer" + std::to_string(l + 1), std::make_shared<torch::nn::Module>());
    for (int b = 0; b < 2; ++b) {
      const int64_t stride = (l > 0 && b == 0) ? 2 : 1;
      parts_->blocks.push_back(layer->register_module(
          std::to_string(b), std::make_shared<Block>(in, widths[l], stride)));
      in = widths[l];
    }
  }
  parts_->fc = register_module("fc", std::make_shared<Linear>(512, 1000));
}

at::Tensor ResNet18::forward(const at::Tensor& input) {
  at::Tensor x = at::relu((*parts_->bn1)((*parts_->conv1)(input)));
  x = at::max_pool2d(x, {3, 3}, {2, 2}, {1, 1});
  for (const auto& block : parts_->blocks) x = (*block)(x);
  x = at::adaptive_avg_pool2d(x, {1, 1}).flatten(1);
  return (*parts_->fc)(x);
}

}  // namespace tsar::bench
