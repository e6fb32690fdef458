// tsar._tsar_pack_portable: tsar.pack on the portable path (no LibTorch, any
// torch): the same readers as the `tsar` command (torch.save, safetensors,
// HDF5, TensorDict, transformers directories, .tsar), the same bytes as
// tsar._tsar_pack. A TorchScript input and arch= are read and written by the
// process's torch through Python (tsar/_save.py passes
// tsar/_portable_torchscript.py as torch_hooks); a direct call without them
// gets UNSUPPORTED for a TorchScript input, naming tsar.pack().
#include <pybind11/pybind11.h>

#include <optional>
#include <string>

#include "python/src/common.h"
#include "python/src/pack_binding.h"
#include "tsar/error.h"

namespace py = pybind11;

PYBIND11_MODULE(_tsar_pack_portable, m) {
  using namespace tsar;
  m.doc() = "tsar.pack's C++ core without LibTorch; use the tsar package, not this module.";
  python::RegisterErrorTranslator();
  TorchSupport none;
  none.import_torchscript = [](const std::string& path, const importer::ImportOptions&)
      -> importer::Imported {
    throw Error(ErrorCode::kUnsupported, path, std::nullopt,
                "a TorchScript archive, which this module reads only through the process's "
                "torch, given as torch_hooks (tsar/_portable_torchscript.py): call "
                "tsar.pack(), which passes them");
  };
  python::DefPack(m, none);
}
