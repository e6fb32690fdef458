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
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

namespace tsar {

struct PipelineOptions {
  // Pinned host memory in all (at least 64 KiB), split into `buffers` equal
  // buffers of whole 64 KiB granules; fewer buffers where it is too small.
  uint64_t pinned_bytes = uint64_t{64} << 20;
  int buffers = 4;
  int streams = 2;
  // Host threads copying from the mapping into a buffer (the calling thread
  // is one of them). One thread copies a fresh mapping of a cached file at
  // about 20 GiB/s on this project's machines, two at 33-37 GiB/s (measured
  // 2026-11-25, 64 MiB copies of a 2 GiB file): one is less than a PCIe 5
  // x16 link carries (about 50 GB/s). 0: min(4, the machine's cores).
  int fill_threads = 0;
};

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
};

// One run of bytes to copy: [src, src + n) to byte `offset` of `target`.
struct CopyRange {
  const uint8_t* src;
  uint64_t n;
  uint32_t target;
  uint64_t offset;
};

struct PipelineStats {
  uint64_t bytes = 0;          // copied to the device
  uint64_t pinned_bytes = 0;   // staging memory allocated
  uint64_t transfers = 0;      // CopyAsync calls
  uint64_t buffer_waits = 0;   // times the host waited for a buffer to come free
  int fill_threads = 0;        // host threads that filled the buffers
};

// Copies every range through the staging buffers; returns when every byte is
// on the device. `fill` copies n bytes from the mapping into a pinned buffer
// (memcpy by default; a test may slow it or count it); it is called from
// `fill_threads` threads at once, on disjoint pieces of at most 1 MiB, and
// each buffer is filled completely before its transfers are enqueued.
PipelineStats RunPipeline(const std::vector<CopyRange>& ranges, CopyEngine& engine,
                          const PipelineOptions& options,
                          const std::function<void(void*, const uint8_t*, uint64_t)>& fill = {});

}  // namespace tsar
