// PyTensorRefs (python/src/portable_refs.h).
#include "python/src/portable_refs.h"

#include <pybind11/stl.h>

#include <optional>
#include <utility>
#include <vector>

#include "format/reader.h"
#include "format/spec.h"
#include "tsar/dtype.h"
#include "tsar/error.h"

namespace py = pybind11;

namespace tsar::python {

PyTensorRefs::PyTensorRefs(std::string path, const py::object& keep) : path_(std::move(path)) {
  if (!keep.is_none()) {
    keep_ = std::shared_ptr<const void>(new py::object(keep), [](const void* p) {
      const py::gil_scoped_acquire gil;  // the last storage may go without it
      delete static_cast<const py::object*>(p);
    });
  }
}

writer::TensorRef PyTensorRefs::Ref(const py::tuple& t) {
  if (t.size() != 8) throw py::type_error("expected a dense tensor item of 8 fields");
  const auto st = t[7].cast<py::tuple>();
  std::shared_ptr<const writer::Storage>& slot = storages_[st[0].cast<int64_t>()];
  if (!slot) {
    auto s = std::make_shared<writer::Storage>();
    s->data = reinterpret_cast<const uint8_t*>(st[1].cast<uintptr_t>());
    s->nbytes = st[2].cast<uint64_t>();
    s->device_type = static_cast<format::DeviceType>(st[3].cast<int>());
    s->device_index = st[4].cast<uint16_t>();
    s->keep = keep_;
    slot = std::move(s);
  }
  const auto dtype = t[2].cast<std::string>();
  const std::optional<DType> d = DTypeFromName(dtype);
  if (!d) {
    throw Error(ErrorCode::kInvalidArgument, path_, std::nullopt,
                "tensor " + format::Quote(t[0].cast<std::string>()) + ": dtype " + dtype +
                    " has no tsar code");
  }
  writer::TensorRef r;
  r.storage = slot;
  r.dtype = *d;
  r.sizes = t[3].cast<std::vector<int64_t>>();
  r.strides = t[4].cast<std::vector<int64_t>>();
  r.storage_offset = t[5].cast<uint64_t>();
  r.requires_grad = t[6].cast<bool>();
  return r;
}

void PyTensorRefs::AddTo(writer::ArchiveWriter& w, const py::handle& item) {
  const auto t = item.cast<py::tuple>();
  const auto name = t[0].cast<std::string>();
  if (t.size() == 8) {
    w.add(name, Ref(t), static_cast<Role>(t[1].cast<int>()));
    return;
  }
  writer::SparseRef sp;
  const int layout = t[2].cast<int>();
  const bool group = layout == static_cast<int>(format::SparseLayout::kGroup);
  if (layout < 1 || (layout > format::kSparseLayoutMax && !group) || t.size() != (group ? 9 : 6))
    throw py::value_error("sparse item: layout " + std::to_string(layout) + " with " +
                          std::to_string(t.size()) + " fields");
  sp.layout = static_cast<format::SparseLayout>(layout);
  if (group) {  // (..., outer dtype name, outer strides, description)
    const auto dtype = t[6].cast<std::string>();
    const std::optional<DType> d = DTypeFromName(dtype);
    if (!d) {
      throw Error(ErrorCode::kInvalidArgument, path_, std::nullopt,
                  "tensor " + format::Quote(name) + ": dtype " + dtype + " has no tsar code");
    }
    sp.dtype = *d;
    sp.strides = t[7].cast<std::vector<int64_t>>();
    sp.description = t[8].cast<std::string>();
  }
  sp.coalesced = t[3].cast<bool>();
  sp.sizes = t[4].cast<std::vector<int64_t>>();
  for (const auto& c : t[5].cast<py::list>()) {
    const auto part = c.cast<py::tuple>();
    sp.components.emplace_back(part[0].cast<std::string>(), Ref(part[1].cast<py::tuple>()));
  }
  w.add_sparse(name, std::move(sp));
}

}  // namespace tsar::python
