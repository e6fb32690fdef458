// Archive.state_dict(device=) and load_into(device=) on the portable path
// (no LibTorch): the staging pipeline of loader/device_pipeline.h, the same
// one the accelerator's to_device runs, with the GPU behind a Python object
// that drives torch's own Python API (tsar/_portable_device.py). The fill
// threads copy the archive's bytes (read from its file, or out of its
// mapping) into the pinned buffers without the GIL; only the engine's calls,
// one per transfer, take it.
#pragma once

#include <pybind11/pybind11.h>

namespace tsar::python {

// Adds _tsar_portable.stage_to_device (see portable_device.cc).
void DefPortableDevice(pybind11::module_& m);

}  // namespace tsar::python
