// Writer::add_module and tsar::pack for torch::nn::Module and TorchScript modules: in
// state_dict() order and names (per module: parameters, then buffers, then
// children recursively), with roles parameter and buffer.
#include <torch/csrc/jit/api/module.h>
#include <torch/nn/module.h>

#include "tsar/writer.h"

namespace tsar {
namespace {

void AddNn(Writer& w, const torch::nn::Module& m, const std::string& prefix) {
  for (const auto& p : m.named_parameters(/*recurse=*/false))
    w.add(prefix + p.key(), p.value(), Role::kParameter);
  for (const auto& b : m.named_buffers(/*recurse=*/false))
    w.add(prefix + b.key(), b.value(), Role::kBuffer);
  for (const auto& c : m.named_children()) AddNn(w, *c.value(), prefix + c.key() + ".");
}

void AddJit(Writer& w, const torch::jit::Module& m, const std::string& prefix) {
  for (const auto& p : m.named_parameters(/*recurse=*/false))
    w.add(prefix + p.name, p.value, Role::kParameter);
  for (const auto& b : m.named_buffers(/*recurse=*/false))
    w.add(prefix + b.name, b.value, Role::kBuffer);
  for (const auto& c : m.named_children()) AddJit(w, c.value, prefix + c.name + ".");
}

}  // namespace

void Writer::add_module(const torch::nn::Module& module) { AddNn(*this, module, ""); }
void Writer::add_module(const torch::jit::Module& module) { AddJit(*this, module, ""); }

void pack(const std::string& path, const torch::nn::Module& module, const PackOptions& options) {
  Writer w(path, options);
  w.add_module(module);
  w.finish();
}

void pack(const std::string& path, const torch::jit::Module& module, const PackOptions& options) {
  Writer w(path, options);
  w.add_module(module);
  w.finish();
}

}  // namespace tsar
