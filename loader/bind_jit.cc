// tsar::bind for TorchScript modules (include/tsar/bind.h).
#include <torch/csrc/jit/api/module.h>

#include "loader/bind_common.h"
#include "tsar/error.h"

namespace tsar {
namespace {

// Puts a meta slot's replacement where the dotted name says: the attribute
// keeps its kind (parameter or buffer) in the module's type.
void Install(torch::jit::Module module, const std::string& name, const at::Tensor& tensor) {
  size_t start = 0;
  for (size_t dot; (dot = name.find('.', start)) != std::string::npos; start = dot + 1) {
    module = module.attr(name.substr(start, dot - start)).toModule();
  }
  module.setattr(name.substr(start), tensor);
}

}  // namespace

BindReport bind(torch::jit::Module& module, const Archive& archive, const BindOptions& options) {
  std::vector<BindSlot> slots;
  for (const auto& p : module.named_parameters(/*recurse=*/true))
    slots.push_back({p.name, p.value.unsafeGetTensorImpl()});
  for (const auto& b : module.named_buffers(/*recurse=*/true))
    slots.push_back({b.name, b.value.unsafeGetTensorImpl()});
  // torch::jit::freeze removes the `training` attribute (is_training() then
  // says true) together with every parameter, which it inlines as constants.
  const bool frozen = !module.hasattr("training");
  if (frozen && slots.empty()) {
    throw Error(ErrorCode::kBindMismatch, archive.path(), std::nullopt,
                "bind: the module is frozen (torch::jit::freeze): its weights are constants "
                "inlined into its code, with no parameters or buffers left to bind; bind the "
                "module before freezing it");
  }
  std::vector<Replacement> replacements;
  // The names are moved into the report: keep the replaced slots' own.
  std::vector<std::string> names;
  for (const auto& s : slots) {
    if (s.tensor->device_type() == c10::DeviceType::Meta) {
      names.resize(slots.size());
      break;
    }
  }
  for (size_t i = 0; !names.empty() && i < slots.size(); ++i) names[i] = slots[i].name;
  BindReport report =
      BindSlots(slots, !frozen && module.is_training(), archive, options, replacements);
  for (const auto& r : replacements) Install(module, names[r.slot], r.tensor);
  return report;
}

}  // namespace tsar
