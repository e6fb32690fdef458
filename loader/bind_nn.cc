// tsar::bind for torch::nn::Module (include/tsar/bind.h).
#include <torch/nn/module.h>

#include "loader/bind_common.h"

namespace tsar {

BindReport bind(torch::nn::Module& module, const Archive& archive, const BindOptions& options) {
  std::vector<BindSlot> slots;
  for (const auto& p : module.named_parameters(/*recurse=*/true)) slots.push_back({p.key(), p.value()});
  for (const auto& b : module.named_buffers(/*recurse=*/true)) slots.push_back({b.key(), b.value()});
  return BindSlots(slots, module.is_training(), archive, options);
}

}  // namespace tsar
