// How the tsar command line writes values for people and for JSON: roles,
// shapes, metadata values (shared by inspect, diff and residency).
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "tsar/archive_file.h"

namespace tsar::cli {

// For a file that is not an archive (`e` is kBadMagic) but an input of
// `tsar pack` (torch.save, TorchScript, safetensors, HDF5), throws an error
// that says so and how to pack it, instead of the magic bytes it does not
// have; else returns.
void ExplainNotAnArchive(const std::string& path, const Error& e);

// A::open (ArchiveFile, or Archive on the LibTorch side) with the error of
// ExplainNotAnArchive for a pack input.
template <typename A>
A OpenAs(const std::string& path, const OpenOptions& options = {}) {
  try {
    return A::open(path, options);
  } catch (const Error& e) {
    ExplainNotAnArchive(path, e);
    throw;
  }
}
inline ArchiveFile OpenArchive(const std::string& path, const OpenOptions& options = {}) {
  return OpenAs<ArchiveFile>(path, options);
}

// `s` for a terminal: control characters (C0, DEL, and C1 as UTF-8) as
// \xNN, so a name in a hostile archive cannot move the cursor, clear the
// screen or retitle the terminal; everything else (UTF-8 included) as it is.
std::string Printable(std::string_view s);

// "[2, 3]".
std::string Dims(const std::vector<int64_t>& v);
// Lower-case hex of up to `max` bytes, "..." when cut.
std::string Hex(const std::string& bytes, size_t max);
// A float in the shortest text that reads back as the same double, as
// Python's repr: "0.9" (not 0.90000000000000002), "100.0", "1e+20", "inf",
// "-nan".
std::string FloatText(double d);
// A metadata value as JSON: string, integer, float, or {"bytes_hex": "..."}.
nlohmann::ordered_json MetaJson(const MetadataValue& v);
// A metadata value on one line: "\"run1\" (string)", "10 (int)", "0.5 (float)",
// "00ff10 (bytes, 3)"; control characters escaped, long strings shortened.
std::string MetaText(const MetadataValue& v);

}  // namespace tsar::cli
