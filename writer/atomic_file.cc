// AtomicFile (writer/atomic_file.h). With O_TMPFILE nothing is ever left
// behind, even after SIGKILL; the named-temporary fallback is removed on error.
#include "writer/atomic_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "tsar/error.h"

namespace tsar {
namespace {

// The archive is immutable once published: read-only for everyone (umask applies).
constexpr mode_t kMode = 0444;

std::string DirOf(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}
std::string BaseOf(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

}  // namespace

AtomicFile::AtomicFile(std::string path) : path_(std::move(path)), dir_(DirOf(path_)) {
  if (path_.empty() || path_.back() == '/') {
    throw Error(ErrorCode::kInvalidArgument, path_, std::nullopt, "output: expected a file name");
  }
  struct stat st;
  if (stat(path_.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
    throw Error(ErrorCode::kInvalidArgument, path_, std::nullopt,
                "output: is a directory, expected a file name");
  }
#ifdef O_TMPFILE
  fd_ = open(dir_.c_str(), O_TMPFILE | O_WRONLY | O_CLOEXEC, kMode);
#endif
  if (fd_ < 0) {
    temp_name_ = dir_ + "/." + BaseOf(path_) + ".tmp-XXXXXX";
    fd_ = mkstemp(temp_name_.data());
    if (fd_ < 0) {
      const int err = errno;
      temp_name_.clear();
      throw Error(ErrorCode::kIo, path_, std::nullopt,
                  "cannot create a file in directory " + dir_ + ": " + std::strerror(err));
    }
    const mode_t mask = umask(0);
    umask(mask);
    fchmod(fd_, kMode & ~mask);
  }
}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) close(fd_);
  if (!published_ && !temp_name_.empty()) unlink(temp_name_.c_str());
}

void AtomicFile::Fail(const std::string& what, int err) const {
  throw Error(ErrorCode::kIo, path_, std::nullopt, what + ": " + std::strerror(err));
}

void AtomicFile::Resize(uint64_t size) {
  if (ftruncate(fd_, static_cast<off_t>(size)) != 0)
    Fail("cannot size the output to " + std::to_string(size) + " bytes", errno);
}

void AtomicFile::WriteAt(uint64_t offset, const void* data, uint64_t size) {
  const auto* p = static_cast<const uint8_t*>(data);
  while (size > 0) {
    const size_t chunk = static_cast<size_t>(std::min<uint64_t>(size, 1u << 30));
    const ssize_t n = pwrite(fd_, p, chunk, static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) Fail("cannot write", errno);
    p += n;
    offset += static_cast<uint64_t>(n);
    size -= static_cast<uint64_t>(n);
  }
}

void AtomicFile::Publish(bool durable) {
  if (durable && fsync(fd_) != 0) Fail("cannot flush", errno);
  if (temp_name_.empty()) {
    // Give the unnamed file a name in the same directory, then rename it over
    // the destination: linkat cannot replace an existing file, rename can.
    char proc[64];
    std::snprintf(proc, sizeof proc, "/proc/self/fd/%d", fd_);
    char suffix[32];
    std::snprintf(suffix, sizeof suffix, ".tmp-%ld", static_cast<long>(getpid()));
    std::string name = dir_ + "/." + BaseOf(path_) + suffix;
    unlink(name.c_str());
    if (linkat(AT_FDCWD, proc, AT_FDCWD, name.c_str(), AT_SYMLINK_FOLLOW) != 0) {
      Fail("cannot link the new archive into " + dir_, errno);
    }
    temp_name_ = name;
  }
  if (rename(temp_name_.c_str(), path_.c_str()) != 0) Fail("cannot rename into place", errno);
  published_ = true;
  if (durable) {
    const int dfd = open(dir_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
      const int rc = fsync(dfd);
      const int err = errno;
      close(dfd);
      if (rc != 0) Fail("cannot flush directory " + dir_, err);
    }
  }
}

}  // namespace tsar
