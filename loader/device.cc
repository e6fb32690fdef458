// tsar::to_device (include/tsar/device.h): the staging pipeline of
// loader/device_pipeline.h driven through LibTorch's device-generic streams,
// events and copies, so this file compiles on CPU-only LibTorch and without a
// CUDA compiler, and runs wherever the LibTorch given has CUDA.
#include "tsar/device.h"

#include <ATen/Context.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <c10/core/Event.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include <algorithm>
#include <cstdlib>
#include <mutex>
#include <optional>
#include <unordered_map>

#include <unistd.h>

#include "loader/archive_impl.h"
#include "loader/bind_common.h"
#include "loader/device_pipeline.h"
#include "loader/file_regions.h"

namespace tsar {
namespace {

// The device allocations the copies write into, one per distinct host
// storage, each made at the first copy into it (so allocating, a cudaMalloc
// where the caching allocator holds no free block, overlaps the copies
// already enqueued instead of all of it coming before the first copy), on
// the calling thread's stream, which the copy stream then waits for.
class DeviceTargets {
 public:
  DeviceTargets(c10::Device device, std::vector<uint64_t> sizes)
      : device_(device), sizes_(std::move(sizes)), tensors_(sizes_.size()) {
    const c10::impl::VirtualGuardImpl guard(device.type());
    caller_ = guard.getStream(device.has_index() ? device : guard.getDevice());
  }
  // Target i, allocated on first use; `stream` (a copy stream) starts its
  // copies after the allocation (the caching allocator may hand back a block
  // that work queued on the caller's stream still reads). Thread-safe.
  at::Tensor& Get(uint32_t i, const c10::Stream& stream) {
    const std::lock_guard<std::mutex> lock(mu_);
    at::Tensor& t = tensors_[i];
    if (!t.defined()) {
      const c10::StreamGuard on(caller_);
      t = Allocate(i);
      c10::Event allocated(device_.type());
      allocated.record(caller_);
      allocated.block(stream);
    }
    return t;
  }
  // Every target (the ones no copy wrote: empty storages).
  std::vector<at::Tensor> Take() {
    const std::lock_guard<std::mutex> lock(mu_);
    for (uint32_t i = 0; i < tensors_.size(); ++i) {
      if (!tensors_[i].defined()) tensors_[i] = Allocate(i);
    }
    return std::move(tensors_);
  }
  const c10::Stream& caller() const { return caller_; }

 private:
  at::Tensor Allocate(uint32_t i) const {
    return at::empty({static_cast<int64_t>(sizes_[i])},
                     at::TensorOptions().dtype(at::kByte).device(device_));
  }
  c10::Device device_;
  std::vector<uint64_t> sizes_;
  std::vector<at::Tensor> tensors_;
  c10::Stream caller_ = c10::Stream(c10::Stream::DEFAULT, c10::Device(c10::kCPU));
  std::mutex mu_;
};

// CopyEngine over LibTorch: pinned buffers from its host allocator, a pool of
// device streams, one event per buffer. A direct lane's engine reads host
// memory the caller has page-locked already ([locked, locked + locked_size),
// whole pages: the archive's mapping under pin="register") instead.
class TorchEngine : public CopyEngine {
 public:
  TorchEngine(c10::Device device, int streams, DeviceTargets* targets,
              const uint8_t* locked = nullptr, uint64_t locked_size = 0)
      : device_(device),
        guard_(device.type()),
        targets_(targets),
        locked_(locked),
        locked_size_(locked_size),
        direct_(locked != nullptr),
        // "cuda" without an index: the calling thread's current device.
        thread_device_(device.has_index() ? device : guard_.getDevice()) {
    // The copy streams start after everything queued on the caller's stream
    // so far (and after each target's allocation: DeviceTargets::Get).
    c10::Event queued(device.type());
    queued.record(targets->caller());
    for (int s = 0; s < streams; ++s) {
      streams_.push_back(guard_.getStreamFromGlobalPool(device));
      queued.block(streams_.back());
    }
  }
  void* AllocatePinned(int buffer, uint64_t bytes) override {
    if (static_cast<size_t>(buffer) >= pinned_.size()) pinned_.resize(buffer + 1);
    pinned_[buffer] = at::empty({static_cast<int64_t>(bytes)},
                                at::TensorOptions().dtype(at::kByte).pinned_memory(true));
    while (events_.size() < pinned_.size()) events_.emplace_back(device_.type());
    return pinned_[buffer].data_ptr();
  }
  void CopyAsync(int stream, const void* src, uint32_t target, uint64_t offset,
                 uint64_t n) override {
    at::Tensor& into = targets_->Get(target, streams_[stream]);
    const c10::StreamGuard on(streams_[stream]);
    into.narrow(0, static_cast<int64_t>(offset), static_cast<int64_t>(n))
        .copy_(direct_ ? LockedView(src, n) : PinnedView(src, n), /*non_blocking=*/true);
  }
  void RecordDone(int stream, int buffer) override {
    while (events_.size() <= static_cast<size_t>(buffer)) events_.emplace_back(device_.type());
    events_[buffer].record(streams_[stream]);
  }
  void WaitDone(int buffer) override { events_[buffer].synchronize(); }
  void Finish() override {
    for (const c10::Stream& s : streams_) s.synchronize();
  }
  // A direct lane's thread works on the target's device (a new thread's
  // CUDA device is 0: locking there would make a context on another GPU).
  void EnterThread() override { guard_.setDevice(thread_device_); }
  // Locks nothing itself: locking windows per load measured 17-19 GB/s on
  // an H100 host and slowed the staging lane beside it (see
  // loader/device_pipeline.h); a window outside the locked range is staged.
  bool Register(const void* p, uint64_t n) override { return LockedAlready(p, n); }

 private:
  bool LockedAlready(const void* p, uint64_t n) const {
    const auto* q = static_cast<const uint8_t*>(p);
    return locked_ != nullptr && q >= locked_ && n <= locked_size_ &&
           static_cast<uint64_t>(q - locked_) <= locked_size_ - n;
  }
  // [src, src + n) of a locked window, as a CPU tensor: its copy_ with
  // non_blocking is an asynchronous DMA from the window.
  static at::Tensor LockedView(const void* src, uint64_t n) {
    return at::from_blob(const_cast<void*>(src), {static_cast<int64_t>(n)},
                         at::TensorOptions().dtype(at::kByte));
  }
  // The slice of the pinned buffer holding [src, src + n).
  at::Tensor PinnedView(const void* src, uint64_t n) const {
    const auto* p = static_cast<const uint8_t*>(src);
    for (const at::Tensor& b : pinned_) {
      const auto* base = static_cast<const uint8_t*>(b.data_ptr());
      if (p >= base && p + n <= base + b.numel()) {
        return b.narrow(0, p - base, static_cast<int64_t>(n));
      }
    }
    throw Error(ErrorCode::kInvalidArgument, "", std::nullopt,
                "to_device: a transfer from outside the staging buffers");
  }
  c10::Device device_;
  c10::impl::VirtualGuardImpl guard_;
  DeviceTargets* targets_;
  const uint8_t* locked_;
  uint64_t locked_size_;
  bool direct_;  // a direct lane's engine: copies read locked windows
  c10::Device thread_device_;
  std::vector<c10::Stream> streams_;
  std::vector<at::Tensor> pinned_;
  std::vector<c10::Event> events_;
};

}  // namespace

void CheckDevice(c10::Device device, const std::string& path, const char* what,
                 const DeviceOptions& options) {
  if (device.is_cpu()) return;
  if (const std::string bad =
          StagingOptionsError(options.buffers, options.streams, options.fill_threads);
      !bad.empty()) {
    throw Error(ErrorCode::kInvalidArgument, path, std::nullopt, std::string(what) + ": " + bad);
  }
  if (!device.is_cuda()) {
    throw Error(ErrorCode::kUnsupported, path, std::nullopt,
                std::string(what) + ": only cpu and cuda devices are supported, found " +
                    device.str());
  }
  if (!at::hasCUDA()) {
    throw Error(ErrorCode::kUnsupported, path, std::nullopt,
                std::string(what) +
                    ": this LibTorch was built without CUDA (or no CUDA device/driver is "
                    "present); use a CUDA build of LibTorch on a machine with a GPU");
  }
  const c10::DeviceIndex count = c10::impl::VirtualGuardImpl(device.type()).deviceCount();
  if (device.has_index() && device.index() >= count) {
    throw Error(ErrorCode::kInvalidArgument, path, std::nullopt,
                std::string(what) + ": " + device.str() + ": this machine has " +
                    std::to_string(count) + " CUDA device" + (count == 1 ? "" : "s"));
  }
}

std::vector<at::Tensor> CopyToDevice(const std::vector<at::Tensor>& sources, c10::Device device,
                                     const DeviceOptions& options, const ArchiveCore& core) {
  // Per distinct host storage, numbered in first-seen order: the bytes its
  // views touch, [lo, hi), lo rounded down to 64 bytes (a multiple of every
  // element size), copied once into one device allocation. A rank's slice
  // copies its own run of the file, not the whole storage.
  std::unordered_map<const c10::StorageImpl*, uint32_t> number;
  std::vector<uint32_t> of(sources.size());
  std::vector<uint64_t> first(sources.size());
  std::vector<uint64_t> lo, hi;
  std::vector<const uint8_t*> base;
  for (size_t i = 0; i < sources.size(); ++i) {
    const at::Tensor& t = sources[i];
    const uint64_t item = t.element_size();
    first[i] = static_cast<uint64_t>(t.storage_offset()) * item;
    uint64_t extent = 0;
    bool whole = false;
    if (t.numel() > 0) {
      extent = item;
      for (int64_t d = 0; d < t.dim(); ++d) {
        if (t.stride(d) < 0) whole = true;
        extent += static_cast<uint64_t>(t.size(d) - 1) * static_cast<uint64_t>(std::abs(t.stride(d))) * item;
      }
    }
    const c10::Storage& s = t.storage();
    const auto [it, fresh] = number.emplace(s.unsafeGetStorageImpl(), static_cast<uint32_t>(lo.size()));
    of[i] = it->second;
    const uint64_t a = whole ? 0 : first[i];
    const uint64_t b = whole ? s.nbytes() : first[i] + extent;
    if (fresh) {
      lo.push_back(a);
      hi.push_back(b);
      base.push_back(static_cast<const uint8_t*>(s.data()));
    } else {
      lo[it->second] = std::min(lo[it->second], a);
      hi[it->second] = std::max(hi[it->second], b);
    }
  }
  std::vector<uint64_t> sizes;
  std::vector<CopyRange> ranges;
  for (size_t n = 0; n < lo.size(); ++n) {
    lo[n] &= ~uint64_t{63};
    const uint64_t bytes = hi[n] > lo[n] ? hi[n] - lo[n] : 0;
    sizes.push_back(bytes);
    ranges.push_back({base[n] + lo[n], bytes, static_cast<uint32_t>(n), 0});
  }
  DeviceTargets targets(device, std::move(sizes));
  {
    // Memory locked already (the mapping, whole pages): one direct lane reads
    // it, and the staging lane takes only what lies outside it.
    const auto* locked = static_cast<const uint8_t*>(options.locked_base);
    const bool read_locked = locked != nullptr && options.locked_size > 0;
    const PipelineOptions p = LoadPipeline(options.pinned_bytes, options.buffers, options.streams,
                                           options.fill_threads, read_locked);
    TorchEngine engine(device, p.streams, &targets);
    EngineFactory direct;
    if (read_locked) {
      const auto page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
      const uint64_t size = (options.locked_size + page - 1) / page * page;
      direct = [&, locked, size] {
        return std::unique_ptr<CopyEngine>(
            std::make_unique<TorchEngine>(device, p.streams, &targets, locked, size));
      };
    }
    // The staging lane's fill: the archive's file where its mapping shows it.
    StagingFill fill(core, options.stage_from_file);
    const PipelineStats s = RunPipeline(ranges, engine, p, fill.function(), direct);
    if (options.stats != nullptr) {
      *options.stats = DeviceStats{s.bytes, s.bytes_direct, s.pinned_bytes,
                                   fill.bytes_from_file(), s.fill_threads, p.streams};
    }
  }
  const std::vector<at::Tensor> device_bytes = targets.Take();
  std::vector<at::Tensor> out;
  out.reserve(sources.size());
  for (size_t i = 0; i < sources.size(); ++i) {
    const at::Tensor& t = sources[i];
    const uint64_t item = t.element_size();
    out.push_back(at::empty({0}, at::TensorOptions().dtype(t.dtype()).device(device))
                      .set_(device_bytes[of[i]].storage(),
                            static_cast<int64_t>((first[i] - lo[of[i]]) / item), t.sizes(),
                            t.strides()));
  }
  return out;
}

torch::OrderedDict<std::string, at::Tensor> to_device(const Archive& archive, c10::Device device,
                                                      const std::string& entry,
                                                      const DeviceOptions& options) {
  if (device.is_cpu()) return archive.state_dict(entry);
  CheckDevice(device, archive.path(), "to_device", options);
  const Archive::Impl& impl = archive.impl();
  const uint32_t entry_index = impl.Entry(entry);
  // The entry's tensors in order. Sparse ones by LibTorch's own copy (small
  // index and value arrays); every other through CopyToDevice, as bind does:
  // the bytes each storage's views touch, once, so views and tied weights
  // stay views of one device storage (a sharded tensor, §4.12, is its full
  // host copy first).
  std::vector<std::string> names;
  std::vector<at::Tensor> tensors;
  std::vector<size_t> dense;  // positions in `tensors` of the `sources`
  std::vector<at::Tensor> sources;
  const format::Index& index = impl.index();
  const auto add_dense = [&](std::string_view name, uint32_t i) {
    names.emplace_back(name);
    dense.push_back(tensors.size());
    tensors.emplace_back();
    sources.push_back(impl.Make(i));
  };
  impl.ForEachVisible(entry_index, [&](std::string_view name, uint32_t i, uint32_t sparse) {
    if (i != format::kNone) {
      add_dense(name, i);
    } else if (index.IsGroup(sparse)) {  // §4.13: its members, as state_dict() gives them
      const format::SparseRecord& sp = index.sparse()[sparse];
      for (uint32_t k = sp.first_component; k < sp.first_component + sp.component_count; ++k)
        add_dense(index.tensors()[k].name, k);
    } else {
      names.emplace_back(name);
      tensors.push_back(impl.MakeSparse(sparse).to(device));
    }
  });
  const std::vector<at::Tensor> on_device = CopyToDevice(sources, device, options, *impl.core);
  for (size_t k = 0; k < dense.size(); ++k) {
    tensors[dense[k]] = on_device[k];
    if (sources[k].requires_grad()) tensors[dense[k]].set_requires_grad(true);
  }
  torch::OrderedDict<std::string, at::Tensor> out;
  for (size_t k = 0; k < names.size(); ++k) out.insert(std::move(names[k]), std::move(tensors[k]));
  return out;
}

}  // namespace tsar
