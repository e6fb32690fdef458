// Read-ahead (loader/read_ahead.h) on a file evicted from the page cache: the
// pages of exactly the merged ranges arrive without being touched, on every
// kernel's path; a truncated file costs no fault; the memory guard holds.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "loader/read_ahead.h"

namespace tsar {
namespace {

constexpr uint64_t kMiB = 1 << 20;

// A file of `size` bytes written, synced and evicted, mapped read-only.
class EvictedFile {
 public:
  explicit EvictedFile(uint64_t size) : size_(size) {
    char tmpl[] = "/tmp/tsar-read-ahead-XXXXXX";
    fd_ = mkstemp(tmpl);
    path_ = tmpl;
    std::vector<uint8_t> chunk(kMiB);
    for (size_t i = 0; i < chunk.size(); ++i) chunk[i] = static_cast<uint8_t>(i * 131);
    for (uint64_t done = 0; done < size; done += chunk.size()) {
      EXPECT_EQ(write(fd_, chunk.data(), chunk.size()), static_cast<ssize_t>(chunk.size()));
    }
    fsync(fd_);
    posix_fadvise(fd_, 0, 0, POSIX_FADV_DONTNEED);
    data_ = static_cast<uint8_t*>(mmap(nullptr, size, PROT_READ, MAP_SHARED, fd_, 0));
  }
  ~EvictedFile() {
    munmap(data_, size_);
    close(fd_);
    unlink(path_.c_str());
  }
  const uint8_t* data() const { return data_; }
  // Rss of the mapping: the bytes mapped into this process.
  uint64_t MappedBytes() const {
    std::ifstream in("/proc/self/smaps");
    std::string line;
    bool inside = false;
    uint64_t kib = 0;
    while (std::getline(in, line)) {
      if (line.find(path_) != std::string::npos) {
        inside = true;
      } else if (inside && line.rfind("Rss:", 0) == 0) {
        kib += std::strtoull(line.c_str() + 4, nullptr, 10);
        inside = false;
      }
    }
    return kib << 10;
  }
  void Truncate(uint64_t size) { EXPECT_EQ(ftruncate(fd_, static_cast<off_t>(size)), 0); }
  // Pages of [off, off + len) in the page cache.
  uint64_t Cached(uint64_t off, uint64_t len) const {
    std::vector<unsigned char> v(len / 4096);
    if (mincore(data_ + off, len, v.data()) != 0) return 0;
    uint64_t n = 0;
    for (unsigned char c : v) n += c & 1;
    return n;
  }
  // Waits up to 20 s for every page of [off, off + len) to be cached.
  bool AllCachedSoon(uint64_t off, uint64_t len) const {
    for (int i = 0; i < 2000; ++i) {
      if (Cached(off, len) == len / 4096) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return false;
  }

 private:
  uint64_t size_;
  int fd_ = -1;
  std::string path_;
  uint8_t* data_ = nullptr;
};

// Both ways: MADV_POPULATE_READ, and the MADV_WILLNEED steps of older kernels.
class ReadAheadBothWays : public ::testing::TestWithParam<bool> {};

TEST_P(ReadAheadBothWays, ReadsTheMergedRangesWithoutTouchingThem) {
  EvictedFile f(8 * kMiB);
  if (f.Cached(0, 8 * kMiB) != 0) GTEST_SKIP() << "the page cache cannot be evicted here (tmpfs?)";
  // Unsorted and overlapping: [0, 1.5 MiB) and [3 MiB, 4 MiB); the rest stays out.
  const uint64_t asked = ReadAheadNow({{f.data() + 3 * kMiB, kMiB},
                                       {f.data(), kMiB},
                                       {f.data() + kMiB / 2, kMiB},
                                       {f.data() + 6 * kMiB, 0}},
                                      GetParam());
  EXPECT_EQ(asked, 3 * kMiB / 2 + kMiB);
  EXPECT_TRUE(f.AllCachedSoon(0, 3 * kMiB / 2));
  EXPECT_TRUE(f.AllCachedSoon(3 * kMiB, kMiB));
  if (GetParam()) {
    // Populated: mapped into this process too, the ranges and at most the
    // large folios around them, never the whole file. (The kernel's own
    // read-around of those faults may cache more; only a touch maps it.)
    const uint64_t rss = f.MappedBytes();
    EXPECT_GE(rss, 3 * kMiB / 2 + kMiB);
    EXPECT_LE(rss, 6 * kMiB);
  } else {
    // WILLNEED reads exactly what is asked.
    EXPECT_EQ(f.Cached(5 * kMiB, 3 * kMiB), 0u);
  }
}

TEST_P(ReadAheadBothWays, AnUnalignedRangeIsWidenedToWholePages) {
  EvictedFile f(2 * kMiB);
  if (f.Cached(0, 2 * kMiB) != 0) GTEST_SKIP() << "the page cache cannot be evicted here (tmpfs?)";
  // 5 bytes across the boundary of two pages: both are read.
  EXPECT_EQ(ReadAheadNow({{f.data() + kMiB - 2, 5}}, GetParam()), 8192u);
  EXPECT_TRUE(f.AllCachedSoon(kMiB - 4096, 8192));
}

INSTANTIATE_TEST_SUITE_P(Advice, ReadAheadBothWays, ::testing::Values(true, false),
                         [](const ::testing::TestParamInfo<bool>& p) {
                           return p.param ? "PopulateRead" : "WillNeedSteps";
                         });

TEST(ReadAhead, BytesATruncatedFileNoLongerHasAreSkippedWithoutAFault) {
  EvictedFile f(4 * kMiB);
  f.Truncate(kMiB);  // a touch past 1 MiB would raise SIGBUS now
  EXPECT_EQ(ReadAheadNow({{f.data(), 4 * kMiB}}), 4 * kMiB);
  EXPECT_TRUE(f.AllCachedSoon(0, kMiB));
}

TEST(ReadAhead, StartsAThreadThatReadsTheRange) {
  EvictedFile f(4 * kMiB);
  if (f.Cached(0, 4 * kMiB) != 0) GTEST_SKIP() << "the page cache cannot be evicted here (tmpfs?)";
  ASSERT_TRUE(StartReadAhead(nullptr, {{f.data(), 4 * kMiB}}));
  EXPECT_TRUE(f.AllCachedSoon(0, 4 * kMiB));
}

TEST(ReadAhead, StartsNothingForNoBytesOrMoreThanHalfOfTheMemoryAvailable) {
  EXPECT_FALSE(StartReadAhead(nullptr, {}));
  EXPECT_FALSE(StartReadAhead(nullptr, {{nullptr, 0}}));
  // Never touched: refused before any thread could read it.
  EXPECT_FALSE(StartReadAhead(nullptr, {{nullptr, uint64_t{1} << 62}}));
}

}  // namespace
}  // namespace tsar
