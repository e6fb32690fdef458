// P16: the host half of a copy onto a GPU (tsar::to_device's staging lane),
// on any machine: the staging pipeline (loader/device_pipeline.h) run over
// the 512 MiB archive with an engine whose "device" takes each filled buffer
// at once, so only the fill is timed: the archive's bytes into 64 MiB of
// pre-faulted buffers by the staging rule's threads (and by one), either
// copied out of the archive's mapping (a fresh one per run, as a server's
// first load) or read from its file (pread, to_device's default). Warm and
// cold page cache; the peers are the same staging over a mapping already
// faulted in (warm: the mapping path's ceiling) and `cat` of the evicted file.
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "bench/benchmarks.h"
#include "loader/archive_impl.h"
#include "loader/device_pipeline.h"
#include "loader/file_regions.h"
#include "tsar/archive.h"

namespace tsar::bench {
namespace {

// Host memory for the buffers; transfers complete at once.
class HostEngine : public CopyEngine {
 public:
  ~HostEngine() override {
    for (void* p : buffers_) std::free(p);
  }
  void* AllocatePinned(int, uint64_t bytes) override {
    void* p = std::aligned_alloc(4096, (bytes + 4095) / 4096 * 4096);
    if (p == nullptr) Die("P16: cannot allocate a staging buffer");
    std::memset(p, 1, bytes);  // pre-faulted, as pinned memory is
    buffers_.push_back(p);
    return p;
  }
  void CopyAsync(int, const void*, uint32_t, uint64_t, uint64_t) override {}
  void RecordDone(int, int) override {}
  void WaitDone(int) override {}
  void Finish() override {}

 private:
  std::vector<void*> buffers_;
};

// One staging run over every storage of `a`: GB/s of the bytes staged.
double Stage(const Archive& a, int threads, bool from_file) {
  const ArchiveCore& core = *a.impl().core;
  std::vector<CopyRange> ranges;
  for (uint32_t i = 0; i < core.index.storages().size(); ++i) {
    ranges.push_back({core.StorageData(i), core.index.storages()[i].nbytes, i, 0});
  }
  PipelineOptions o;
  o.fill_threads = threads;
  o = StagingFor(o, std::thread::hardware_concurrency());
  HostEngine engine;
  Stopwatch sw;
  const FileRegions files(core);
  std::function<void(void*, const uint8_t*, uint64_t)> fill;
  if (from_file) {
    if (files.empty()) Die("P16: the archive's file cannot be read beside its mapping");
    fill = [&](void* dst, const uint8_t* src, uint64_t n) {
      if (!files.Read(dst, src, n)) Die("P16: a range outside the archive's file");
    };
  }
  const PipelineStats s = RunPipeline(ranges, engine, o, fill);
  return static_cast<double>(s.bytes) / sw.Seconds() / kGB;
}

}  // namespace

void RunP16Staging(const Context& ctx) {
  const std::string path = ctx.Path("stack.tsar");
  const int rule = StagingFor({}, std::thread::hardware_concurrency()).fill_threads;
  const std::string all = std::to_string(rule) + " fill thread" + (rule == 1 ? "" : "s");
  uint64_t not_evicted = 0;
  // Round -1 is a warm-up.
  for (int r = -1; r < ctx.Runs(5); ++r) {
    for (const bool cold : {false, true}) {
      const std::string kase = std::string("512 MiB, ") + (cold ? "cold" : "warm");
      if (cold) {
        not_evicted += EvictFile(path);
        Stopwatch sw;
        if (RunCommand({"cat", path}) != 0) Die("cat " + path + " failed");
        if (r >= 0)
          ctx.rec->Add("P16", kase, "cat FILE > /dev/null", "GB/s", r,
                       static_cast<double>(FileSize(path)) / sw.Seconds() / kGB);
      } else {  // the mapping path's ceiling: its pages already in the page tables
        OpenOptions faulted;
        faulted.prefetch = Prefetch::kPopulate;
        const Archive a = Archive::open(path, faulted);
        const double rate = Stage(a, rule, false);
        if (r >= 0)
          ctx.rec->Add("P16", kase, "staging copied from a mapping already faulted in, " + all,
                       "GB/s", r, rate);
      }
      for (const int threads : {rule, 1}) {
        for (const bool from_file : {true, false}) {
          if (cold) not_evicted += EvictFile(path);
          const Archive a = Archive::open(path);  // a fresh mapping
          const double rate = Stage(a, threads, from_file);
          const std::string who = threads == rule ? all : std::string("1 fill thread");
          if (r >= 0)
            ctx.rec->Add("P16", kase,
                         std::string(from_file ? "tsar staging, pread of the file (default), "
                                               : "tsar staging, copied from a fresh mapping, ") +
                             who,
                         "GB/s", r, rate);
        }
      }
    }
  }
  ctx.rec->Info("P16.pages_not_evicted", std::to_string(not_evicted));
}

}  // namespace tsar::bench
