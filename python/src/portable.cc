// tsar._tsar_portable: the part of tsar's Python binding that links no
// LibTorch, so that one build of it serves every torch (issue 43). It opens
// and validates an archive (tsar::ArchiveFile: the mapping, the index, the
// metadata, checksums, layers) and hands out each storage's bytes as a
// buffer; python/tsar/_portable.py makes the tensors from them with torch's
// own Python API (torch.frombuffer + as_strided) and binds modules. The
// accelerator, tsar._tsar (python/src/module.cc), does the same in C++ against
// one torch build; tsar/__init__.py picks it when it matches the torch
// imported. Also here, because they need no torch either: LiveModule's file
// watch and identity.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "format/spec.h"
#include "loader/archive_core.h"
#include "loader/path_watch.h"
#include "loader/read_ahead.h"
#include "python/src/common.h"
#include "python/src/portable_bind.h"
#include "python/src/portable_device.h"
#include "python/src/portable_refs.h"
#include "tsar/archive_file.h"
#include "tsar/pack_options.h"
#include "writer/archive_writer.h"
#include "writer/tensor_ref.h"

namespace py = pybind11;

namespace tsar {
namespace {

// One storage's bytes as a Python buffer (what torch.frombuffer takes): it
// holds a copy of the ArchiveFile, so the mapping lives while any tensor made
// from it does (torch.frombuffer keeps the exporting object alive).
//
// Exported writable, as the accelerator's tensors are: in "shared" mode the
// pages are PROT_READ and a write kills the process (SIGSEGV; see
// tsar.Archive), in the other modes they are private memory. torch has no
// read-only tensors; marking the buffer read-only would only make
// torch.frombuffer warn on every storage.
struct StorageBytes {
  ArchiveFile file;
  const void* data;
  uint64_t nbytes;
};

}  // namespace
}  // namespace tsar

PYBIND11_MODULE(_tsar_portable, m) {
  using namespace tsar;
  m.doc() = "tsar's torch-independent core; use the tsar package, not this module.";
  python::RegisterErrorTranslator();

  py::class_<StorageBytes>(m, "StorageBytes", py::buffer_protocol())
      .def_property_readonly("nbytes", [](const StorageBytes& s) { return s.nbytes; })
      .def_buffer([](StorageBytes& s) {
        return py::buffer_info(const_cast<void*>(s.data), 1,
                               py::format_descriptor<uint8_t>::format(), 1,
                               {static_cast<py::ssize_t>(s.nbytes)}, {1}, /*readonly=*/false);
      });

  py::class_<ArchiveFile> file(m, "ArchiveFile");
  // TensorInfo's dtype as its torch name ("bfloat16"): torch's dtype objects
  // are looked up in Python (tsar/_portable.py).
  python::DefArchiveFileMembers(file, [](DType d) { return std::string(DTypeName(d)); });
  file
      // The tensors of `entry` in file order, what state_dict() and bind
      // read, one tuple each: (name, dtype, sizes, strides, storage_offset,
      // storage, requires_grad, shard_dim), dtype being dtypes[its name] (the
      // torch dtype objects, passed in by the caller), or the name where
      // dtypes lacks it. A sparse tensor (spec §4.6) is (name, None, layout
      // code, sizes, coalesced, [its components' tuples]). Built without a
      // Python call per tensor: this is most of what binding 100,000 tensors
      // reads.
      .def(
          "entry_table",
          [](const ArchiveFile& a, const std::string& entry, const py::dict& dtypes) {
            const ArchiveCore& core = *a.core();
            const format::Index& index = core.index;
            const auto ints = [](const int64_t* v, uint32_t n) {
              py::tuple out(n);
              for (uint32_t d = 0; d < n; ++d)
                PyTuple_SET_ITEM(out.ptr(), d, PyLong_FromLongLong(v[d]));
              return out;
            };
            const auto row = [&](uint32_t t) {
              const format::TensorRecord& r = index.tensors()[t];
              const std::string_view dn = DTypeName(r.dtype);
              py::str dtype_name(dn.data(), dn.size());
              PyObject* dtype = PyDict_GetItem(dtypes.ptr(), dtype_name.ptr());  // borrowed
              py::object dt =
                  dtype ? py::reinterpret_borrow<py::object>(dtype) : py::object(dtype_name);
              return py::make_tuple(
                  py::str(r.name.data(), r.name.size()), dt, ints(index.sizes(r), r.ndim),
                  ints(index.strides(r), r.ndim), r.storage_offset, r.storage,
                  static_cast<bool>(r.requires_grad),
                  r.shard_dim == format::kNone ? int64_t{-1} : int64_t{r.shard_dim});
            };
            py::list out;
            core.ForEachVisible(core.Entry(entry), [&](std::string_view name, uint32_t t,
                                                        uint32_t sparse) {
              if (t != format::kNone) {
                out.append(row(t));
                return;
              }
              const format::SparseRecord& sp = index.sparse()[sparse];
              py::list components;
              for (uint32_t k = 0; k < sp.component_count; ++k)
                components.append(row(sp.first_component + k));
              out.append(py::make_tuple(py::str(name.data(), name.size()), py::none(),
                                        static_cast<int>(sp.layout),
                                        ints(index.dims().data() + sp.dims_index, sp.ndim),
                                        sp.coalesced, components));
            });
            return out;
          },
          py::arg("entry"), py::arg("dtypes"))
      .def("storage_count",
           [](const ArchiveFile& a) { return a.core()->index.storages().size(); })
      // Storage i's bytes as its tensors' records describe them
      // (ArchiveFile::storage_values: a tensor-parallel storage in C order).
      .def(
          "storage_bytes",
          [](const ArchiveFile& a, uint32_t i) {
            const auto& storages = a.core()->index.storages();
            if (i >= storages.size())
              throw Error(ErrorCode::kNotFound, a.path(), std::nullopt,
                          "storage #" + std::to_string(i) + ": the archive has " +
                              std::to_string(storages.size()) + " storages");
            return StorageBytes{a, a.storage_values(i), storages[i].nbytes};
          },
          py::arg("index"))
      // §4.12: (the storage's bytes as the file holds them, block_stride) of
      // sharded tensor `name`, whose rank r's slice is C-contiguous at byte
      // r * block_stride: what a rank views without a copy
      // (PortableArchive.slice, tsar/_portable.py). None for a tensor stored
      // whole.
      .def(
          "blocked_storage",
          [](const ArchiveFile& a, const std::string& name,
             const std::string& entry) -> py::object {
            const auto& core = a.core();
            const format::TensorRecord& t = core->index.tensors()[core->Find(name, entry)];
            if (t.shard_dim == format::kNone) return py::none();
            const uint64_t stride = core->index.ShardLayoutOf(t).block_stride;
            const uint64_t nbytes = core->index.storages()[t.storage].nbytes;
            return py::make_tuple(StorageBytes{a, a.storage_data(t.storage), nbytes}, stride);
          },
          py::arg("name"), py::arg("entry"))
      // state_dict()'s tensors that come through DLPack, None for the others
      // (python/src/portable_bind.h).
      .def(
          "dlpack_tensors",
          [](const ArchiveFile& a, const std::string& entry, const py::handle& from_dlpack,
             const py::handle& first, const py::handle& dtypes) {
            PyObject* r = python::DLPackTensors(a, entry, from_dlpack.ptr(), first.ptr(),
                                                dtypes.ptr());
            if (r == nullptr) throw py::error_already_set();
            return py::reinterpret_steal<py::list>(r);
          },
          py::arg("entry"), py::arg("from_dlpack"), py::arg("first"), py::arg("dtypes"))
      // The whole mapping's bytes (what pin="register" locks), for a direct
      // lane's copies (tsar/_portable_device.py).
      .def("mapping_bytes",
           [](const ArchiveFile& a) { return StorageBytes{a, a.data(), a.mapped_size()}; });

  // The format's dtype names (torch's own), for the caller's dtype table.
  m.def("dtype_names", [] {
    std::vector<std::string> out;
    for (DType d : kAllDTypes) out.emplace_back(DTypeName(d));
    return out;
  });

  m.def(
      "open",
      [](const std::string& path, int mode, int prefetch, int verify,
         const std::vector<std::string>& base_dirs) {
        const OpenOptions o = python::MakeOpenOptions(mode, prefetch, verify, base_dirs);
        py::gil_scoped_release unlocked;
        return ArchiveFile::open(path, o);
      },
      py::arg("path"), py::arg("mode"), py::arg("prefetch"), py::arg("verify"),
      py::arg("base_dirs") = std::vector<std::string>());

  // tsar.save on the portable path (python/tsar/_portable_save.py): the
  // accelerator's writer (writer::ArchiveWriter, the same bytes for the same
  // tensors) fed from Python. entries: [(entry, [item])], each item a dense or
  // sparse tensor as python/src/portable_refs.h reads it; the caller keeps
  // the bytes alive and unchanged until this returns. metadata: [(entry, key,
  // value)].
  m.def(
      "save",
      [](const std::string& path, const py::list& entries, const py::list& metadata,
         uint32_t alignment, const std::string& dtype, const std::string& base, bool durable,
         uint32_t tp, const std::vector<std::pair<std::string, int64_t>>& shard) {
        writer::ArchiveWriter w(path,
                                python::MakePackOptions(alignment, dtype, base, durable, tp, shard));
        python::PyTensorRefs refs(path, py::none());  // the caller keeps its tensors
        for (const auto& e : entries) {
          const auto entry = e.cast<py::tuple>();
          w.add_entry(entry[0].cast<std::string>());
          for (const auto& item : entry[1].cast<py::list>()) refs.AddTo(w, item);
        }
        python::AddMetadata(w, metadata);
        py::gil_scoped_release unlocked;
        w.finish();
      },
      py::arg("path"), py::arg("entries"), py::arg("metadata"), py::arg("alignment"),
      py::arg("dtype"), py::arg("base"), py::arg("durable"), py::arg("tp"), py::arg("shard"));

  // load_into's loop (python/src/portable_bind.h): (bound, missing,
  // unexpected, mismatched, tied), or None where tsar/_portable_bind.py must
  // answer. options: (entry, archive_prefix, module_prefix, strict,
  // allow_training, rank, world); api: (torch.Tensor, {dtype name: dtype}, torch.strided,
  // torch._C._from_dlpack, torch._C._swap_tensor_impl,
  // torch.Tensor._make_subclass, view_of(archive name), plain_cache, plain,
  // first: {storage: flat tensor}).
  m.def(
      "bind_fast",
      [](const ArchiveFile& file, const py::handle& module, const py::handle& items,
         bool training, const py::handle& loose,
         const std::tuple<std::string, std::string, std::string, bool, bool, int64_t, int64_t>&
             options,
         const py::tuple& api) -> py::object {
        if (api.size() != 10 || !PyType_Check(api[0].ptr()) || !PyDict_Check(api[1].ptr()) ||
            !PyDict_Check(api[7].ptr()) || !PyDict_Check(api[9].ptr()))
          throw py::type_error("bind_fast: api: expected tsar/_portable.py's _API");
        python::FastBindArgs a;
        std::tie(a.entry, a.archive_prefix, a.module_prefix, a.strict, a.allow_training, a.rank,
                 a.world) = options;
        a.tensor_type = reinterpret_cast<PyTypeObject*>(api[0].ptr());
        a.dtypes = api[1].ptr();
        a.strided = api[2].ptr();
        a.from_dlpack = api[3].ptr();
        a.swap = api[4].ptr();
        a.make_subclass = api[5].ptr();
        a.view_of = api[6].ptr();
        a.plain_cache = api[7].ptr();
        a.plain = api[8].ptr();
        a.first = api[9].ptr();
        PyObject* r = python::FastBind(file, module.ptr(), items.ptr(), training, loose.ptr(), a);
        if (r == nullptr) throw py::error_already_set();
        return py::reinterpret_steal<py::object>(r);
      },
      py::arg("file"), py::arg("module"), py::arg("items"), py::arg("training"), py::arg("loose"),
      py::arg("options"), py::arg("api"));

  // load_into(read_ahead=True) on the portable path: reads the bytes of
  // `ranges` [(address, nbytes)] (the bound tensors' views) ahead of their
  // first touch, on a thread of its own (loader/read_ahead.h). Only ranges
  // inside the mappings of the archive or its bases count: a tensor-parallel
  // slice's C-order copy is already in memory. Returns whether a thread started.
  m.def(
      "read_ahead",
      [](const ArchiveFile& file, const std::vector<std::pair<uintptr_t, uint64_t>>& ranges) {
        if (file.mode() == MapMode::kRead) return false;  // bytes read at open, not mapped
        std::vector<ByteRange> inside;
        for (const auto& [address, nbytes] : ranges) {
          for (const ArchiveCore* c = file.core().get(); c != nullptr; c = c->base.get()) {
            const auto lo = reinterpret_cast<uintptr_t>(c->mapping->data());
            if (address >= lo && nbytes <= c->mapping->size() &&
                address - lo <= c->mapping->size() - nbytes) {
              inside.push_back({reinterpret_cast<const uint8_t*>(address), nbytes});
              break;
            }
          }
        }
        return StartReadAhead(file.core(), std::move(inside));
      },
      py::arg("file"), py::arg("ranges"));

  // state_dict(device=) and load_into(device=): python/src/portable_device.h.
  python::DefPortableDevice(m);

  // tsar.LiveModule's watcher (python/tsar/_live.py): waits without the GIL.
  py::class_<PathWatch>(m, "PathWatch")
      .def(py::init<const std::string&, bool>(), py::arg("path"), py::arg("inotify"))
      .def_property_readonly("inotify", &PathWatch::inotify)
      // "event", "timeout" or "wake"; timeout_ms < 0 waits for an event or wake().
      .def(
          "wait",
          [](PathWatch& w, int64_t timeout_ms) {
            PathWatch::Woke r;
            {
              py::gil_scoped_release unlocked;
              r = w.Wait(std::chrono::milliseconds(timeout_ms));
            }
            return r == PathWatch::Woke::kEvent ? "event"
                   : r == PathWatch::Woke::kWake ? "wake"
                                                 : "timeout";
          },
          py::arg("timeout_ms"))
      .def("wake", &PathWatch::Wake);
  // (dev, ino, size, mtime_ns) of the file at path (links followed), or None.
  m.def("identity", [](const std::string& path) -> py::object {
    std::optional<FileIdentity> id;
    {
      py::gil_scoped_release unlocked;
      id = IdentityOf(path);
    }
    if (!id) return py::none();
    return py::make_tuple(static_cast<uint64_t>(id->dev), static_cast<uint64_t>(id->ino), id->size,
                          id->mtime_ns);
  });

  // The fault handler knows the mappings of the module that made them: each
  // extension has its own (tsar._tsar's for the accelerator's archives).
  m.def("install_fault_handler", &InstallFaultHandler);
}
