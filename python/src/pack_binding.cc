// DefPack (python/src/pack_binding.h).
#include "python/src/pack_binding.h"

#include <pybind11/stl.h>

#include <string>
#include <utility>
#include <vector>

#include "python/src/common.h"
#include "python/src/portable_torchscript.h"

namespace py = pybind11;

namespace tsar::python {

void DefPack(py::module_& m, TorchSupport torch) {
  m.def(
      "pack",
      [torch](const std::vector<std::pair<std::string, std::string>>& sources,
              const std::string& dst, const std::string& entry, bool strict, uint32_t alignment,
              const py::list& metadata, const std::string& dtype,
              const std::vector<std::string>& only, const std::vector<std::string>& exclude,
              const std::string& strip_prefix, const std::string& architecture,
              const std::string& base, uint32_t tp,
              const std::vector<std::pair<std::string, int64_t>>& shard, bool follow_symlinks,
              const py::object& torch_hooks) {
        PackFilesOptions o;
        o.follow_symlinks = follow_symlinks;
        o.pack.tp = tp;
        o.pack.shard = shard;
        o.pack.base = base;
        o.pack.alignment = alignment;
        o.pack.entry = entry;
        o.pack.dtype = FloatingDtype(dtype);
        o.strict = strict;
        o.only = only;
        o.exclude = exclude;
        o.strip_prefix = strip_prefix;
        o.architecture = architecture;
        // Where this module has no LibTorch, the process's torch through
        // Python (python/tsar/_portable_torchscript.py) when given.
        o.torch = torch_hooks.is_none() ? torch : PythonTorchSupport(torch_hooks);
        for (const auto& item : metadata) {
          const auto t = item.cast<py::tuple>();
          const auto key = t[0].cast<std::string>();
          o.metadata.emplace_back(key, FromPython(t[1], key));
        }
        std::vector<PackSource> src;
        for (const auto& [e, p] : sources) src.push_back({e, p});
        PackSummary s;
        {
          py::gil_scoped_release unlocked;
          s = PackFiles(src, dst, o);
        }
        return py::make_tuple(s.tensors, s.entries, s.nbytes, s.notes);
      },
      py::arg("sources"), py::arg("dst"), py::arg("entry"), py::arg("strict"), py::arg("alignment"),
      py::arg("metadata"), py::arg("dtype"), py::arg("only"), py::arg("exclude"),
      py::arg("strip_prefix"), py::arg("architecture"), py::arg("base") = std::string(),
      py::arg("tp") = 0, py::arg("shard") = std::vector<std::pair<std::string, int64_t>>(),
      py::arg("follow_symlinks") = false, py::arg("torch_hooks") = py::none());
}

}  // namespace tsar::python
