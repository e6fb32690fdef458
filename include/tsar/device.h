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
  uint64_t bytes_direct = 0;  // of them, read by the GPU from locked windows of the mapping
  uint64_t pinned_bytes = 0;  // staging buffers allocated
  uint64_t locked_bytes = 0;  // the most of the mapping locked at once
  int fill_threads = 0;
  int streams = 0;
  int direct_lanes = 0;       // run (0 where the CUDA runtime cannot lock host memory)
  int windows_direct = 0;     // windows the direct lanes copied
  int windows_refused = 0;    // windows they could not lock (staged instead)
};

// How to_device stages bytes: the archive's storages are copied from the
// mapping into `buffers` page-locked (pinned) host buffers of `pinned_bytes`
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
  // Beside the staging lane, `direct_lanes` direct lanes (issue 44): each
  // page-locks a window of `window_bytes` of the mapping in place, read-only
  // (cudaHostRegister, found in the CUDA runtime torch loaded), has the GPU
  // read it with no host copy, and unlocks it when its transfers are done;
  // the staging lane takes windows from the front of the archive, the direct
  // lanes from the back. 0: by the staging rule (1); -1: staging only.
  // `staging` false: direct lanes only (the staging lane takes only what
  // they cannot lock). At most `windows` x `window_bytes` per lane is locked
  // at once (256 MiB by default). A window that cannot be locked (no CUDA
  // runtime found, the range locked already) is staged.
  int direct_lanes = 0;
  bool staging = true;
  uint64_t window_bytes = uint64_t{64} << 20;
  int windows = 4;
  // Host memory the caller has page-locked already, read-only (the whole
  // mapping, kept locked across loads: Python's pin="register"): windows
  // inside it are read directly without locking them again.
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
