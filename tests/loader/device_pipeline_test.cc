// The host-to-device copy pipeline (loader/device_pipeline.h) against a mock
// copy engine that runs each stream's transfers only when the pipeline waits
// for them, reading the pinned buffer then: a buffer refilled too early
// would put wrong bytes on the "device".
#include "loader/device_pipeline.h"

#include <fcntl.h>
#include <sys/mman.h>

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <set>
#include <stdexcept>
#include <thread>
#include <tuple>

#include <unistd.h>

#include "loader/file_regions.h"

namespace tsar {
namespace {

// What the direct lanes' engines have locked, shared by them (each lane has
// its own engine, on its own thread).
class Registry {
 public:
  explicit Registry(uint64_t page, int refuse_after = -1) : page_(page), refuse_after_(refuse_after) {}
  bool Register(const void* p, uint64_t n) {
    const std::lock_guard<std::mutex> lock(mu_);
    const auto at = reinterpret_cast<uintptr_t>(p);
    EXPECT_EQ(at % page_, 0u) << "a window starts on a page";
    EXPECT_EQ(n % page_, 0u) << "a window is whole pages";
    EXPECT_GT(n, 0u);
    ++attempts_;
    attempted_.notify_all();
    if (refuse_after_ >= 0 && registrations_ >= refuse_after_) return false;
    for (const auto& [lo, len] : locked_) {
      EXPECT_TRUE(at + n <= lo || lo + len <= at) << "two locked windows share a page";
    }
    locked_[at] = n;
    ++registrations_;
    now_ += n;
    peak_ = std::max(peak_, now_);
    return true;
  }
  void Unregister(const void* p) {
    const std::lock_guard<std::mutex> lock(mu_);
    const auto it = locked_.find(reinterpret_cast<uintptr_t>(p));
    ASSERT_NE(it, locked_.end()) << "unlocking what was not locked";
    now_ -= it->second;
    locked_.erase(it);
  }
  bool Covers(const uint8_t* src, uint64_t n) {
    const std::lock_guard<std::mutex> lock(mu_);
    const auto at = reinterpret_cast<uintptr_t>(src);
    for (const auto& [lo, len] : locked_) {
      if (lo <= at && at + n <= lo + len) return true;
    }
    return false;
  }
  size_t still_locked() {
    const std::lock_guard<std::mutex> lock(mu_);
    return locked_.size();
  }
  uint64_t peak() {
    const std::lock_guard<std::mutex> lock(mu_);
    return peak_;
  }
  int registrations() {
    const std::lock_guard<std::mutex> lock(mu_);
    return registrations_;
  }
  // Returns once `k` windows were offered to lock, locked or refused (at
  // most 10 s): a staging lane that waits so leaves the direct lane windows
  // to take, however the threads are scheduled.
  void WaitForAttempts(int k) {
    std::unique_lock<std::mutex> lock(mu_);
    attempted_.wait_for(lock, std::chrono::seconds(10), [&] { return attempts_ >= k; });
  }

 private:
  std::mutex mu_;
  std::condition_variable attempted_;
  uint64_t page_;
  int refuse_after_;
  int registrations_ = 0;
  int attempts_ = 0;
  std::map<uintptr_t, uint64_t> locked_;
  uint64_t now_ = 0, peak_ = 0;
};

class MockEngine : public CopyEngine {
 public:
  explicit MockEngine(std::vector<std::vector<uint8_t>>* device, Registry* registry = nullptr)
      : device_(device), registry_(registry) {}
  // A direct lane's engine: copies read locked windows only.
  bool Register(const void* p, uint64_t n) override {
    return registry_ != nullptr && registry_->Register(p, n);
  }
  void Unregister(const void* p) override {
    ASSERT_NE(registry_, nullptr);
    registry_->Unregister(p);
  }
  void EnterThread() override {
    EXPECT_NE(std::this_thread::get_id(), made_on_) << "a lane runs on a thread of its own";
    entered_ = true;
  }
  std::atomic<uint64_t>* copied_directly = nullptr;
  int throw_at_copy = -1;
  void* AllocatePinned(int buffer, uint64_t bytes) override {
    pinned_[buffer].assign(bytes, 0xAB);
    return pinned_[buffer].data();
  }
  void CopyAsync(int stream, const void* src, uint32_t target, uint64_t offset,
                 uint64_t n) override {
    if (registry_ != nullptr) {
      EXPECT_TRUE(entered_) << "EnterThread comes first on a lane's thread";
      EXPECT_TRUE(registry_->Covers(static_cast<const uint8_t*>(src), n))
          << "a direct copy reads a locked window";
      if (throw_at_copy >= 0 && copies_++ == throw_at_copy) throw std::runtime_error("copy failed");
    }
    queues_[stream].push_back({static_cast<const uint8_t*>(src), target, offset, n, -1});
    streams_used_.insert(stream);
  }
  void RecordDone(int stream, int buffer) override {
    queues_[stream].push_back({nullptr, 0, 0, 0, buffer});
    stream_of_[buffer] = stream;
  }
  void WaitDone(int buffer) override {  // runs that stream up to the buffer's marker
    auto& q = queues_[stream_of_.at(buffer)];
    while (!q.empty()) {
      const Op op = q.front();
      q.pop_front();
      if (op.marker == buffer) return;
      Run(op);
    }
    ADD_FAILURE() << "WaitDone(" << buffer << ") without a recorded transfer";
  }
  void Finish() override {
    for (auto& [stream, q] : queues_) {
      for (const Op& op : q) Run(op);
      q.clear();
    }
  }
  size_t streams_used() const { return streams_used_.size(); }

 private:
  struct Op {
    const uint8_t* src;
    uint32_t target;
    uint64_t offset, n;
    int marker;
  };
  void Run(const Op& op) {
    if (op.marker >= 0) return;
    if (registry_ != nullptr) {
      EXPECT_TRUE(registry_->Covers(op.src, op.n)) << "a window unlocked before its transfer ran";
      if (copied_directly != nullptr) *copied_directly += op.n;
    }
    auto& d = (*device_)[op.target];
    ASSERT_LE(op.offset + op.n, d.size());
    std::copy(op.src, op.src + op.n, d.begin() + static_cast<std::ptrdiff_t>(op.offset));
  }
  std::vector<std::vector<uint8_t>>* device_;
  Registry* registry_;
  bool entered_ = false;
  std::thread::id made_on_ = std::this_thread::get_id();
  int copies_ = 0;
  std::map<int, std::vector<uint8_t>> pinned_;
  std::map<int, std::deque<Op>> queues_;
  std::map<int, int> stream_of_;
  std::set<int> streams_used_;
};

TEST(DevicePipeline, EveryByteArrivesOnceThroughBoundedBuffersOnEveryStream) {
  std::mt19937_64 rng(7);
  // Storages of every size class: empty, a few bytes, around a buffer, many buffers.
  const std::vector<uint64_t> sizes = {0, 3, 65535, 65536, 65537, 1 << 20, 200000, 17, 300000};
  std::vector<std::vector<uint8_t>> host(sizes.size());
  std::vector<CopyRange> ranges;
  uint64_t total = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    host[i].resize(sizes[i]);
    for (auto& x : host[i]) x = static_cast<uint8_t>(rng());
    ranges.push_back({host[i].data(), sizes[i], static_cast<uint32_t>(i), 0});
    total += sizes[i];
  }
  for (int buffers : {1, 2, 4}) {
    for (int streams : {1, 2, 3}) {
      for (uint64_t pinned : {uint64_t{64} << 10, uint64_t{256} << 10, uint64_t{8} << 20}) {
        for (int threads : {1, 3}) {
          std::vector<std::vector<uint8_t>> device(sizes.size());
          for (size_t i = 0; i < sizes.size(); ++i) device[i].assign(sizes[i], 0);
          MockEngine engine(&device);
          std::atomic<uint64_t> read{0};
          PipelineOptions o;
          o.buffers = buffers;
          o.streams = streams;
          o.pinned_bytes = pinned;
          o.fill_threads = threads;
          const PipelineStats s =
              RunPipeline(ranges, engine, o, [&](void* dst, const uint8_t* src, uint64_t n) {
                std::copy(src, src + n, static_cast<uint8_t*>(dst));
                read += n;
              });
          const std::string where =
              std::to_string(buffers) + " buffers, " + std::to_string(streams) + " streams, " +
              std::to_string(pinned) + " pinned, " + std::to_string(threads) + " fill threads";
          EXPECT_EQ(device, host) << where;
          EXPECT_EQ(read.load(), total) << where << ": each byte is read from the mapping once";
          EXPECT_EQ(s.fill_threads, threads);
          EXPECT_EQ(s.bytes, total);
          EXPECT_LE(s.pinned_bytes, pinned) << where << ": the staging memory is bounded";
          if (pinned < total / 4) {
            EXPECT_EQ(engine.streams_used(), static_cast<size_t>(streams)) << where;
            EXPECT_GT(s.buffer_waits, 0u) << where;
          }
        }
      }
    }
  }
}

// The staging rule: fill threads follow the cores (every core up to 16: one
// thread moves about 6 GB/s out of a mapping, a PCIe 5 link 55), 4 streams;
// what is asked is kept; pinned memory stays bounded.
TEST(DevicePipeline, TheStagingRuleFollowsTheMachine) {
  const PipelineOptions defaults;
  EXPECT_EQ(defaults.fill_threads, 0);
  EXPECT_EQ(defaults.streams, 0);
  const std::vector<std::pair<unsigned, int>> cores_threads = {
      {0, 1}, {1, 1}, {2, 2}, {4, 4}, {9, 9}, {16, 16}, {17, 16}, {192, 16}};
  for (const auto& [cores, threads] : cores_threads) {
    const PipelineOptions o = StagingFor(defaults, cores);
    EXPECT_EQ(o.fill_threads, threads) << cores << " cores";
    EXPECT_EQ(o.streams, 4) << cores << " cores";
    EXPECT_EQ(o.direct_lanes, 0) << cores << " cores: no direct lane by default";
    EXPECT_EQ(o.buffers, 4);
    EXPECT_EQ(o.pinned_bytes, uint64_t{64} << 20);
  }
  PipelineOptions asked;
  asked.fill_threads = 3;
  asked.streams = 1;
  asked.buffers = 2;
  const PipelineOptions kept = StagingFor(asked, 64);
  EXPECT_EQ(kept.fill_threads, 3);
  EXPECT_EQ(kept.streams, 1);
  EXPECT_EQ(kept.buffers, 2);

  // Through the pipeline with the mock engine: the defaults run on this
  // machine's cores and 4 streams, within 64 MiB of pinned memory.
  std::vector<uint8_t> host(200 << 20);
  for (size_t i = 0; i < host.size(); i += 4096) host[i] = static_cast<uint8_t>(i >> 12);
  std::vector<std::vector<uint8_t>> device(1, std::vector<uint8_t>(host.size()));
  MockEngine engine(&device);
  const PipelineStats s = RunPipeline({{host.data(), host.size(), 0, 0}}, engine, defaults);
  const unsigned cores = std::thread::hardware_concurrency();
  EXPECT_EQ(s.fill_threads, static_cast<int>(std::clamp(cores, 1u, 16u)));
  EXPECT_EQ(engine.streams_used(), 4u);
  EXPECT_LE(s.pinned_bytes, uint64_t{64} << 20);
  EXPECT_EQ(s.direct_lanes, 0) << "no direct lane without an engine for it";
  EXPECT_EQ(device[0], host);
}

// Storages of random sizes in one "mapping", page-aligned or not.
struct Mapping {
  explicit Mapping(uint64_t bytes, uint64_t seed) : bytes_(bytes + 8192) {
    std::mt19937_64 rng(seed);
    for (auto& x : bytes_) x = static_cast<uint8_t>(rng());
    uint64_t at = 4096 - reinterpret_cast<uintptr_t>(bytes_.data()) % 4096;  // page 1
    for (uint32_t i = 0; at < bytes; ++i) {
      const uint64_t n = std::min<uint64_t>(bytes - at, 1 + rng() % (300 << 10));
      ranges.push_back({bytes_.data() + at, n, i, 0});
      device_size.push_back(n);
      total += n;
      at += n + (rng() % 2 ? 0 : rng() % 5000);  // some share a page with the next, some not
    }
  }
  std::vector<std::vector<uint8_t>> Host() const {
    std::vector<std::vector<uint8_t>> h;
    for (const CopyRange& r : ranges) h.emplace_back(r.src, r.src + r.n);
    return h;
  }
  std::vector<std::vector<uint8_t>> Empty() const {
    std::vector<std::vector<uint8_t>> d;
    for (uint64_t n : device_size) d.emplace_back(n, 0);
    return d;
  }
  std::vector<uint8_t> bytes_;
  std::vector<CopyRange> ranges;
  std::vector<uint64_t> device_size;
  uint64_t total = 0;
};

// The direct lanes beside the staging lane (issue 44): every byte arrives
// once, from a locked window or a staging buffer; windows are whole pages,
// never share one, are unlocked only after their transfers ran, and the
// memory locked at once stays within lanes x windows x window_bytes.
TEST(DevicePipeline, DirectLanesAndTheStagingLaneShareTheWindowsAndEveryByteArrivesOnce) {
  const Mapping m(6 << 20, 11);
  const auto page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  for (int lanes : {1, 2}) {
    for (bool staging : {true, false}) {
      for (int windows : {1, 3}) {
        const std::string where = std::to_string(lanes) + " lanes, staging " +
                                  (staging ? "on" : "off") + ", " + std::to_string(windows) +
                                  " windows";
        std::vector<std::vector<uint8_t>> device = m.Empty();
        Registry registry(page);
        std::atomic<uint64_t> staged{0}, direct{0};
        MockEngine engine(&device);
        PipelineOptions o;
        o.pinned_bytes = 256 << 10;
        o.fill_threads = 2;
        o.direct_lanes = lanes;
        o.staging = staging;
        o.windows = windows;
        o.window_bytes = 100 << 10;  // rounded up to whole pages
        const PipelineStats s = RunPipeline(
            m.ranges, engine, o,
            [&](void* dst, const uint8_t* src, uint64_t n) {
              // The staging lane waits for the direct lane's first window
              // (both lanes then surely take some, however the threads run).
              registry.WaitForAttempts(1);
              std::copy(src, src + n, static_cast<uint8_t*>(dst));
              staged += n;
            },
            [&]() -> std::unique_ptr<CopyEngine> {
              auto e = std::make_unique<MockEngine>(&device, &registry);
              e->copied_directly = &direct;
              return e;
            });
        EXPECT_EQ(device, m.Host()) << where;
        EXPECT_EQ(staged.load() + direct.load(), m.total) << where << ": each byte read once";
        EXPECT_EQ(s.bytes, m.total) << where;
        EXPECT_EQ(s.bytes_direct, direct.load()) << where;
        EXPECT_GT(s.bytes_direct, 0u) << where;
        if (!staging) EXPECT_EQ(s.bytes_direct, m.total) << where;
        EXPECT_EQ(s.direct_lanes, lanes);
        EXPECT_EQ(s.windows_direct, registry.registrations()) << where;
        EXPECT_EQ(registry.still_locked(), 0u) << where << ": every window unlocked";
        const uint64_t window = (uint64_t{100 << 10} + page - 1) / page * page;
        EXPECT_LE(registry.peak(), uint64_t(lanes) * windows * window) << where;
        EXPECT_LE(s.locked_bytes, uint64_t(lanes) * windows * window) << where;
        EXPECT_GT(s.locked_bytes, 0u) << where;
      }
    }
  }
}

// A window the engine cannot lock goes to the staging lane, and that lane
// stops; an engine that locks nothing leaves it all to staging.
TEST(DevicePipeline, AWindowTheEngineCannotLockIsStaged) {
  const Mapping m(3 << 20, 12);
  const auto page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  for (int refuse_after : {0, 2}) {
    for (bool staging : {true, false}) {
      std::vector<std::vector<uint8_t>> device = m.Empty();
      Registry registry(page, refuse_after);
      MockEngine engine(&device);
      PipelineOptions o;
      o.pinned_bytes = 128 << 10;
      o.window_bytes = 64 << 10;
      o.direct_lanes = 1;
      o.staging = staging;
      const PipelineStats s = RunPipeline(
          m.ranges, engine, o,
          [&](void* dst, const uint8_t* src, uint64_t n) {
            registry.WaitForAttempts(refuse_after + 1);  // until the lane was refused
            std::memcpy(dst, src, n);
          },
          [&] {
            return std::unique_ptr<CopyEngine>(std::make_unique<MockEngine>(&device, &registry));
          });
      const std::string where = "refusing after " + std::to_string(refuse_after) +
                                ", staging " + (staging ? "on" : "off");
      EXPECT_EQ(device, m.Host()) << where;
      EXPECT_EQ(s.bytes, m.total) << where;
      EXPECT_EQ(s.windows_refused, 1) << where;
      EXPECT_LE(s.windows_direct, refuse_after) << where;
      if (!staging) EXPECT_EQ(s.windows_direct, refuse_after) << where;
      EXPECT_EQ(registry.still_locked(), 0u) << where;
    }
  }
}

// A direct lane whose copy fails: the error reaches the caller after every
// lane stopped and every window it locked is unlocked.
TEST(DevicePipeline, ADirectLaneThatFailsReachesTheCallerWithEveryWindowUnlocked) {
  const Mapping m(4 << 20, 13);
  const auto page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  std::vector<std::vector<uint8_t>> device = m.Empty();
  Registry registry(page);
  MockEngine engine(&device);
  PipelineOptions o;
  o.window_bytes = 64 << 10;
  o.direct_lanes = 1;
  o.staging = false;
  EXPECT_THROW(RunPipeline(m.ranges, engine, o, {},
                           [&] {
                             auto e = std::make_unique<MockEngine>(&device, &registry);
                             e->throw_at_copy = 5;
                             return std::unique_ptr<CopyEngine>(std::move(e));
                           }),
               std::runtime_error);
  EXPECT_EQ(registry.still_locked(), 0u);
  EXPECT_GT(registry.registrations(), 0);
}

// A fill that throws on one of the threads: the exception reaches the
// caller once every thread has let go of the buffer, and nothing hangs.
TEST(DevicePipeline, AFillThatThrowsOnAnyThreadReachesTheCaller) {
  std::vector<uint8_t> host(8 << 20, 7);
  std::vector<std::vector<uint8_t>> device(1, std::vector<uint8_t>(host.size()));
  for (int threads : {1, 4}) {
    MockEngine engine(&device);
    PipelineOptions o;
    o.fill_threads = threads;
    std::atomic<int> calls{0};
    EXPECT_THROW(RunPipeline({{host.data(), host.size(), 0, 0}}, engine, o,
                             [&](void* dst, const uint8_t* src, uint64_t n) {
                               if (calls.fetch_add(1) == 3) throw std::runtime_error("read failed");
                               std::memcpy(dst, src, n);
                             }),
                 std::runtime_error)
        << threads << " threads";
  }
}

// The staging lane filled from the archive's file (to_device's default,
// loader/file_regions.h): every byte inside the file's region comes from the
// file by pread, the rest (a host copy beside it) from memory, on 1 and 3
// fill threads and pieces that cross buffers. The region here is a private
// mapping written after it was made, so bytes from the mapping instead of
// the file would show.
TEST(DevicePipeline, AStagingLaneFilledFromTheFileMovesEveryByteOnce) {
  char tmpl[] = "/tmp/tsar-pipeline-file-XXXXXX";
  const int fd = mkstemp(tmpl);
  ASSERT_GE(fd, 0);
  const uint64_t size = (5 << 20) + 4321;
  std::mt19937_64 rng(11);
  std::vector<uint8_t> file(size);
  for (auto& x : file) x = static_cast<uint8_t>(rng());
  ASSERT_EQ(write(fd, file.data(), size), static_cast<ssize_t>(size));
  auto* shown = static_cast<uint8_t*>(
      mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0));
  ASSERT_NE(shown, MAP_FAILED);
  std::memset(shown, 0x5A, size);  // the process's own pages now: not the file's bytes
  FileRegions files;
  files.Add(shown, size, fd, tmpl);
  std::vector<uint8_t> beside(300000);
  for (auto& x : beside) x = static_cast<uint8_t>(rng());
  // Two runs of the file (the second starting mid-file) and the host copy.
  const uint64_t second = 3 << 20;
  const std::vector<CopyRange> ranges = {{shown, second, 0, 0},
                                         {beside.data(), beside.size(), 1, 0},
                                         {shown + second, size - second, 2, 0}};
  const std::vector<std::vector<uint8_t>> want = {
      std::vector<uint8_t>(file.begin(), file.begin() + second), beside,
      std::vector<uint8_t>(file.begin() + second, file.end())};
  for (int threads : {1, 3}) {
    std::vector<std::vector<uint8_t>> device(3);
    for (int i = 0; i < 3; ++i) device[i].assign(want[i].size(), 0);
    MockEngine engine(&device);
    PipelineOptions o;
    o.fill_threads = threads;
    o.streams = 2;
    o.pinned_bytes = 1 << 20;
    std::atomic<uint64_t> from_file{0}, from_memory{0};
    RunPipeline(ranges, engine, o, [&](void* dst, const uint8_t* src, uint64_t n) {
      if (files.Read(dst, src, n)) {
        from_file += n;
      } else {
        std::memcpy(dst, src, n);
        from_memory += n;
      }
    });
    EXPECT_EQ(device, want) << threads << " fill threads";
    EXPECT_EQ(from_file.load(), size);
    EXPECT_EQ(from_memory.load(), beside.size());
  }
  munmap(shown, size);
  close(fd);
  unlink(tmpl);
}

TEST(DevicePipeline, ALoadAsksTheRuleAndReadsLockedMemoryOnOneDirectLane) {
  const unsigned cores = std::thread::hardware_concurrency();
  const PipelineOptions staged = LoadPipeline(uint64_t{32} << 20, 3, 0, 0, false);
  EXPECT_EQ(staged.pinned_bytes, uint64_t{32} << 20);
  EXPECT_EQ(staged.buffers, 3);
  EXPECT_EQ(staged.streams, StagingFor({}, cores).streams);
  EXPECT_EQ(staged.fill_threads, StagingFor({}, cores).fill_threads);
  EXPECT_EQ(staged.direct_lanes, 0);
  EXPECT_TRUE(staged.staging);

  const PipelineOptions locked = LoadPipeline(uint64_t{64} << 20, 4, 4, 2, true);
  EXPECT_EQ(locked.direct_lanes, 1);
  EXPECT_FALSE(locked.staging);
  EXPECT_EQ(locked.streams, 1) << "the locked lane's copies run back to back on one stream";
  EXPECT_EQ(locked.windows, 8);
  EXPECT_EQ(locked.fill_threads, 2) << "asked for, kept";
}

TEST(DevicePipeline, StagingOptionsOutOfRangeAreNamed) {
  EXPECT_EQ(StagingOptionsError(1, 0, 0), "");
  EXPECT_EQ(StagingOptionsError(4, 64, 256), "");
  for (const auto& [buffers, streams, threads] :
       std::vector<std::tuple<int, int, int>>{{0, 0, 0}, {1, -1, 0}, {1, 65, 0}, {1, 0, -1}, {1, 0, 257}}) {
    const std::string bad = StagingOptionsError(buffers, streams, threads);
    EXPECT_EQ(bad, "staging: expected at least 1 buffer, streams from 0 (by the staging rule) to 64 "
                   "and fill_threads from 0 to 256, found " +
                       std::to_string(buffers) + ", " + std::to_string(streams) + " and " +
                       std::to_string(threads));
  }
}

TEST(DevicePipeline, RefusesNoBufferOrNoStream) {
  std::vector<std::vector<uint8_t>> device;
  MockEngine engine(&device);
  PipelineOptions o;
  o.buffers = 0;
  EXPECT_THROW(RunPipeline({}, engine, o), std::invalid_argument);
}

}  // namespace
}  // namespace tsar
