// loader/device_pipeline.h.
#include "loader/device_pipeline.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <mutex>
#include <stdexcept>
#include <map>
#include <string>
#include <thread>

#include <unistd.h>

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

// A window of the mapping's address space: [lo, lo + n), whole pages, and
// the runs of the ranges inside it.
struct Window {
  const uint8_t* lo = nullptr;
  uint64_t n = 0;
  std::vector<CopyRange> runs;
};

// The ranges cut at every multiple of `window` in the address space (so two
// windows never share a page), in address order; each window's span is the
// pages its runs touch.
std::vector<Window> SplitIntoWindows(const std::vector<CopyRange>& ranges, uint64_t window,
                                     uint64_t page) {
  std::map<uintptr_t, Window> by_start;
  std::map<uintptr_t, uintptr_t> end_of;
  for (const CopyRange& r : ranges) {
    for (uint64_t done = 0; done < r.n;) {
      const auto at = reinterpret_cast<uintptr_t>(r.src + done);
      const uintptr_t start = at / window * window;
      const uint64_t n = std::min<uint64_t>(r.n - done, start + window - at);
      Window& w = by_start[start];
      w.runs.push_back({r.src + done, n, r.target, r.offset + done});
      const uintptr_t lo = at / page * page;
      const uintptr_t hi = (at + n + page - 1) / page * page;
      if (w.lo == nullptr || lo < reinterpret_cast<uintptr_t>(w.lo)) {
        w.lo = reinterpret_cast<const uint8_t*>(lo);
      }
      uintptr_t& end = end_of[start];
      end = std::max(end, hi);
      done += n;
    }
  }
  std::vector<Window> out;
  out.reserve(by_start.size());
  for (auto& [start, w] : by_start) {
    w.n = end_of[start] - reinterpret_cast<uintptr_t>(w.lo);
    out.push_back(std::move(w));
  }
  return out;
}

// The windows both kinds of lane take from: the staging lane from the
// front, the direct lanes from the back; a window a direct lane could not
// lock comes back for the staging lane.
class WindowQueue {
 public:
  explicit WindowQueue(std::vector<Window> windows)
      : windows_(std::move(windows)), back_(windows_.size()) {}
  const Window* TakeFront() {
    const std::lock_guard<std::mutex> lock(mu_);
    if (!returned_.empty()) {
      const Window* w = returned_.back();
      returned_.pop_back();
      return w;
    }
    return front_ < back_ ? &windows_[front_++] : nullptr;
  }
  const Window* TakeBack() {
    const std::lock_guard<std::mutex> lock(mu_);
    return !closed_ && front_ < back_ ? &windows_[--back_] : nullptr;
  }
  // The direct lanes take nothing more (the staging lane failed).
  void Close() {
    const std::lock_guard<std::mutex> lock(mu_);
    closed_ = true;
  }
  void GiveBack(const Window* w) {
    const std::lock_guard<std::mutex> lock(mu_);
    returned_.push_back(w);
  }

 private:
  std::vector<Window> windows_;
  std::mutex mu_;
  size_t front_ = 0;
  size_t back_;
  bool closed_ = false;
  std::vector<const Window*> returned_;
};

// What one direct lane did.
struct LaneStats {
  uint64_t bytes = 0;
  uint64_t locked = 0;  // the most locked at once
  int windows = 0;
  int refused = 0;
  std::exception_ptr error;
};

// One direct lane, on its own thread with its own engine: takes windows from
// the back, locks each, enqueues its runs' copies straight from it, and
// unlocks a window once its transfers are done, keeping at most `windows`
// locked. Stops at the first window the engine cannot lock (given back).
void RunDirectLane(WindowQueue& queue, CopyEngine& engine, const PipelineOptions& options,
                   LaneStats& stats) {
  std::vector<const Window*> locked(options.windows, nullptr);
  uint64_t locked_now = 0;
  const auto release = [&](int slot) {
    engine.WaitDone(slot);
    engine.Unregister(locked[slot]->lo);
    locked_now -= locked[slot]->n;
    locked[slot] = nullptr;
  };
  try {
    engine.EnterThread();
    for (int slot = 0;; slot = (slot + 1) % options.windows) {
      const Window* w = queue.TakeBack();
      if (w == nullptr) break;
      if (locked[slot] != nullptr) release(slot);
      if (!engine.Register(w->lo, w->n)) {
        queue.GiveBack(w);
        ++stats.refused;
        break;
      }
      locked[slot] = w;
      locked_now += w->n;
      stats.locked = std::max(stats.locked, locked_now);
      const int stream = slot % options.streams;
      for (const CopyRange& r : w->runs) {
        engine.CopyAsync(stream, r.src, r.target, r.offset, r.n);
        stats.bytes += r.n;
      }
      engine.RecordDone(stream, slot);
      ++stats.windows;
    }
    for (int slot = 0; slot < options.windows; ++slot) {
      if (locked[slot] != nullptr) release(slot);
    }
    engine.Finish();
  } catch (...) {
    stats.error = std::current_exception();
    // Transfers already enqueued still read the locked windows: let them end
    // before unlocking.
    try {
      engine.Finish();
    } catch (...) {
    }
    for (const Window* w : locked) {
      if (w == nullptr) continue;
      try {
        engine.Unregister(w->lo);
      } catch (...) {
      }
    }
  }
}

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

std::string StagingOptionsError(int buffers, int streams, int fill_threads) {
  if (buffers >= 1 && streams >= 0 && streams <= 64 && fill_threads >= 0 && fill_threads <= 256)
    return {};
  return "staging: expected at least 1 buffer, streams from 0 (by the staging rule) to 64 and "
         "fill_threads from 0 to 256, found " +
         std::to_string(buffers) + ", " + std::to_string(streams) + " and " +
         std::to_string(fill_threads);
}

PipelineOptions LoadPipeline(uint64_t pinned_bytes, int buffers, int streams, int fill_threads,
                             bool read_locked) {
  PipelineOptions p;
  p.pinned_bytes = pinned_bytes;
  p.buffers = buffers;
  p.streams = streams;
  p.fill_threads = fill_threads;
  p = StagingFor(p, std::thread::hardware_concurrency());
  if (read_locked) {
    p.direct_lanes = 1;
    p.staging = false;
    p.streams = 1;
    p.windows = 8;
  }
  return p;
}

PipelineStats RunPipeline(const std::vector<CopyRange>& ranges, CopyEngine& engine,
                          const PipelineOptions& asked,
                          const std::function<void(void*, const uint8_t*, uint64_t)>& fill,
                          const EngineFactory& direct) {
  const PipelineOptions options = StagingFor(asked, std::thread::hardware_concurrency());
  if (options.buffers < 1 || options.streams < 1) {
    throw std::invalid_argument("PipelineOptions: expected at least 1 buffer and 1 stream, found " +
                                std::to_string(options.buffers) + " and " +
                                std::to_string(options.streams));
  }
  const int lanes = direct ? std::max(0, options.direct_lanes) : 0;
  if (lanes > 0 && options.windows < 1) {
    throw std::invalid_argument("PipelineOptions: expected at least 1 window per direct lane, found " +
                                std::to_string(options.windows));
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

  // The work, as windows: without direct lanes one holding every range in
  // order (the staging lane alone, as it always ran).
  std::vector<Window> windows;
  if (lanes > 0) {
    const auto page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
    const uint64_t window = std::max<uint64_t>(1, (options.window_bytes + page - 1) / page) * page;
    windows = SplitIntoWindows(ranges, window, page);
  } else {
    windows.emplace_back();
    windows.back().runs = ranges;
  }
  WindowQueue queue(std::move(windows));

  // The direct lanes start first: they take windows from the back. Their
  // engines are made here, on the calling thread (a GPU engine orders its
  // streams after this thread's current one).
  std::vector<LaneStats> lane_stats(lanes);
  std::vector<std::unique_ptr<CopyEngine>> lane_engines;
  for (int l = 0; l < lanes; ++l) lane_engines.push_back(direct());
  std::vector<std::thread> lane_threads;
  const auto join_lanes = [&] {
    for (std::thread& t : lane_threads) t.join();
    lane_threads.clear();
  };
  try {
    for (int l = 0; l < lanes; ++l) {
      lane_threads.emplace_back(
          [&, l] { RunDirectLane(queue, *lane_engines[l], options, lane_stats[l]); });
    }
  } catch (...) {  // no thread to be had: the lanes made stop
    queue.Close();
    join_lanes();
    throw;
  }

  // The staging lane, on this thread. Its buffers are allocated at its first
  // window (none when the direct lanes take every window).
  const int threads = options.fill_threads;
  constexpr uint64_t kPiece = uint64_t{1} << 20;  // the unit of work of one fill thread
  std::vector<Piece> pieces;  // the fill of the buffer being filled (outlives the pool)
  std::unique_ptr<FillPool> pool;
  std::vector<uint8_t*> pinned;
  int buffers = 0;
  std::vector<bool> in_flight;
  int b = 0;                       // the buffer being filled
  uint64_t used = 0;               // bytes of it filled
  uint64_t fills = 0;              // buffers sent so far: picks the stream
  std::vector<CopyRange> pending;  // the transfers of the buffer being filled
  const auto start = [&] {
    // No more buffers than the bytes need.
    buffers = static_cast<int>(
        std::min<uint64_t>({uint64_t(options.buffers), granules / per, (total + each - 1) / each}));
    pinned.resize(buffers);
    in_flight.assign(buffers, false);
    for (int k = 0; k < buffers; ++k) {
      pinned[k] = static_cast<uint8_t*>(engine.AllocatePinned(k, each));
      stats.pinned_bytes += each;
    }
    pool = std::make_unique<FillPool>(threads);
    stats.fill_threads = threads;
  };
  const auto send = [&] {
    pool->Run(pieces, fill);
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
  const auto stage = [&](const CopyRange& r) {
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
  };
  const auto stage_from_front = [&] {
    for (const Window* w; (w = queue.TakeFront());) {
      if (!pool) start();
      for (const CopyRange& r : w->runs) stage(r);
    }
  };
  try {
    if (options.staging || lanes == 0) stage_from_front();
    join_lanes();
    // What the direct lanes gave back (or, with `staging` off, every window
    // they did not copy).
    stage_from_front();
    if (used > 0) send();
  } catch (...) {
    // Transfers already enqueued still write into the targets: let them end
    // before the caller frees anything.
    queue.Close();
    join_lanes();
    try {
      engine.Finish();
    } catch (...) {
    }
    throw;
  }
  engine.Finish();
  stats.direct_lanes = lanes;
  for (const LaneStats& l : lane_stats) {
    if (l.error) std::rethrow_exception(l.error);
    stats.bytes += l.bytes;
    stats.bytes_direct += l.bytes;
    stats.locked_bytes += l.locked;
    stats.windows_direct += l.windows;
    stats.windows_refused += l.refused;
  }
  return stats;
}

}  // namespace tsar
