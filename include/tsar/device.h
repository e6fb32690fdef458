// tsar::to_device: copies an archive's tensors to a GPU, one device storage
// per archive storage so aliasing is preserved.
#pragma once

#include <c10/core/Device.h>

#include <cstdint>

#include "tsar/archive.h"

namespace tsar {

// What one copy to a device did (DeviceOptions::stats).
struct DeviceStats {
  uint64_t bytes = 0;         // copied to the device
  uint64_t bytes_direct = 0;  // of them, read by the GPU from the locked range, no host copy
  uint64_t pinned_bytes = 0;  // staging buffers allocated
  uint64_t bytes_from_file = 0;  // of the staged bytes, read from the archive's file (pread)
  int fill_threads = 0;
  int streams = 0;
};

// How to_device stages bytes: the archive's storages are copied from the
// archive (its file, or its mapping: `stage_from_file`) into `buffers`
// page-locked (pinned) host buffers of `pinned_bytes`
// in all, and from each buffer to the GPU asynchronously on one of `streams`
// streams, so the host copy of the next buffer overlaps the transfer of the
// previous ones. Pinned memory stays at `pinned_bytes` whatever the archive's
// size (64 MiB by default: what a small host can give up). `fill_threads`
// host threads copy into each buffer. 0 for fill_threads or streams: by the
// staging rule (loader/device_pipeline.h, StagingFor): every core fills, up
// to 16 (one thread moves about 6 GB/s out of a mapping, a PCIe 5 link takes
// 55), on 4 streams.
struct DeviceOptions {
  uint64_t pinned_bytes = uint64_t{64} << 20;
  int buffers = 4;
  int streams = 0;       // 0: 4 (the staging rule)
  int fill_threads = 0;  // 0: min(cores, 16) (the staging rule)
  // Staging reads the archive's file (pread of the page cache) rather than
  // copying out of its mapping, where the mapping is shared read-only (it
  // then shows the file's bytes): no page faults on a fresh mapping, and on
  // a cold cache one read request per piece (loader/file_regions.h). Bytes
  // of a copy-on-write or kRead archive, and host copies (a rank's slices),
  // come from memory either way. false: always from memory.
  bool stage_from_file = true;
  // Host memory the caller has page-locked, read-only, and keeps locked
  // across loads (cudaHostRegister of the archive's mapping, whole pages:
  // Python's pin="register"): bytes inside it are read by the GPU directly,
  // with no host copy, in windows of 64 MiB on one stream; bytes outside it
  // are staged. On an H100, locking took 0.02-0.05 s per GiB once; loads
  // after it ran at 0.97x of the link as per-storage copies on one stream,
  // 0.91-0.92x as this path on 4 streams (docs/gpu.md).
  const void* locked_base = nullptr;
  uint64_t locked_size = 0;
  // Filled in when given: what the copy did.
  DeviceStats* stats = nullptr;
};

// Copies every storage of `entry` to `device` (the bytes its tensors view,
// each storage once: views and tied weights come back as views of one device
// storage) and rebuilds the
// tensors there, bytes exact for every dtype. The file is read once. A
// tensor-parallel archive's sharded tensors (spec §4.12) are rebuilt whole on
// the host, then copied. `device` cpu gives state_dict(entry). Throws
// kUnsupported when this LibTorch has no CUDA or no device is present.
torch::OrderedDict<std::string, at::Tensor> to_device(const Archive& archive, c10::Device device,
                                                      const std::string& entry = "",
                                                      const DeviceOptions& options = {});

}  // namespace tsar
