// Background read-ahead of mapped archive bytes (loader/read_ahead.h).
#include "loader/read_ahead.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <system_error>
#include <thread>
#include <utility>

#include "loader/archive_core.h"

#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22  // Linux 5.14; older C libraries lack the name
#endif

namespace tsar {
namespace {

// MemAvailable from /proc/meminfo, in bytes; 0 when it cannot be read.
uint64_t MemAvailable() {
  std::FILE* f = std::fopen("/proc/meminfo", "re");
  if (f == nullptr) return 0;
  char line[256];
  unsigned long long kib = 0;
  while (std::fgets(line, sizeof line, f) != nullptr) {
    if (std::sscanf(line, "MemAvailable: %llu kB", &kib) == 1) break;
  }
  std::fclose(f);
  return static_cast<uint64_t>(kib) << 10;
}

// One step, [at, at + len). MADV_POPULATE_READ answers EFAULT past the end of
// a truncated file (where a touch would raise SIGBUS): those bytes are gone,
// nothing to read. `populate` turns false for good where the kernel refuses
// the advice itself.
void ReadStep(uintptr_t at, uint64_t len, bool* populate) {
  if (*populate) {
    int rc;
    do {
      rc = madvise(reinterpret_cast<void*>(at), len, MADV_POPULATE_READ);
    } while (rc != 0 && errno == EINTR);
    if (rc == 0 || errno != EINVAL) return;
    *populate = false;
  }
  for (uint64_t off = 0; off < len; off += kWillNeedStep) {
    madvise(reinterpret_cast<void*>(at + off), std::min(kWillNeedStep, len - off), MADV_WILLNEED);
  }
}

}  // namespace

uint64_t ReadAheadNow(std::vector<ByteRange> ranges, bool populate) {
  const auto page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  ranges.erase(std::remove_if(ranges.begin(), ranges.end(),
                              [](const ByteRange& r) { return r.size == 0; }),
               ranges.end());
  std::sort(ranges.begin(), ranges.end(),
            [](const ByteRange& a, const ByteRange& b) { return a.data < b.data; });
  uint64_t asked = 0;
  size_t i = 0;
  while (i < ranges.size()) {
    // One run of overlapping or touching ranges, widened to whole pages.
    auto lo = reinterpret_cast<uintptr_t>(ranges[i].data);
    uintptr_t hi = lo + ranges[i].size;
    for (++i; i < ranges.size() && reinterpret_cast<uintptr_t>(ranges[i].data) <= hi; ++i) {
      hi = std::max<uintptr_t>(hi, reinterpret_cast<uintptr_t>(ranges[i].data) + ranges[i].size);
    }
    lo &= ~(page - 1);
    hi = (hi + page - 1) & ~(page - 1);
    for (uintptr_t at = lo; at < hi; at += kReadAheadStep) {
      ReadStep(at, std::min<uint64_t>(kReadAheadStep, hi - at), &populate);
    }
    asked += hi - lo;
  }
  return asked;
}

bool StartReadAhead(std::shared_ptr<const ArchiveCore> keep, std::vector<ByteRange> ranges) {
  uint64_t total = 0;
  for (const ByteRange& r : ranges) total += r.size;
  if (total == 0) return false;
  const uint64_t available = MemAvailable();
  if (available != 0 && total > available / 2) return false;
  try {
    std::thread([keep = std::move(keep), ranges = std::move(ranges)]() mutable {
      ReadAheadNow(std::move(ranges));
      keep.reset();  // the last owner may unmap here, off the caller's thread
    }).detach();
  } catch (const std::system_error&) {
    return false;  // no thread to spare: the pages come in on first touch, as without
  }
  return true;
}

}  // namespace tsar
