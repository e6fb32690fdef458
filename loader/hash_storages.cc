// HashRanges (loader/hash_storages.h).
#include "loader/hash_storages.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <thread>

#include "format/checksum.h"

namespace tsar {

std::vector<uint64_t> HashRanges(const std::vector<ByteRange>& ranges,
                                 const std::function<void(uint64_t)>& progress) {
  std::vector<uint64_t> out(ranges.size());
  uint64_t total = 0;
  for (const auto& r : ranges) total += r.size;
  // A thread pays for itself only on real amounts of data.
  constexpr uint64_t kPerThread = 64u << 20;
  constexpr uint64_t kChunk = 16u << 20;  // progress steps
  const size_t threads =
      std::min<size_t>({std::max(1u, std::thread::hardware_concurrency()), size_t{8},
                        std::max<size_t>(ranges.size(), 1), total / kPerThread + 1});
  std::atomic<size_t> next{0};
  std::atomic<uint64_t> done{0};
  std::atomic<size_t> running{threads};
  const bool report = static_cast<bool>(progress);
  auto work = [&](bool caller) {
    for (size_t i; (i = next.fetch_add(1)) < ranges.size();) {
      format::Xxh3Stream h;
      for (uint64_t off = 0; off < ranges[i].size; off += kChunk) {
        const uint64_t n = std::min(kChunk, ranges[i].size - off);
        h.Update(ranges[i].data + off, static_cast<size_t>(n));
        const uint64_t now = done.fetch_add(n) + n;
        if (caller && report) progress(now);
      }
      out[i] = h.Digest();
    }
    running.fetch_sub(1);
  };
  std::vector<std::thread> pool;
  for (size_t t = 1; t < threads; ++t) pool.emplace_back(work, false);
  work(true);
  while (report && running.load() > 0) {  // the others' last ranges
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    progress(done.load());
  }
  for (auto& t : pool) t.join();
  if (report) progress(done.load());
  return out;
}

}  // namespace tsar
