// Opening input files: only regular files, refused before open(2) can block
// (a FIFO) or act (a device), shared by the loader, the importers and the CLI.
#pragma once

#include <sys/stat.h>

#include <string>

#include "tsar/error.h"

namespace tsar {

// What a file that is not a regular file is, for messages: "a FIFO",
// "a character device", "a directory"...
const char* FileTypeName(mode_t mode);

// Opens `path` read-only (O_CLOEXEC) and returns the descriptor, after
// checking it is a regular file both before open and on the open descriptor.
// `st` receives its fstat. Throws kNotFound (absent), kIo (other errno), and
// `not_regular` for anything else ("not a regular file: it is a FIFO").
int OpenRegularFile(const std::string& path, struct stat* st, ErrorCode not_regular);

// The directory that holds `path`: "." for a bare name, "/" for one at the root.
std::string DirOf(const std::string& path);

}  // namespace tsar
