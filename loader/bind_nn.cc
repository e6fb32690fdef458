// tsar::bind for torch::nn::Module (include/tsar/bind.h).
#include <torch/nn/module.h>

#include "loader/bind_common.h"

namespace tsar {
namespace {

// Module::parameters_, read in place: named_parameters(false) copies it, an
// ordered hash map with every name, per module (a third of binding 100,000
// tensors). parameters_ is protected; a pointer to it formed through a
// derived class applies to any Module.
struct ParametersOf : torch::nn::Module {
  static constexpr auto kMember = &ParametersOf::parameters_;
};

// state_dict() names, module by module: cheaper than named_parameters(true),
// which builds one ordered hash map of every dotted name in the model.
void Collect(const torch::nn::Module& m, const std::string& prefix, std::vector<BindSlot>& slots) {
  for (const auto& p : m.*ParametersOf::kMember) {
    if (p.value().defined())
      slots.push_back({prefix + p.key(), p.value().unsafeGetTensorImpl()});  // as named_parameters
  }
  for (const auto& b : m.named_buffers(/*recurse=*/false)) {
    slots.push_back({prefix + b.key(), b.value().unsafeGetTensorImpl()});
  }
  for (const auto& c : m.named_children()) Collect(*c.value(), prefix + c.key() + ".", slots);
}

}  // namespace

BindReport bind(torch::nn::Module& module, const Archive& archive, const BindOptions& options) {
  std::vector<BindSlot> slots;
  Collect(module, "", slots);
  return BindSlots(slots, module.is_training(), archive, options);
}

}  // namespace tsar
