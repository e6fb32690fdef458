// mmap / pread of archive files (loader/mapping.h).
#include "loader/mapping.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

namespace tsar {
namespace {

[[noreturn]] void IoError(const std::string& path, const std::string& what, int err) {
  throw Error(ErrorCode::kIo, path, std::nullopt, what + ": " + std::strerror(err));
}

}  // namespace

std::unique_ptr<Mapping> Mapping::Create(int fd, const struct stat& st, MapMode mode,
                                         Prefetch prefetch, const std::string& path,
                                         bool* refused) {
  const auto size = static_cast<uint64_t>(st.st_size);
  std::unique_ptr<Mapping> m(new Mapping());
  m->size_ = size;
  m->mode_ = mode;
  if (size > static_cast<uint64_t>(SIZE_MAX)) IoError(path, "cannot map", EFBIG);
  const size_t len = static_cast<size_t>(size);
  *refused = false;
  if (mode == MapMode::kRead) {
    // Page-aligned so storages keep the alignment the format promises.
    void* p = nullptr;
    if (posix_memalign(&p, 4096, len == 0 ? 1 : len) != 0) IoError(path, "cannot allocate", ENOMEM);
    m->data_ = static_cast<uint8_t*>(p);
    uint64_t done = 0;
    while (done < size) {
      const size_t chunk = static_cast<size_t>(std::min<uint64_t>(size - done, 64u << 20));
      const ssize_t n = pread(fd, m->data_ + done, chunk, static_cast<off_t>(done));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) IoError(path, "cannot read", errno);
      if (n == 0) {
        throw Error(ErrorCode::kTruncated, path, done, "file shrank while being read");
      }
      done += static_cast<uint64_t>(n);
    }
    return m;
  }
  int flags = mode == MapMode::kShared ? MAP_SHARED : MAP_PRIVATE;
  const int prot = mode == MapMode::kShared ? PROT_READ : PROT_READ | PROT_WRITE;
  if (prefetch == Prefetch::kPopulate || prefetch == Prefetch::kLock) flags |= MAP_POPULATE;
  void* p = mmap(nullptr, len, prot, flags, fd, 0);
  if (p == MAP_FAILED) {
    if (errno == ENODEV || errno == EACCES || errno == EPERM || errno == EINVAL) {
      *refused = true;
      return nullptr;
    }
    IoError(path, "cannot mmap", errno);
  }
  m->data_ = static_cast<uint8_t*>(p);
  m->is_mmap_ = true;
  if (prefetch == Prefetch::kLock) {
    if (mlock(p, len) != 0)
      IoError(path, "cannot mlock " + std::to_string(size) + " bytes (see ulimit -l)", errno);
    m->locked_ = true;
  }
  if (mode == MapMode::kShared) {
    m->shows_file_ = true;
    m->dev_ = st.st_dev;
    m->ino_ = st.st_ino;
  }
  return m;
}

Mapping::~Mapping() {
  if (is_mmap_) {
    if (locked_) munlock(data_, static_cast<size_t>(size_));
    munmap(data_, static_cast<size_t>(size_));
  } else {
    std::free(data_);
  }
}

}  // namespace tsar
