// tsar._tsar_pack: tsar.pack's C++ side (python/src/pack_binding.h), in a
// module of its own. It links what packing from files needs (the HDF5 and zip
// readers: libhdf5 pulls in some 30 more libraries, 4.5 ms at every load), so
// that `import tsar` and every worker that only opens and binds never loads
// them; tsar._save imports it on the first tsar.pack. With LibTorch: it reads
// TorchScript inputs and writes --arch files.
#include <torch/csrc/utils/pybind.h>

#include "python/src/common.h"
#include "python/src/pack_binding.h"
#include "writer/torchscript.h"

namespace py = pybind11;

PYBIND11_MODULE(_tsar_pack, m) {
  using namespace tsar;
  py::module_::import("torch");  // TorchScript inputs cross as torch objects
  m.doc() = "tsar.pack's C++ core; use the tsar package, not this module.";
  python::RegisterErrorTranslator();
  python::DefPack(m, writer::LibTorchSupport());
}
