// tsar::bind for torch::nn::Module (include/tsar/bind.h).
#include <torch/nn/module.h>

#include "loader/bind_common.h"

namespace tsar {
namespace {

// state_dict() names, module by module: cheaper than named_parameters(true),
// which builds one ordered hash map of every dotted name in the model.
void Collect(const torch::nn::Module& m, const std::string& prefix, std::vector<BindSlot>& slots) {
  for (auto& p : m.named_parameters(/*recurse=*/false))
    slots.push_back({prefix + p.key(), p.value()});
  for (auto& b : m.named_buffers(/*recurse=*/false)) slots.push_back({prefix + b.key(), b.value()});
  for (const auto& c : m.named_children()) Collect(*c.value(), prefix + c.key() + ".", slots);
}

}  // namespace

BindReport bind(torch::nn::Module& module, const Archive& archive, const BindOptions& options) {
  std::vector<BindSlot> slots;
  Collect(module, "", slots);
  return BindSlots(slots, module.is_training(), archive, options);
}

}  // namespace tsar
