// What the extension modules of the tsar package share (python/src/module.cc:
// tsar._tsar, the accelerator; python/src/portable.cc: tsar._tsar_portable;
// python/src/pack_module.cc: tsar._tsar_pack, pack from files): tsar::Error as
// tsar.Error, option conversions, and the archive members both archive
// objects bind.
#pragma once

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "loader/archive_core.h"
#include "tsar/archive_file.h"
#include "tsar/dtype.h"
#include "tsar/pack_options.h"

namespace tsar::python {

// Registers the translation of tsar::Error into tsar._errors.Error (code,
// path and offset kept) for every function of the calling module.
void RegisterErrorTranslator();

// Python checks types and ranges first (python/tsar/_save.py); this is the
// last line, for callers of the private modules.
MetadataValue FromPython(const pybind11::handle& v, const std::string& key);

// A metadata value as Python's str, int, float or bytes.
pybind11::object MetadataToPython(const MetadataValue& v);

// "shared", "copy_on_write" or "read": tsar.Archive.mode.
const char* MapModeName(MapMode mode);

// "" = as they are; else a floating dtype name ("float16"), as PackOptions::dtype.
std::optional<DType> FloatingDtype(const std::string& name);

// tsar.open's options as python/tsar/_archive.py passes them (enum values).
OpenOptions MakeOpenOptions(int mode, int prefetch, int verify,
                            std::vector<std::string> base_dirs);

// tsar.save's options as python/tsar/_save.py passes them.
PackOptions MakePackOptions(uint32_t alignment, const std::string& dtype, std::string base,
                            bool durable, uint32_t tp,
                            std::vector<std::pair<std::string, int64_t>> shard);

// Adds tsar.save's metadata, [(entry, key, value)], to `w` (tsar::Writer or
// writer::ArchiveWriter).
template <typename Writer>
void AddMetadata(Writer& w, const pybind11::list& metadata) {
  for (const auto& item : metadata) {
    const auto t = item.cast<pybind11::tuple>();
    const auto key = t[1].cast<std::string>();
    w.add_metadata(key, FromPython(t[2], key), t[0].cast<std::string>());
  }
}

// Binds what tsar.Archive (python/tsar/_archive.py) reads of either
// extension's archive object, an ArchiveFile or the accelerator's Archive
// (which derives from it), the same way: the file's properties, names,
// metadata, TensorInfo tuples, verify and damaged. dtype(DType) gives the
// TensorInfo's dtype: torch's dtype object (the accelerator) or its name (the
// portable module, which has no torch).
template <typename T, typename DtypeOf>
void DefArchiveFileMembers(pybind11::class_<T>& c, DtypeOf dtype) {
  namespace py = pybind11;
  const auto info = [dtype](const TensorInfo& i) {
    return py::make_tuple(i.name, i.entry, dtype(i.dtype), py::tuple(py::cast(i.sizes)),
                          py::tuple(py::cast(i.strides)), i.storage_offset, i.storage,
                          RoleName(i.role), i.requires_grad, i.shard_dim);
  };
  c.def_property_readonly("path", [](const T& a) { return a.path(); })
      .def_property_readonly("mode", [](const T& a) { return MapModeName(a.mode()); })
      .def_property_readonly(
          "format_version",
          [](const T& a) { return py::make_tuple(a.format_major(), a.format_minor()); })
      .def_property_readonly("alignment", [](const T& a) { return a.alignment(); })
      .def_property_readonly("layers", [](const T& a) { return a.layers(); })
      .def_property_readonly("file_size", [](const T& a) { return a.file_size(); })
      .def_property_readonly("data_ptr",
                             [](const T& a) { return reinterpret_cast<uintptr_t>(a.data()); })
      .def_property_readonly("mapped_size", [](const T& a) { return a.mapped_size(); })
      .def_property_readonly("tp_world", [](const T& a) { return a.tp_world(); })
      .def("entries", [](const T& a) { return a.entries(); })
      .def("names", [](const T& a, const std::string& entry) { return a.names(entry); },
           py::arg("entry"))
      .def(
          "contains",
          [](const T& a, const std::string& name, const std::string& entry) {
            return a.contains(name, entry);
          },
          py::arg("name"), py::arg("entry"))
      .def(
          "metadata_items",
          [](const T& a, const std::string& entry) {
            py::list out;
            for (const auto& [k, v] : a.metadata_items(entry))
              out.append(py::make_tuple(k, MetadataToPython(v)));
            return out;
          },
          py::arg("entry"))
      .def(
          "metadata_keys", [](const T& a, const std::string& entry) { return a.metadata_keys(entry); },
          py::arg("entry"))
      .def(
          "metadata_value",
          [](const T& a, const std::string& key, const std::string& entry) -> py::object {
            auto v = a.metadata(key, entry);
            if (!v) return py::none();
            return MetadataToPython(*v);
          },
          py::arg("key"), py::arg("entry"))
      .def("info", [info](const T& a, const std::string& name,
                          const std::string& entry) { return info(a.info(name, entry)); })
      .def("infos",
           [info](const T& a) {
             py::list out;
             for (const auto& i : a.infos()) out.append(info(i));
             return out;
           })
      // The entry load_into binds when none is named: the only one, else
      // "model", else the only one holding parameters or buffers (NOT_FOUND
      // listing them otherwise).
      .def(
          "bind_entry",
          [](const T& a, const std::string& entry) {
            return std::string(a.core()->index.entries()[a.core()->BindEntry(entry)].name);
          },
          py::arg("entry"))
      // (name, [member names], sizes, strides, dtype, description) of each
      // tensor group of `entry` (spec §4.13), in file order.
      .def(
          "groups",
          [dtype](const T& a, const std::string& entry) {
            py::list out;
            for (const GroupInfo& g : a.groups(entry)) {
              out.append(py::make_tuple(g.name, g.members, py::tuple(py::cast(g.sizes)),
                                        py::tuple(py::cast(g.strides)), dtype(g.dtype),
                                        g.description));
            }
            return out;
          },
          py::arg("entry"))
      .def("verify", [](const T& a) { a.verify(); }, py::call_guard<py::gil_scoped_release>())
      .def("damaged", [](const T& a) { return a.damaged(); },
           py::call_guard<py::gil_scoped_release>());
}

}  // namespace tsar::python
