// What both extension modules of the tsar package share (python/src/module.cc:
// tsar._tsar, open / bind / save; python/src/pack_module.cc: tsar._tsar_pack,
// pack from files): tsar::Error as tsar.Error, and option conversions.
#pragma once

#include <pybind11/pybind11.h>

#include <optional>
#include <string>

#include "tsar/dtype.h"
#include "tsar/archive_file.h"

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

}  // namespace tsar::python
