// PythonTorchSupport (python/src/portable_torchscript.h).
#include "python/src/portable_torchscript.h"

#include <memory>
#include <string>
#include <utility>

#include "python/src/portable_refs.h"
#include "writer/architecture_file.h"

namespace py = pybind11;

namespace tsar::python {

TorchSupport PythonTorchSupport(const py::object& hooks) {
  // Held by the two functions, which may outlive the call that made them
  // only inside PackFiles: the last one lets it go with the GIL taken.
  std::shared_ptr<py::object> h(new py::object(hooks), [](py::object* p) {
    const py::gil_scoped_acquire gil;
    delete p;
  });
  TorchSupport t;
  t.import_torchscript = [h](const std::string& path, const importer::ImportOptions& options) {
    const py::gil_scoped_acquire gil;
    const auto got = h->attr("tensors")(path).cast<py::tuple>();
    PyTensorRefs refs(path, got[1]);
    importer::Imported out;
    out.kind = importer::InputKind::kTorchScript;
    importer::Imported::Entry e{options.default_entry, {}};
    for (const auto& item : got[0].cast<py::list>()) {
      const auto i = item.cast<py::tuple>();
      e.tensors.push_back({i[0].cast<std::string>(), refs.Ref(i), static_cast<Role>(i[1].cast<int>())});
    }
    out.entries.push_back(std::move(e));  // none at all: importer::Import refuses it
    return out;
  };
  t.architecture = [h](const std::string& input, const std::string& output) {
    std::string bytes;
    {
      const py::gil_scoped_acquire gil;
      bytes = h->attr("architecture")(input).cast<std::string>();
    }
    return writer::WriteArchitecture(output, bytes);
  };
  return t;
}

}  // namespace tsar::python
