// tsar::to_device (include/tsar/device.h): storage by storage through pinned
// host memory, with non-blocking copies, preserving aliasing. Built on ATen's
// device-generic ops so this file compiles on CPU-only LibTorch too.
#include "tsar/device.h"

#include <ATen/Context.h>
#include <ATen/ops/empty.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include <algorithm>

#include "loader/archive_impl.h"
#include "loader/scalar_type.h"

namespace tsar {

torch::OrderedDict<std::string, at::Tensor> to_device(const Archive& archive, c10::Device device,
                                                      const std::string& entry) {
  if (device.is_cpu()) return archive.state_dict(entry);
  if (!device.is_cuda()) {
    throw Error(ErrorCode::kUnsupported, archive.path(), std::nullopt,
                "to_device: only cpu and cuda devices are supported, found " + device.str());
  }
  if (!at::hasCUDA()) {
    throw Error(ErrorCode::kUnsupported, archive.path(), std::nullopt,
                "to_device: this LibTorch was built without CUDA (or no CUDA device/driver is "
                "present); use a CUDA build of LibTorch on a machine with a GPU");
  }
  const Archive::Impl& impl = archive.impl();
  const format::Index& index = impl.index();
  const uint32_t entry_index = impl.Entry(entry);
  const format::EntryRecord& e = index.entries()[entry_index];
  // One device storage per archive storage used by the entry. Storages are
  // packed into a pinned staging buffer and copied asynchronously on the
  // current stream; the stream is synchronized only before the buffer is reused.
  constexpr int64_t kStagingBytes = int64_t{256} << 20;
  const c10::impl::VirtualGuardImpl guard(device.type());
  const c10::Stream stream = guard.getStream(device);
  std::vector<at::Tensor> device_bytes(index.storages().size());
  at::Tensor staging;
  int64_t used = 0;
  for (uint32_t i = 0; i < e.tensor_count; ++i) {
    const format::TensorRecord& rec = index.tensors()[e.first_tensor + i];
    if (rec.role == format::Role::kSparseComponent) continue;  // moved by MakeSparse().to()
    const uint32_t s = rec.storage;
    if (device_bytes[s].defined()) continue;
    const auto nbytes = static_cast<int64_t>(index.storages()[s].nbytes);
    at::Tensor host = at::empty({0}, at::kByte).set_(impl.Storage(s), 0, {nbytes}, {1});
    device_bytes[s] = at::empty({nbytes}, at::TensorOptions().dtype(at::kByte).device(device));
    if (!staging.defined()) {
      staging =
          at::empty({kStagingBytes}, at::TensorOptions().dtype(at::kByte).pinned_memory(true));
    }
    for (int64_t done = 0; done < nbytes;) {
      if (used == kStagingBytes) {
        stream.synchronize();
        used = 0;
      }
      const int64_t n = std::min(nbytes - done, kStagingBytes - used);
      at::Tensor stage = staging.narrow(0, used, n);
      stage.copy_(host.narrow(0, done, n));
      device_bytes[s].narrow(0, done, n).copy_(stage, /*non_blocking=*/true);
      used += n;
      done += n;
    }
  }
  stream.synchronize();
  torch::OrderedDict<std::string, at::Tensor> out;
  impl.ForEachVisible(entry_index, [&](std::string_view name, uint32_t i, uint32_t sparse) {
    if (i == format::kNone) {  // small index arrays and values: LibTorch's own copy
      out.insert(std::string(name), impl.MakeSparse(sparse).to(device));
      return;
    }
    const format::TensorRecord& t = index.tensors()[i];
    const c10::ScalarType type = ToScalarType(t.dtype, [&t] { return std::string(t.name); });
    at::Tensor v =
        at::empty({0}, at::TensorOptions().dtype(type).device(device))
            .set_(device_bytes[t.storage].storage(), static_cast<int64_t>(t.storage_offset),
                  c10::IntArrayRef(index.sizes(t), t.ndim),
                  c10::IntArrayRef(index.strides(t), t.ndim));
    if (t.requires_grad) v.set_requires_grad(true);
    out.insert(std::string(name), v);
  });
  return out;
}

}  // namespace tsar
