// tsar::exporter::ForEachPiece (writer/pieces.h).
#include "writer/pieces.h"

#include <algorithm>

namespace tsar::exporter {
namespace {

uint64_t Bytes(const at::Tensor& x) {
  return static_cast<uint64_t>(x.numel()) * static_cast<uint64_t>(x.element_size());
}

// `x` is the sub-block of the whole tensor at `prefix` (leading indices
// fixed to one element each).
void Walk(const at::Tensor& x, std::vector<int64_t>& prefix,
          const std::function<void(const Piece&)>& fn, uint64_t max_bytes) {
  const auto emit = [&](const at::Tensor& block, int64_t first) {
    Piece p{block.data_ptr(), Bytes(block), prefix, std::vector<int64_t>(prefix.size(), 1)};
    const auto sizes = block.sizes();
    for (size_t d = 0; d < sizes.size(); ++d) {
      p.start.push_back(d == 0 ? first : 0);
      p.count.push_back(sizes[d]);
    }
    fn(p);
  };
  if (x.dim() == 0 || x.is_contiguous() || Bytes(x) <= max_bytes) {
    emit(x.contiguous(), 0);
    return;
  }
  const int64_t rows = x.size(0);
  const uint64_t row_bytes = Bytes(x) / static_cast<uint64_t>(rows);
  if (row_bytes <= max_bytes) {
    const int64_t step = static_cast<int64_t>(std::max<uint64_t>(1, max_bytes / row_bytes));
    for (int64_t i = 0; i < rows; i += step) {
      emit(x.narrow(0, i, std::min(step, rows - i)).contiguous(), i);
    }
    return;
  }
  for (int64_t i = 0; i < rows; ++i) {
    prefix.push_back(i);
    Walk(x.select(0, i), prefix, fn, max_bytes);
    prefix.pop_back();
  }
}

}  // namespace

void ForEachPiece(const at::Tensor& x, const std::function<void(const Piece&)>& fn,
                  uint64_t max_bytes) {
  if (x.numel() == 0) return;
  std::vector<int64_t> prefix;
  Walk(x, prefix, fn, max_bytes);
}

}  // namespace tsar::exporter
