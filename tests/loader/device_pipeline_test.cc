// The host-to-device copy pipeline (loader/device_pipeline.h) against a mock
// copy engine that runs each stream's transfers only when the pipeline waits
// for them, reading the pinned buffer then: a buffer refilled too early
// would put wrong bytes on the "device".
#include "loader/device_pipeline.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <deque>
#include <map>
#include <random>
#include <set>
#include <stdexcept>
#include <thread>

namespace tsar {
namespace {

class MockEngine : public CopyEngine {
 public:
  explicit MockEngine(std::vector<std::vector<uint8_t>>* device) : device_(device) {}
  void* AllocatePinned(int buffer, uint64_t bytes) override {
    pinned_[buffer].assign(bytes, 0xAB);
    return pinned_[buffer].data();
  }
  void CopyAsync(int stream, const void* src, uint32_t target, uint64_t offset,
                 uint64_t n) override {
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
    auto& d = (*device_)[op.target];
    ASSERT_LE(op.offset + op.n, d.size());
    std::copy(op.src, op.src + op.n, d.begin() + static_cast<std::ptrdiff_t>(op.offset));
  }
  std::vector<std::vector<uint8_t>>* device_;
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
  EXPECT_EQ(device[0], host);
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

TEST(DevicePipeline, RefusesNoBufferOrNoStream) {
  std::vector<std::vector<uint8_t>> device;
  MockEngine engine(&device);
  PipelineOptions o;
  o.buffers = 0;
  EXPECT_THROW(RunPipeline({}, engine, o), std::invalid_argument);
}

}  // namespace
}  // namespace tsar
