// tsar::bind for TorchScript modules (include/tsar/bind.h).
#include <torch/csrc/jit/api/module.h>

#include "loader/bind_common.h"

namespace tsar {

BindReport bind(torch::jit::Module& module, const Archive& archive, const BindOptions& options) {
  std::vector<BindSlot> slots;
  for (const auto& p : module.named_parameters(/*recurse=*/true))
    slots.push_back({p.name, p.value});
  for (const auto& b : module.named_buffers(/*recurse=*/true)) slots.push_back({b.name, b.value});
  return BindSlots(slots, module.is_training(), archive, options);
}

}  // namespace tsar
