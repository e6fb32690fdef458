// writer::Storage and writer::TensorRef (writer/tensor_ref.h).
#include "writer/tensor_ref.h"

namespace tsar::writer {

std::shared_ptr<Storage> Storage::Owning(std::vector<uint8_t> bytes) {
  auto owned = std::make_shared<const std::vector<uint8_t>>(std::move(bytes));
  auto s = std::make_shared<Storage>();
  s->data = owned->data();
  s->nbytes = owned->size();
  s->keep = std::move(owned);
  return s;
}

const uint8_t* Storage::Bytes(uint64_t begin, uint64_t n, std::vector<uint8_t>& buffer) const {
  if (data != nullptr) return data + begin;
  buffer.resize(static_cast<size_t>(n));
  if (n > 0) fetch(begin, n, buffer.data());
  return buffer.data();
}

uint64_t TensorRef::numel() const {
  uint64_t n = 1;
  for (int64_t d : sizes) n *= static_cast<uint64_t>(d);
  return n;
}

bool TensorRef::is_floating_point() const {
  return IsFloatingOrComplex(dtype) && dtype != DType::kComplex32 && dtype != DType::kComplex64 &&
         dtype != DType::kComplex128;
}

void TensorRef::ByteSpan(uint64_t* begin, uint64_t* end) const {
  const uint64_t esize = ElementSize(dtype);
  *begin = storage_offset * esize;
  for (int64_t d : sizes) {
    if (d == 0) {
      *end = *begin;
      return;
    }
  }
  uint64_t last = storage_offset;
  for (size_t d = 0; d < sizes.size(); ++d) {
    last += static_cast<uint64_t>(sizes[d] - 1) * static_cast<uint64_t>(strides[d]);
  }
  *end = (last + 1) * esize;
}

}  // namespace tsar::writer
