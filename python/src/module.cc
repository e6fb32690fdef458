// tsar._tsar: the Python binding of the C++ core (python/tsar/ is the API
// users see). Thin: argument conversion, the GIL, and tsar::Error ->
// tsar.Error. Everything else is the same code the C++ library runs.
#include <torch/csrc/DynamicTypes.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/utils/pybind.h>

#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "loader/bind_common.h"
#include "loader/scalar_type.h"
#include "python/src/common.h"
#include "python/src/module_walk.h"
#include "tsar/archive.h"
#include "tsar/device.h"
#include "tsar/writer.h"

namespace py = pybind11;

namespace tsar {
namespace {

// load_into's options after the module: one tuple (entry, strict,
// allow_training, archive_prefix, module_prefix, rank, world, device,
// read_ahead, direct), as python/tsar/_bind.py builds it. A GPU bind stages
// with BindOptions' default DeviceOptions (load_into offers no staging
// options) but for `direct`: the host memory locked already, as
// python/tsar/_device.py makes it from pin=: (locked_base, locked_size);
// (0, 0) for none.
using DirectArgs = std::tuple<uintptr_t, uint64_t>;
using BindArgs = std::tuple<std::string, bool, bool, std::string, std::string, int64_t, int64_t,
                            std::string, bool, DirectArgs>;

void SetDirect(DeviceOptions& o, const DirectArgs& direct) {
  const auto& [locked_base, locked_size] = direct;
  o.locked_base = reinterpret_cast<const void*>(locked_base);
  o.locked_size = locked_size;
}

py::dict StatsDict(const DeviceStats& s) {
  py::dict d;
  d["bytes"] = s.bytes;
  d["bytes_direct"] = s.bytes_direct;
  d["pinned_bytes"] = s.pinned_bytes;
  d["bytes_from_file"] = s.bytes_from_file;
  d["fill_threads"] = s.fill_threads;
  d["streams"] = s.streams;
  return d;
}

// BindSlots with `args`; (bound, missing, unexpected, mismatched, tied).
py::tuple Bind(std::vector<BindSlot>& slots, bool training, const Archive& archive,
               const BindArgs& args, const std::vector<BindSlot>& loose) {
  const auto& [entry, strict, allow_training, archive_prefix, module_prefix, rank, world, device,
               read_ahead, direct] = args;
  BindOptions o;
  o.entry = entry;
  o.strict = strict;
  o.allow_training = allow_training;
  o.archive_prefix = archive_prefix;
  o.module_prefix = module_prefix;
  o.rank = rank;
  o.world = world;
  if (!device.empty()) o.device = c10::Device(device);
  SetDirect(o.staging, direct);
  o.read_ahead = read_ahead;
  BindReport r;
  if (o.device.is_cpu()) {
    r = BindSlots(slots, training, archive, o, loose);
  } else {  // the copy to the GPU takes a while: other threads may run
    py::gil_scoped_release unlocked;
    r = BindSlots(slots, training, archive, o, loose);
  }
  return py::make_tuple(r.bound, r.missing, r.unexpected, r.mismatched, r.tied);
}

// A module's slots as BindSlots takes them (python/src/module_walk.h walks
// it): TensorImpls, and of its non-persistent buffers those on meta. The
// TensorImpls are not owned: `refs` holds their tensor objects (and so the
// TensorImpls) while the bind runs, the GIL released or not.
struct ModuleSlots {
  std::vector<BindSlot> slots, loose;
  bool training = false;
  python::WalkRefs refs;
};
std::optional<ModuleSlots> WalkModule(const py::handle& module, const py::dict& plain_cache,
                                      const py::handle& plain) {
  ModuleSlots out;
  const std::optional<bool> training = python::WalkModule(
      module.ptr(), plain_cache.ptr(), plain.ptr(),
      reinterpret_cast<PyTypeObject*>(THPVariableClass),
      [&](std::string&& name, PyObject* tensor, bool persistent) {
        c10::TensorImpl* t = THPVariable_Unpack(tensor).unsafeGetTensorImpl();
        if (persistent) {
          out.slots.push_back({std::move(name), t});
        } else if (t->device_type() == c10::DeviceType::Meta) {
          out.loose.push_back({std::move(name), t});
        }
      },
      out.refs);
  if (!training) return std::nullopt;
  out.training = *training;
  return out;
}

py::object Dtype(DType d) {
  const c10::ScalarType t = ToScalarType(d, [] { return std::string("dtype"); });
  return py::reinterpret_borrow<py::object>(reinterpret_cast<PyObject*>(torch::getTHPDtype(t)));
}

}  // namespace
}  // namespace tsar

PYBIND11_MODULE(_tsar, m) {
  using namespace tsar;
  // Tensors cross the boundary as torch.Tensor only once torch's own types are
  // registered: importing us first would crash on the first tensor returned.
  py::module_::import("torch");
  m.doc() = "tsar's C++ core; use the tsar package, not this module.";

  python::RegisterErrorTranslator();

  py::class_<Archive> archive(m, "Archive");
  python::DefArchiveFileMembers(archive, Dtype);
  archive.def("tensor", &Archive::tensor, py::arg("name"), py::arg("entry"))
      .def(
          "to_device",
          [](const Archive& a, const std::string& device, const std::string& entry,
             uint64_t pinned_bytes, int buffers, int streams, int fill_threads,
             bool stage_from_file, const DirectArgs& direct) {
            DeviceOptions o;
            o.pinned_bytes = pinned_bytes;
            o.buffers = buffers;
            o.streams = streams;
            o.fill_threads = fill_threads;
            o.stage_from_file = stage_from_file;
            SetDirect(o, direct);
            DeviceStats stats;
            o.stats = &stats;
            torch::OrderedDict<std::string, at::Tensor> sd;
            {
              py::gil_scoped_release unlocked;
              sd = to_device(a, c10::Device(device), entry, o);
            }
            std::vector<std::pair<std::string, at::Tensor>> out;
            for (auto& item : sd) out.emplace_back(item.key(), item.value());
            return py::make_tuple(out, StatsDict(stats));
          },
          py::arg("device"), py::arg("entry"), py::arg("pinned_bytes"), py::arg("buffers"),
          py::arg("streams"), py::arg("fill_threads"), py::arg("stage_from_file"),
          py::arg("direct"))
      .def(
          "shard",
          [](const Archive& a, const std::string& name, int64_t rank, int64_t world,
             std::optional<int64_t> dim, const std::string& entry) {
            return a.shard(name, rank, world, dim ? *dim : Archive::kShardDimOfArchive, entry);
          },
          py::arg("name"), py::arg("rank"), py::arg("world"), py::arg("dim"), py::arg("entry"))
      .def(
          "state_dict",
          [](const Archive& a, const std::string& entry) {
            std::vector<std::pair<std::string, at::Tensor>> out;
            for (auto& item : a.state_dict(entry)) out.emplace_back(item.key(), item.value());
            return out;
          },
          py::arg("entry"));

  m.def(
      "open",
      [](const std::string& path, int mode, int prefetch, int verify,
         const std::vector<std::string>& base_dirs) {
        const OpenOptions o = python::MakeOpenOptions(mode, prefetch, verify, base_dirs);
        py::gil_scoped_release unlocked;
        return Archive::open(path, o);
      },
      py::arg("path"), py::arg("mode"), py::arg("prefetch"), py::arg("verify"),
      py::arg("base_dirs") = std::vector<std::string>());

  // entries: [(entry, [(name, tensor, role)])], metadata: [(entry, key, value)].
  m.def(
      "save",
      [](const std::string& path,
         const std::vector<std::pair<
             std::string, std::vector<std::tuple<std::string, at::Tensor, int>>>>& entries,
         const py::list& metadata, uint32_t alignment, const std::string& dtype,
         const std::string& base, bool durable, uint32_t tp,
         const std::vector<std::pair<std::string, int64_t>>& shard) {
        Writer w(path, python::MakePackOptions(alignment, dtype, base, durable, tp, shard));
        for (const auto& [entry, tensors] : entries) {
          w.add_entry(entry);
          for (const auto& [name, tensor, role] : tensors)
            w.add(name, tensor, static_cast<Role>(role));
        }
        python::AddMetadata(w, metadata);
        py::gil_scoped_release unlocked;
        w.finish();
      },
      py::arg("path"), py::arg("entries"), py::arg("metadata"), py::arg("alignment"),
      py::arg("dtype"), py::arg("base") = std::string(), py::arg("durable") = true,
      py::arg("tp") = 0,
      py::arg("shard") = std::vector<std::pair<std::string, int64_t>>());

  // slots: the module's state_dict(keep_vars=True) items, rebound in place;
  // loose: its other tensors on meta (non-persistent buffers).
  m.def(
      "bind",
      [](const Archive& archive, const std::vector<std::pair<std::string, at::Tensor>>& items,
         bool training, const BindArgs& args,
         const std::vector<std::pair<std::string, at::Tensor>>& loose_items) {
        std::vector<BindSlot> slots, loose;
        slots.reserve(items.size());
        for (const auto& [name, t] : items) slots.push_back({name, t.unsafeGetTensorImpl()});
        for (const auto& [name, t] : loose_items) loose.push_back({name, t.unsafeGetTensorImpl()});
        return Bind(slots, training, archive, args, loose);
      },
      py::arg("archive"), py::arg("slots"), py::arg("training"), py::arg("options"),
      py::arg("loose") = std::vector<std::pair<std::string, at::Tensor>>());
  // The same, walking the module in C++ (python/src/module_walk.h); None where
  // the module needs its own state_dict() (hooks...): the caller falls back.
  m.def(
      "bind_module",
      [](const Archive& archive, const py::handle& module, const py::dict& plain_cache,
         const py::handle& plain, const BindArgs& args) -> py::object {
        std::optional<ModuleSlots> walked = WalkModule(module, plain_cache, plain);
        if (!walked) return py::none();
        return Bind(walked->slots, walked->training, archive, args, walked->loose);
      },
      py::arg("archive"), py::arg("module"), py::arg("plain_cache"), py::arg("plain"),
      py::arg("options"));
  // What bind_module binds: (names, tensors, training), or None (for the tests).
  m.def(
      "module_slots",
      [](const py::handle& module, const py::dict& plain_cache,
         const py::handle& plain) -> py::object {
        std::optional<ModuleSlots> walked = WalkModule(module, plain_cache, plain);
        if (!walked) return py::none();
        py::list names, tensors;
        for (const BindSlot& s : walked->slots) {
          names.append(py::str(s.name));
          tensors.append(at::Tensor(
              c10::intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>::reclaim_copy(
                  s.tensor)));
        }
        return py::make_tuple(names, tensors, walked->training);
      },
      py::arg("module"), py::arg("plain_cache"), py::arg("plain"));

  m.def("install_fault_handler", &InstallFaultHandler);
}
