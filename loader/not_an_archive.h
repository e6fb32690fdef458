// What a file is that was opened as an archive but is not one (its magic is
// wrong, R1): a pack input named by its bytes, and what to do with it.
#pragma once

#include <string>

#include "tsar/error.h"

namespace tsar {

// For a file whose magic is not tsar's: "not a tsar archive (a safetensors
// file): pack it first: tsar pack PATH -o ARCHIVE.tsar (tsar.pack in
// Python)" when its bytes say what it is (torch.save or TorchScript zip,
// safetensors, safetensors index named *.index.json, HDF5, a legacy pickled
// torch.save), else "". Reads the file again; throws nothing.
std::string NotAnArchiveHint(const std::string& path);

// `e` (the R1 error of DecodeHeader) with "; " and NotAnArchiveHint(path)
// after its message when there is a hint; else `e` itself. The message
// before "; " stays exactly that of spec §6.7, R1.
Error WithNotAnArchiveHint(const Error& e);

}  // namespace tsar
