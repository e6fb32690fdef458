// Attached files (spec §4.7.1): archive-level bytes metadata whose key is
// "file:" + a relative path hold a file of a model directory byte for byte.
// The key grammar, shared by the writer (writer/import_transformers.cc) and
// every reader (cli/inspect.cc); python/tsar/_archive.py and
// spec/reference/tsar_ref.py implement the same rule.
#pragma once

#include <string_view>

#include "format/reader.h"

namespace tsar::format {

// §4.7.1: the prefix of an attached file's key.
inline constexpr std::string_view kAttachedFilePrefix = "file:";

// §4.7.1: the name of an attached file: 1 or more bytes, '/'-separated
// components, none empty, "." or "..", not starting or ending with '/', no
// NUL byte. (UTF-8 and the 65535-byte limit are those of every key, R67.)
inline bool IsAttachedFileName(std::string_view name) {
  if (!IsRelativePath(name)) return false;
  size_t start = 0;
  while (start <= name.size()) {
    size_t slash = name.find('/', start);
    if (slash == std::string_view::npos) slash = name.size();
    const std::string_view part = name.substr(start, slash - start);
    if (part == "." || part == "..") return false;
    start = slash + 1;
  }
  return true;
}

// The file name of metadata key `key` when the key names an attached file
// under §4.7.1 ("file:" and a name IsAttachedFileName accepts); empty
// otherwise. The record must also be archive-level and of type 4 (bytes) to
// be a file: the caller checks those.
inline std::string_view AttachedFileName(std::string_view key) {
  if (key.size() <= kAttachedFilePrefix.size() ||
      key.substr(0, kAttachedFilePrefix.size()) != kAttachedFilePrefix)
    return {};
  const std::string_view name = key.substr(kAttachedFilePrefix.size());
  return IsAttachedFileName(name) ? name : std::string_view();
}

}  // namespace tsar::format
