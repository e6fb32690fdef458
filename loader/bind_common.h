// The module-independent half of tsar::bind: match named slots against an
// archive entry, report, and rebind in place (loader/bind_nn.cc, bind_jit.cc
// collect the slots).
#pragma once

#include <ATen/core/Tensor.h>

#include <string>
#include <vector>

#include "tsar/bind.h"

namespace tsar {

struct BindSlot {
  std::string name;
  at::Tensor tensor;  // the module's own tensor; rebound with set_
};

BindReport BindSlots(std::vector<BindSlot>& slots, bool training, const Archive& archive,
                     const BindOptions& options);

}  // namespace tsar
