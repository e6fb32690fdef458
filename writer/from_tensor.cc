// writer::TensorRefs (writer/from_tensor.h).
#include "writer/from_tensor.h"

#include <ATen/ops/empty.h>
#include <c10/core/Storage.h>
#include <c10/core/TensorImpl.h>

#include <cstring>
#include <sstream>

#include "loader/scalar_type.h"

namespace tsar::writer {

std::string WhyNotPackable(const at::Tensor& t) {
  if (t.layout() != c10::kStrided) {
    std::ostringstream layout;
    layout << t.layout();
    return "layout " + layout.str() + " is not supported here";
  }
  if (t.is_quantized()) return "quantized tensors are not supported; dequantize() first";
  if (!t.device().is_cpu() && !t.device().is_cuda()) {
    return "tensors on " + t.device().str() + " cannot be packed";
  }
  if (!FromScalarType(t.scalar_type())) {
    return std::string("dtype ") + c10::toString(t.scalar_type()) + " has no tsar code";
  }
  return "";
}

TensorRef TensorRefs::Of(const at::Tensor& t) {
  const c10::Storage& st = t.storage();
  std::shared_ptr<const Storage>& slot = storages_[st.unsafeGetStorageImpl()];
  if (!slot) {
    auto s = std::make_shared<Storage>();
    s->nbytes = st.nbytes();
    if (t.device().is_cuda()) {
      s->device_type = format::DeviceType::kCuda;
      s->device_index = static_cast<uint16_t>(t.device().index());
      s->fetch = [st, options = t.options().dtype(at::kByte)](uint64_t begin, uint64_t n,
                                                              uint8_t* out) {
        const at::Tensor host =
            at::empty({0}, options)
                .set_(st, static_cast<int64_t>(begin), {static_cast<int64_t>(n)}, {1})
                .to(at::kCPU);
        std::memcpy(out, host.data_ptr(), static_cast<size_t>(n));
      };
    } else {
      s->data = static_cast<const uint8_t*>(st.data());
    }
    s->keep = std::make_shared<const c10::Storage>(st);
    slot = std::move(s);
  }
  TensorRef r;
  r.storage = slot;
  r.dtype = *FromScalarType(t.scalar_type());
  r.sizes.assign(t.sizes().begin(), t.sizes().end());
  r.strides.assign(t.strides().begin(), t.strides().end());
  r.storage_offset = static_cast<uint64_t>(t.storage_offset());
  r.requires_grad = t.requires_grad();
  return r;
}

namespace {
void DeleteRef(void* ctx) { delete static_cast<std::shared_ptr<const Storage>*>(ctx); }
}  // namespace

at::Tensor ToTensor(const TensorRef& t) {
  const c10::ScalarType type = ToScalarType(t.dtype, [] { return std::string("tensor"); });
  c10::DataPtr dp(const_cast<uint8_t*>(t.storage->data),
                  new std::shared_ptr<const Storage>(t.storage), &DeleteRef,
                  c10::Device(c10::kCPU));
  c10::Storage storage(c10::Storage::use_byte_size_t(), static_cast<size_t>(t.storage->nbytes),
                       std::move(dp), nullptr, /*resizable=*/false);
  at::Tensor out = at::detail::make_tensor<c10::TensorImpl>(
      std::move(storage), c10::DispatchKeySet(c10::DispatchKey::CPU),
      c10::scalarTypeToTypeMeta(type));
  out.unsafeGetTensorImpl()->set_sizes_and_strides(c10::IntArrayRef(t.sizes),
                                                   c10::IntArrayRef(t.strides));
  out.unsafeGetTensorImpl()->set_storage_offset(static_cast<int64_t>(t.storage_offset));
  if (t.requires_grad) out.set_requires_grad(true);
  return out;
}

}  // namespace tsar::writer
