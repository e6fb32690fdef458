// tsar::bind for TorchScript modules (include/tsar/bind.h).
#include <torch/csrc/jit/api/module.h>

#include "loader/bind_common.h"
#include "tsar/error.h"

namespace tsar {

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
  return BindSlots(slots, !frozen && module.is_training(), archive, options);
}

}  // namespace tsar
