// The host-to-device copy pipeline of tsar::to_device (issue 29), without
// LibTorch or CUDA: a GPU runtime is behind CopyEngine (loader/device.cc
// drives LibTorch's device-generic streams and events; tests drive a mock).
//
// Bytes go from the archive's mapping (the page cache) into one of `buffers`
// pinned staging buffers on host threads, then to the device on one of
// `streams` streams, asynchronously. A buffer is refilled only after the
// engine says its last transfer finished, so the host copies of the next
// buffers overlap the transfers of the previous ones, and pinned memory stays
// `pinned_bytes` however large the archive. Every byte of the archive is read
// once.
//
// Beside that staging lane may run `direct_lanes` direct lanes (issue 44):
// each takes a window of the ranges (`window_bytes` of address space, whole
// pages), has its engine lock it (CopyEngine::Register: the archive's mapping
// page-locked already, under pin="register"), has the GPU's copy engine read
// it with no host copy, and releases it once its transfers are done. The
// staging lane takes windows from the front, the direct lanes from the back,
// until they meet; a window a direct lane cannot lock goes back to the
// staging lane, and that lane stops. At most `windows` x `window_bytes` per
// direct lane is held at once.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace tsar {

struct PipelineOptions {
  // Pinned host memory in all (at least 64 KiB), split into `buffers` equal
  // buffers of whole 64 KiB granules; fewer buffers where it is too small.
  uint64_t pinned_bytes = uint64_t{64} << 20;
  int buffers = 4;
  int streams = 0;  // 0: by the staging rule (StagingFor)
  // Host threads copying from the mapping into a buffer (the calling thread
  // is one of them). 0: by the staging rule (StagingFor).
  int fill_threads = 0;
  // Direct lanes beside the staging lane (none by default: see StagingFor).
  // `staging` false: the staging lane copies only the windows the direct
  // lanes give back.
  int direct_lanes = 0;
  bool staging = true;
  // The address space of one window (a multiple of the page size, rounded up
  // to one) and the windows a direct lane keeps locked at once.
  uint64_t window_bytes = uint64_t{64} << 20;
  int windows = 4;
};

// The staging rule: what fill_threads 0 and streams 0 mean on a machine of
// `cores` cores. Measured on a 16-core H100 host (PCIe 5 x16, one pinned
// copy_ 55 GB/s; TOOLCHAIN.md, 2026-11-26):
// - one fill thread copies about 6 GB/s out of the archive's mapping (the
//   first touch of each page is a fault), 8 threads 34 GB/s, 16 threads 47:
//   the link needs 9 or more, so every core fills, up to 16 (past that the
//   memory bus, not the threads, is the limit);
// - 2 streams left the link idle between transfers (8 threads: 31 GB/s),
//   4 streams did not (41 GB/s); so 4;
// - buffers and pinned memory stay as asked (4 of 16 MiB by default: 8
//   smaller buffers measured 23 GB/s against 49): pinned memory is bounded
//   by pinned_bytes whatever the archive's size or the machine;
// - staging reached 30-35 GB/s (0.57-0.64x) from a fresh mapping and 46.5
//   (0.85x) from one already faulted in: the host copy is the limit; so
//   to_device's fill reads the file (pread, 46.3 GB/s on 16 threads there)
//   where the mapping is shared (loader/file_regions.h);
// - no direct lane: locking windows of a fresh mapping per load and
//   unlocking them (cudaHostRegister/Unregister, 16-256 MiB, 2-8 in flight,
//   1 or 2 lanes) moved 8-19 GB/s alone and, beside the staging lane, made
//   the whole 11-22 GB/s against 31-32 for staging alone (2026-11-27,
//   bench/results/gpu/): locking and unlocking contend with the fill
//   threads' faults for the same process's page tables. Direct lanes pay
//   only over memory locked once and kept (pin="register").
// Values asked for (non-zero) are kept.
PipelineOptions StagingFor(const PipelineOptions& asked, unsigned cores);

// What is wrong with the staging options a caller asked for (DeviceOptions,
// Python's staging=), or "" where nothing is: at least 1 buffer, streams
// from 0 to 64 and fill_threads from 0 to 256 (0: by the staging rule).
std::string StagingOptionsError(int buffers, int streams, int fill_threads);

// The pipeline of one load onto a device (both to_devices: loader/device.cc
// and the portable path's python/src/portable_device.cc): the staging
// options as asked, StagingFor on this machine's cores and, where the bytes
// lie in memory locked already (`read_locked`: the mapping under
// pin="register"), one direct lane that reads them on one stream, every
// window's copies back to back (the form of the per-storage copies that
// measured 0.97x of the link on an H100, 2026-11-26; 4 streams measured
// 0.91-0.92x, 2026-11-27), the staging lane copying only what lies outside.
PipelineOptions LoadPipeline(uint64_t pinned_bytes, int buffers, int streams, int fill_threads,
                             bool read_locked);

// What a GPU runtime gives the pipeline. Calls come from one thread.
class CopyEngine {
 public:
  virtual ~CopyEngine() = default;
  // `bytes` of page-locked host memory for staging buffer `buffer`.
  virtual void* AllocatePinned(int buffer, uint64_t bytes) = 0;
  // Enqueues the copy of `n` bytes at `src` (inside a pinned buffer) to byte
  // `offset` of device allocation `target`, on `stream`; returns at once.
  virtual void CopyAsync(int stream, const void* src, uint32_t target, uint64_t offset,
                         uint64_t n) = 0;
  // Marks the end of what was enqueued on `stream` so far as buffer
  // `buffer`'s transfer (an event recorded on the stream).
  virtual void RecordDone(int stream, int buffer) = 0;
  // Blocks until buffer `buffer`'s recorded transfer has finished.
  virtual void WaitDone(int buffer) = 0;
  // Blocks until every stream is idle.
  virtual void Finish() = 0;

  // The direct lanes' calls (each lane has an engine of its own, made on
  // the calling thread and called on the lane's thread, EnterThread first).
  // Register makes [p, p + n) (both page-aligned) readable by the device as
  // it is, so CopyAsync may read it directly: page-locked already (tsar's
  // engine: the archive's mapping under pin="register") or locked here;
  // false where it cannot (the window is staged). Unregister releases what
  // Register locked at p.
  virtual void EnterThread() {}
  virtual bool Register(const void* /*p*/, uint64_t /*n*/) { return false; }
  virtual void Unregister(const void* /*p*/) {}
};

// Makes the engine of one direct lane.
using EngineFactory = std::function<std::unique_ptr<CopyEngine>()>;

// One run of bytes to copy: [src, src + n) to byte `offset` of `target`.
struct CopyRange {
  const uint8_t* src;
  uint64_t n;
  uint32_t target;
  uint64_t offset;
};

struct PipelineStats {
  uint64_t bytes = 0;         // copied to the device
  uint64_t pinned_bytes = 0;  // staging memory allocated
  uint64_t transfers = 0;     // CopyAsync calls
  uint64_t buffer_waits = 0;  // times the host waited for a buffer to come free
  int fill_threads = 0;       // host threads that filled the buffers
  uint64_t bytes_direct = 0;  // of `bytes`, read by the GPU from locked windows
  uint64_t locked_bytes = 0;  // the most host memory locked at once by the direct lanes
  int direct_lanes = 0;       // direct lanes run
  int windows_direct = 0;     // windows they copied
  int windows_refused = 0;    // windows the engine could not lock (staged instead)
};

// Copies every range through the staging buffers; returns when every byte is
// on the device. `fill` copies n bytes from the mapping into a pinned buffer
// (memcpy by default; a test may slow it or count it); it is called from
// `fill_threads` threads at once, on disjoint pieces of at most 1 MiB, and
// each buffer is filled completely before its transfers are enqueued.
// `direct` makes the engines of the direct lanes (none without it). An
// exception from any lane reaches the caller once every lane has stopped and
// every window is unlocked.
PipelineStats RunPipeline(const std::vector<CopyRange>& ranges, CopyEngine& engine,
                          const PipelineOptions& options,
                          const std::function<void(void*, const uint8_t*, uint64_t)>& fill = {},
                          const EngineFactory& direct = {});

}  // namespace tsar
