// loader/device_pipeline.h.
#include "loader/device_pipeline.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>

namespace tsar {
namespace {

using Fill = std::function<void(void*, const uint8_t*, uint64_t)>;

// One piece of a buffer's fill: n bytes from the mapping at src to dst.
struct Piece {
  uint8_t* dst;
  const uint8_t* src;
  uint64_t n;
};

// Threads that fill a buffer's pieces together with the calling thread. A
// Run is one job; workers take pieces from it by an atomic index, and Run
// returns once every piece is copied and no worker still holds the job.
class FillPool {
 public:
  explicit FillPool(int threads) {
    try {
      for (int i = 1; i < threads; ++i) workers_.emplace_back([this] { Loop(); });
    } catch (...) {  // no thread to be had: stop the ones made, then say so
      Stop();
      throw;
    }
  }
  ~FillPool() { Stop(); }
  // Returns when every piece is copied and no worker holds the job; an
  // exception from `fill` (on any thread) is rethrown here, after that.
  void Run(const std::vector<Piece>& pieces, const Fill& fill) {
    Job job{&pieces, &fill};
    if (!workers_.empty()) {
      {
        const std::lock_guard<std::mutex> lock(mu_);
        job_ = &job;
        ++generation_;
      }
      wake_.notify_all();
    }
    Work(job);
    if (!workers_.empty()) {
      std::unique_lock<std::mutex> lock(mu_);
      done_.wait(lock, [&] { return active_ == 0 && job.finished == pieces.size(); });
      job_ = nullptr;
    }
    if (job.error) std::rethrow_exception(job.error);
  }

 private:
  struct Job {
    Job(const std::vector<Piece>* p, const Fill* f) : pieces(p), fill(f) {}
    const std::vector<Piece>* pieces;
    const Fill* fill;
    std::atomic<size_t> next{0};
    std::atomic<size_t> finished{0};
    std::mutex error_mu;
    std::exception_ptr error;  // the first exception of a fill
  };
  static void Work(Job& job) {
    for (size_t i; (i = job.next.fetch_add(1)) < job.pieces->size();) {
      const Piece& p = (*job.pieces)[i];
      try {
        if (*job.fill) {
          (*job.fill)(p.dst, p.src, p.n);
        } else {
          std::memcpy(p.dst, p.src, p.n);
        }
      } catch (...) {
        const std::lock_guard<std::mutex> lock(job.error_mu);
        if (!job.error) job.error = std::current_exception();
      }
      job.finished.fetch_add(1);
    }
  }
  void Stop() {
    {
      const std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    wake_.notify_all();
    for (std::thread& t : workers_) t.join();
    workers_.clear();
  }
  void Loop() {
    uint64_t seen = 0;
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      Job* job = job_;
      if (!job) continue;
      ++active_;
      lock.unlock();
      Work(*job);
      lock.lock();
      --active_;
      done_.notify_all();
    }
  }
  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable wake_, done_;
  Job* job_ = nullptr;
  uint64_t generation_ = 0;
  int active_ = 0;
  bool stop_ = false;
};

}  // namespace

PipelineOptions StagingFor(const PipelineOptions& asked, unsigned cores) {
  constexpr unsigned kMostFillThreads = 16;
  constexpr int kStreams = 4;
  PipelineOptions o = asked;
  if (o.fill_threads == 0)
    o.fill_threads = static_cast<int>(std::clamp(cores, 1u, kMostFillThreads));
  if (o.streams == 0) o.streams = kStreams;
  return o;
}

PipelineStats RunPipeline(const std::vector<CopyRange>& ranges, CopyEngine& engine,
                          const PipelineOptions& asked,
                          const std::function<void(void*, const uint8_t*, uint64_t)>& fill) {
  const PipelineOptions options = StagingFor(asked, std::thread::hardware_concurrency());
  if (options.buffers < 1 || options.streams < 1) {
    throw std::invalid_argument("PipelineOptions: expected at least 1 buffer and 1 stream, found " +
                                std::to_string(options.buffers) + " and " +
                                std::to_string(options.streams));
  }
  // Buffers of whole 64 KiB granules, fewer buffers rather than more pinned
  // memory than asked (one granule at the least).
  constexpr uint64_t kGranule = uint64_t{64} << 10;
  const uint64_t granules = std::max<uint64_t>(1, options.pinned_bytes / kGranule);
  const uint64_t per =
      std::max<uint64_t>(1, granules / std::min<uint64_t>(granules, options.buffers));
  const uint64_t each = per * kGranule;
  PipelineStats stats;
  uint64_t total = 0;
  for (const CopyRange& r : ranges) total += r.n;
  if (total == 0) return stats;
  // No more buffers than the bytes need.
  const int buffers = static_cast<int>(
      std::min<uint64_t>({uint64_t(options.buffers), granules / per, (total + each - 1) / each}));
  std::vector<uint8_t*> pinned(buffers);
  for (int b = 0; b < buffers; ++b) {
    pinned[b] = static_cast<uint8_t*>(engine.AllocatePinned(b, each));
    stats.pinned_bytes += each;
  }
  const int threads = options.fill_threads;
  constexpr uint64_t kPiece = uint64_t{1} << 20;  // the unit of work of one fill thread
  std::vector<Piece> pieces;  // the fill of the buffer being filled (outlives the pool)
  FillPool pool(threads);
  stats.fill_threads = threads;
  std::vector<bool> in_flight(buffers, false);
  int b = 0;                       // the buffer being filled
  uint64_t used = 0;               // bytes of it filled
  uint64_t fills = 0;              // buffers sent so far: picks the stream
  std::vector<CopyRange> pending;  // the transfers of the buffer being filled
  const auto send = [&] {
    pool.Run(pieces, fill);
    pieces.clear();
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
  try {
    for (const CopyRange& r : ranges) {
      for (uint64_t done = 0; done < r.n;) {
        if (used == 0 && in_flight[b]) {  // refill only after its transfer finished
          engine.WaitDone(b);
          in_flight[b] = false;
          ++stats.buffer_waits;
        }
        const uint64_t n = std::min(r.n - done, each - used);
        uint8_t* dst = pinned[b] + used;
        for (uint64_t k = 0; k < n; k += kPiece) {
          pieces.push_back({dst + k, r.src + done + k, std::min(kPiece, n - k)});
        }
        pending.push_back({dst, n, r.target, r.offset + done});
        used += n;
        done += n;
        stats.bytes += n;
        if (used == each) send();
      }
    }
    if (used > 0) send();
  } catch (...) {
    // Transfers already enqueued still write into the targets: let them end
    // before the caller frees anything.
    try {
      engine.Finish();
    } catch (...) {
    }
    throw;
  }
  engine.Finish();
  return stats;
}

}  // namespace tsar
