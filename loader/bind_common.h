// The module-independent half of tsar::bind: match named slots against an
// archive entry, report, and rebind in place (loader/bind_nn.cc, bind_jit.cc
// collect the slots).
#pragma once

#include <ATen/core/Tensor.h>

#include <string>
#include <vector>

#include "tsar/bind.h"

namespace tsar {

struct ArchiveCore;

struct BindSlot {
  std::string name;
  // The module's own tensor, rebound in place; not owned (the module, or the
  // caller's list, holds it through the bind). A pointer, not an at::Tensor:
  // a reference count touched per tensor is two more cache misses per tensor
  // bound (collecting and destroying the slots), on 100,000 tensors a tenth
  // of the bind.
  c10::TensorImpl* tensor;
};

// Each slot's device is checked before anything changes: cpu and meta are
// rebound in place (a meta TensorImpl becomes a cpu one), any other device is
// refused with kInvalidArgument naming the tensor, and so is a meta slot the
// archive does not bind, through its name or a tie (kBindMismatch, strict or
// not: the module could not run). `loose`: the module's other tensors, which
// no archive holds (a Python module's non-persistent buffers): one on meta is
// refused the same way. The names of the slots bound are moved into the report.
BindReport BindSlots(std::vector<BindSlot>& slots, bool training, const Archive& archive,
                     const BindOptions& options, const std::vector<BindSlot>& loose = {});

// bind's device step (loader/device.cc). CheckDevice throws (kUnsupported,
// kInvalidArgument) unless `device` is cpu, or a CUDA device this LibTorch
// reaches with valid staging options; `what` names the caller.
void CheckDevice(c10::Device device, const std::string& path, const char* what,
                 const DeviceOptions& options = {});
// Copies the bytes the host tensors `sources` view to `device`, once per
// distinct storage (the byte range its views touch), through the staging
// pipeline, and returns each source's view of the device copy (ties and
// views stay views of one device storage). Bytes inside the shared mappings
// of `core`'s files are read from the files (options.stage_from_file).
std::vector<at::Tensor> CopyToDevice(const std::vector<at::Tensor>& sources, c10::Device device,
                                     const DeviceOptions& options, const ArchiveCore& core);

}  // namespace tsar
