// OpenRegularFile (loader/open_file.h).
#include "loader/open_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace tsar {

const char* FileTypeName(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISLNK(mode)) return "a symbolic link";
  if (S_ISREG(mode)) return "a regular file";
  return "not a file";
}

namespace {
[[noreturn]] void Fail(const std::string& path, const char* what, int err) {
  throw Error(err == ENOENT ? ErrorCode::kNotFound : ErrorCode::kIo, path, std::nullopt,
              std::string(what) + ": " + std::strerror(err));
}
[[noreturn]] void NotRegular(const std::string& path, mode_t mode, ErrorCode code) {
  throw Error(code, path, std::nullopt,
              std::string("not a regular file (it is ") + FileTypeName(mode) + ")");
}
}  // namespace

int OpenRegularFile(const std::string& path, struct stat* st, ErrorCode not_regular) {
  // stat first: opening a FIFO blocks until a writer comes, and opening some
  // devices acts (a watchdog starts); neither may happen for a bad path.
  if (stat(path.c_str(), st) != 0) Fail(path, "cannot open", errno);
  if (!S_ISREG(st->st_mode)) NotRegular(path, st->st_mode, not_regular);
  // O_NONBLOCK in case the path was swapped for a FIFO since the stat.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (fd < 0) Fail(path, "cannot open", errno);
  if (fstat(fd, st) != 0) {
    const int err = errno;
    close(fd);
    Fail(path, "cannot stat", err);
  }
  if (!S_ISREG(st->st_mode)) {
    close(fd);
    NotRegular(path, st->st_mode, not_regular);
  }
  const int flags = fcntl(fd, F_GETFL);
  if (flags >= 0) fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
  return fd;
}

std::string DirOf(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

}  // namespace tsar
