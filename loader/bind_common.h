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
  // The module's own tensor, rebound in place; not owned (the module, or the
  // caller's list, holds it through the bind). A pointer, not an at::Tensor:
  // a reference count touched per tensor is two more cache misses per tensor
  // bound (collecting and destroying the slots), on 100,000 tensors a tenth
  // of the bind.
  c10::TensorImpl* tensor;
};

// A slot whose tensor cannot take the archive's storage in place: one on the
// meta device (its TensorImpl's dispatch keys say Meta, whatever storage it is
// given). BindSlots makes the archive's tensor for it, with the slot's
// requires_grad, and the caller puts it in the module where the slot's tensor
// was, as load_state_dict(assign=True) does. Slots that held one TensorImpl
// (tied weights) get one tensor.
struct Replacement {
  size_t slot;
  at::Tensor tensor;
};

// Everything is checked before anything changes: names, dtypes and shapes
// (strict), the training mode, and each slot's device: cpu is rebound in
// place, meta is replaced, any other device is refused (kInvalidArgument,
// naming the tensor and its device), and so is a meta slot the archive does
// not bind (the module could not run, strict or not). The names of the slots
// bound are moved into the report; `replacements` receives the meta slots'
// tensors, which the caller must install (it resolves where before calling).
BindReport BindSlots(std::vector<BindSlot>& slots, bool training, const Archive& archive,
                     const BindOptions& options, std::vector<Replacement>& replacements);

}  // namespace tsar
