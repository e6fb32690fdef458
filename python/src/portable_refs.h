// Tensors that torch's Python API described, as the archive writer's
// TensorRefs, without LibTorch (issue 43): what tsar.save and tsar.pack of a
// TorchScript input hand the writer on the portable path, so that the same
// tensors give the same bytes as the accelerator's tsar::Writer.
//
// python/tsar/_portable_save.py's describe() makes each item:
//   dense:  (name, role, dtype name, sizes, strides, storage_offset,
//            requires_grad, (storage key, host address, nbytes, device type,
//            device index))
//   sparse: (name, role, layout (format::SparseLayout), coalesced, sizes,
//            [(".indices", dense item), ...]), components in the spec's order.
//   group:  (name, role, 4 (format::SparseLayout::kGroup), False, outer sizes,
//            [(".qdata", dense item), ...], outer dtype name, outer strides,
//            description JSON): a tensor group (spec §4.13), tsar/_torchao.py.
// Storages are torch's own bytes, not copied; items with one storage key
// share one writer::Storage (views, ties), as tsar::TensorRefs keys them by
// c10::StorageImpl.
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "tsar/archive_file.h"
#include "writer/archive_writer.h"
#include "writer/tensor_ref.h"

namespace tsar::python {

class PyTensorRefs {
 public:
  // `path`: the output, for errors. `keep`: what owns the storages' bytes
  // (Python's tensors), held (with the GIL taken to let it go) while any
  // storage made here lives; None where the caller keeps them itself.
  PyTensorRefs(std::string path, const pybind11::object& keep);

  // A dense item's view (its name and role are the caller's to read).
  writer::TensorRef Ref(const pybind11::tuple& item);

  // Adds a dense or sparse item to `w`'s current entry.
  void AddTo(writer::ArchiveWriter& w, const pybind11::handle& item);

 private:
  std::string path_;
  std::shared_ptr<const void> keep_;
  std::map<int64_t, std::shared_ptr<const writer::Storage>> storages_;
};

}  // namespace tsar::python
