// Reading mapped archive bytes into the page cache, and into this process's
// page tables, ahead of their first touch, on a thread of its own
// (BindOptions::read_ahead, Prefetch::kWillNeed). No LibTorch here.
//
// How: madvise(MADV_POPULATE_READ) (Linux 5.14) in steps of 2 MiB. Measured
// on a 2 GiB archive evicted from the page cache (kernel 6.18, ext4,
// bench/README.md "Read-ahead"), it reads at the disk's sequential rate or
// better and fills the cache with large folios, as a sequential read(2) does,
// so a process touching every page afterwards takes about 1,500 page faults.
// The obvious alternative is worse twice over: madvise(MADV_WILLNEED) and
// posix_fadvise(POSIX_FADV_WILLNEED) read at most one read-ahead window per
// call (read_ahead_kb, whatever length is asked: a few MiB of a whole file),
// and asked in window-sized steps they fill the cache with 4 KiB folios, which
// cost every process that maps them 34,000 page faults for those 2 GiB. They
// remain the fallback where MADV_POPULATE_READ is refused (older kernels).
// Steps of 2 MiB bound how long each call holds the process's mmap lock.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "loader/byte_range.h"

namespace tsar {

struct ArchiveCore;

// The steps of MADV_POPULATE_READ (a large folio), and of the fallback
// (the kernel's default read-ahead window, so that no part of a step is
// dropped on any device).
inline constexpr uint64_t kReadAheadStep = 2 << 20;
inline constexpr uint64_t kWillNeedStep = 128 << 10;

// Starts a detached thread that reads `ranges` (addresses inside mappings
// that `keep` holds alive, in any order, overlapping or not) as ReadAheadNow
// does, and returns at once. Nothing starts when the ranges are empty or
// their bytes exceed half of the memory available (MemAvailable): reading
// them would evict pages the process needs. Returns whether a thread started.
bool StartReadAhead(std::shared_ptr<const ArchiveCore> keep, std::vector<ByteRange> ranges);

// The thread's work, on the calling thread: merges `ranges`, widens them to
// whole pages and reads them in address order. Never faults: bytes a
// truncated file no longer has are skipped. Returns the bytes asked for.
// populate=false takes the fallback from the start (for its tests).
uint64_t ReadAheadNow(std::vector<ByteRange> ranges, bool populate = true);

}  // namespace tsar
