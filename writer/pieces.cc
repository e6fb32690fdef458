// tsar::exporter::ForEachPiece (writer/pieces.h).
#include "writer/pieces.h"

#include <algorithm>
#include <cstring>

namespace tsar::exporter {
namespace {

uint64_t Numel(const StridedView& x) {
  uint64_t n = 1;
  for (int64_t d : x.sizes) n *= static_cast<uint64_t>(d);
  return n;
}

// LibTorch's is_contiguous(): row-major strides, ignoring dimensions of size 1.
bool IsContiguous(const StridedView& x) {
  int64_t expected = 1;
  for (size_t d = x.sizes.size(); d-- > 0;) {
    if (x.sizes[d] == 1) continue;
    if (x.strides[d] != expected) return false;
    expected *= x.sizes[d];
  }
  return true;
}

// Copies the elements of `x` (non-empty) into `out` in C order.
template <size_t E>
void CopyOut(const StridedView& x, uint8_t* out) {
  const size_t ndim = x.sizes.size();
  if (ndim == 0) {
    std::memcpy(out, x.storage + x.storage_offset * E, E);
    return;
  }
  const int64_t inner = x.sizes[ndim - 1], inner_stride = x.strides[ndim - 1];
  std::vector<int64_t> index(ndim - 1, 0);
  uint64_t at = x.storage_offset;  // element index of the current row's first element
  for (;;) {
    const uint8_t* src = x.storage + at * E;
    if (inner_stride == 1) {
      std::memcpy(out, src, static_cast<size_t>(inner) * E);
      out += static_cast<size_t>(inner) * E;
    } else {
      const uint64_t step = static_cast<uint64_t>(inner_stride) * E;
      for (int64_t i = 0; i < inner; ++i, src += step, out += E) std::memcpy(out, src, E);
    }
    // The next row: an odometer over the outer dimensions.
    size_t d = ndim - 1;
    while (d-- > 0) {
      if (++index[d] < x.sizes[d]) {
        at += static_cast<uint64_t>(x.strides[d]);
        break;
      }
      at -= static_cast<uint64_t>(x.strides[d]) * static_cast<uint64_t>(x.sizes[d] - 1);
      index[d] = 0;
    }
    if (d == static_cast<size_t>(-1)) return;
  }
}

void Copy(const StridedView& x, uint8_t* out) {
  switch (x.element_size) {
    case 1:
      return CopyOut<1>(x, out);
    case 2:
      return CopyOut<2>(x, out);
    case 4:
      return CopyOut<4>(x, out);
    case 8:
      return CopyOut<8>(x, out);
    default:
      return CopyOut<16>(x, out);
  }
}

// `x` is the sub-block of the whole tensor at `prefix` (leading indices
// fixed to one element each).
void Walk(const StridedView& x, std::vector<int64_t>& prefix,
          const std::function<void(const Piece&)>& fn, uint64_t max_bytes,
          std::vector<uint8_t>& buffer) {
  const uint64_t bytes = Numel(x) * x.element_size;
  const auto emit = [&](const StridedView& block, int64_t first) {
    Piece p{nullptr, Numel(block) * block.element_size, prefix,
            std::vector<int64_t>(prefix.size(), 1)};
    if (IsContiguous(block)) {
      p.data = block.storage + block.storage_offset * block.element_size;
    } else {
      buffer.resize(static_cast<size_t>(p.nbytes));
      Copy(block, buffer.data());
      p.data = buffer.data();
    }
    for (size_t d = 0; d < block.sizes.size(); ++d) {
      p.start.push_back(d == 0 ? first : 0);
      p.count.push_back(block.sizes[d]);
    }
    fn(p);
  };
  if (x.sizes.empty() || IsContiguous(x) || bytes <= max_bytes) {
    emit(x, 0);
    return;
  }
  const int64_t rows = x.sizes[0];
  const uint64_t row_bytes = bytes / static_cast<uint64_t>(rows);
  if (row_bytes <= max_bytes) {
    const int64_t step = static_cast<int64_t>(std::max<uint64_t>(1, max_bytes / row_bytes));
    StridedView block = x;
    for (int64_t i = 0; i < rows; i += step) {
      block.sizes[0] = std::min(step, rows - i);
      block.storage_offset = x.storage_offset + static_cast<uint64_t>(i * x.strides[0]);
      emit(block, i);
    }
    return;
  }
  StridedView row = x;
  row.sizes.erase(row.sizes.begin());
  row.strides.erase(row.strides.begin());
  for (int64_t i = 0; i < rows; ++i) {
    row.storage_offset = x.storage_offset + static_cast<uint64_t>(i * x.strides[0]);
    prefix.push_back(i);
    Walk(row, prefix, fn, max_bytes, buffer);
    prefix.pop_back();
  }
}

}  // namespace

StridedView ViewOf(const ArchiveFile& archive, const TensorInfo& t) {
  return {static_cast<const uint8_t*>(archive.storage_values(t.storage)), ElementSize(t.dtype),
          t.sizes, t.strides, t.storage_offset};
}

void ForEachPiece(const StridedView& x, const std::function<void(const Piece&)>& fn,
                  uint64_t max_bytes) {
  if (Numel(x) == 0) return;
  std::vector<int64_t> prefix;
  std::vector<uint8_t> buffer;
  Walk(x, prefix, fn, max_bytes, buffer);
}

}  // namespace tsar::exporter
