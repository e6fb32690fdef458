// loader/device_pipeline.h.
#include "loader/device_pipeline.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>

namespace tsar {

PipelineStats RunPipeline(const std::vector<CopyRange>& ranges, CopyEngine& engine,
                          const PipelineOptions& options,
                          const std::function<void(void*, const uint8_t*, uint64_t)>& fill) {
  if (options.buffers < 1 || options.streams < 1) {
    throw std::invalid_argument("PipelineOptions: expected at least 1 buffer and 1 stream, found " +
                                std::to_string(options.buffers) + " and " +
                                std::to_string(options.streams));
  }
  // Buffers of whole 64 KiB granules, fewer buffers rather than more pinned
  // memory than asked (one granule at the least).
  constexpr uint64_t kGranule = uint64_t{64} << 10;
  const uint64_t granules = std::max<uint64_t>(1, options.pinned_bytes / kGranule);
  const uint64_t per = std::max<uint64_t>(1, granules / std::min<uint64_t>(granules, options.buffers));
  const uint64_t each = per * kGranule;
  PipelineStats stats;
  uint64_t total = 0;
  for (const CopyRange& r : ranges) total += r.n;
  if (total == 0) return stats;
  // No more buffers than the bytes need.
  const int buffers = static_cast<int>(std::min<uint64_t>(
      {uint64_t(options.buffers), granules / per, (total + each - 1) / each}));
  std::vector<uint8_t*> pinned(buffers);
  for (int b = 0; b < buffers; ++b) {
    pinned[b] = static_cast<uint8_t*>(engine.AllocatePinned(b, each));
    stats.pinned_bytes += each;
  }
  std::vector<bool> in_flight(buffers, false);
  int b = 0;            // the buffer being filled
  uint64_t used = 0;    // bytes of it filled
  uint64_t fills = 0;   // buffers sent so far: picks the stream
  std::vector<CopyRange> pending;  // the transfers of the buffer being filled
  const auto send = [&] {
    const int stream = static_cast<int>(fills++ % options.streams);
    for (const CopyRange& p : pending) {
      engine.CopyAsync(stream, p.src, p.target, p.offset, p.n);
      ++stats.transfers;
    }
    engine.RecordDone(stream, b);
    in_flight[b] = true;
    pending.clear();
    b = (b + 1) % buffers;
    used = 0;
  };
  for (const CopyRange& r : ranges) {
    for (uint64_t done = 0; done < r.n;) {
      if (used == 0 && in_flight[b]) {  // refill only after its transfer finished
        engine.WaitDone(b);
        in_flight[b] = false;
        ++stats.buffer_waits;
      }
      const uint64_t n = std::min(r.n - done, each - used);
      uint8_t* dst = pinned[b] + used;
      if (fill) {
        fill(dst, r.src + done, n);
      } else {
        std::memcpy(dst, r.src + done, n);
      }
      pending.push_back({dst, n, r.target, r.offset + done});
      used += n;
      done += n;
      stats.bytes += n;
      if (used == each) send();
    }
  }
  if (used > 0) send();
  engine.Finish();
  return stats;
}

}  // namespace tsar
