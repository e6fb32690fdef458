// FileRegions (loader/file_regions.h).
#include "loader/file_regions.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <utility>

#include "loader/archive_core.h"
#include "tsar/error.h"

namespace tsar {

FileRegions::FileRegions(const ArchiveCore& core) {
  for (const ArchiveCore* c = &core; c != nullptr; c = c->base.get()) {
    const Mapping* m = c->mapping.get();
    if (m == nullptr || !m->shows_file()) continue;
    const int fd = open(c->path.c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
    if (fd < 0) continue;  // gone or unreadable now: the mapping is copied instead
    struct stat st {};
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_dev != m->dev() ||
        st.st_ino != m->ino()) {
      close(fd);  // the path names another file now
      continue;
    }
    regions_.push_back({m->data(), m->size(), fd, c->path, true});
  }
}

FileRegions::~FileRegions() {
  for (const Region& r : regions_) {
    if (r.owned) close(r.fd);
  }
}

void FileRegions::Add(const uint8_t* data, uint64_t size, int fd, std::string path) {
  regions_.push_back({data, size, fd, std::move(path), false});
}

bool FileRegions::Read(void* dst, const uint8_t* src, uint64_t n) const {
  for (const Region& r : regions_) {
    const auto at = reinterpret_cast<uintptr_t>(src), lo = reinterpret_cast<uintptr_t>(r.data);
    if (at < lo || at - lo > r.size) continue;
    const uint64_t offset = at - lo;
    if (n > r.size - offset) return false;
    uint64_t done = 0;
    while (done < n) {
      const ssize_t got = pread(r.fd, static_cast<uint8_t*>(dst) + done,
                                static_cast<size_t>(n - done), static_cast<off_t>(offset + done));
      if (got < 0 && errno == EINTR) continue;
      if (got < 0) {
        throw Error(ErrorCode::kIo, r.path, offset + done,
                    std::string("reading the archive's bytes for a device copy: ") +
                        std::strerror(errno));
      }
      if (got == 0) {
        throw Error(ErrorCode::kTruncated, r.path, offset + done,
                    "reading the archive's bytes for a device copy: the file ends here, "
                    "before the " + std::to_string(n - done) +
                        " bytes still to read: it was truncated since it was opened");
      }
      done += static_cast<uint64_t>(got);
    }
    return true;
  }
  return false;
}

}  // namespace tsar
