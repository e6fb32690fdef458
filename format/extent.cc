// Tensor view arithmetic of spec/FORMAT.md §4.5 (R48-R52, R78).
#include "format/extent.h"

#include "format/reader.h"

namespace tsar::format {
namespace {

constexpr uint64_t kInt64Max = static_cast<uint64_t>(INT64_MAX);

}  // namespace

ViewExtent ComputeViewExtent(const int64_t* sizes, const int64_t* strides, uint32_t ndim,
                             uint64_t storage_offset, uint64_t element_size) {
  ViewExtent v;
  using Fault = ViewExtent::Fault;
  auto fail = [&v](Fault f, uint32_t d, uint64_t limit) {
    v.fault = f;
    v.dim = d;
    v.limit = limit;
    return v;
  };
  bool empty = false;
  for (uint32_t d = 0; d < ndim; ++d) {
    if (static_cast<uint64_t>(sizes[d]) > kInt64Max) return fail(Fault::kSizeNegative, d, 0);
    if (static_cast<uint64_t>(strides[d]) > kInt64Max) return fail(Fault::kStrideNegative, d, 0);
    empty = empty || sizes[d] == 0;
  }
  // An empty view reaches no element, so its strides cannot overflow
  // anything: R50 applies only when every size is > 0. Its element count is
  // 0, but LibTorch multiplies its sizes in order with an overflow check, so
  // R78 bounds the product of its non-zero sizes by 2^63-1 (which implies
  // LibTorch's check). Every running value only grows, so the first dimension
  // at which one passes its limit is where the whole product or sum would.
  if (empty) {
    uint64_t product = 1;
    for (uint32_t d = 0; d < ndim; ++d) {
      const auto size = static_cast<uint64_t>(sizes[d]);
      if (size == 0) continue;
      if (size > kInt64Max / product) return fail(Fault::kEmptyOverflow, d, kInt64Max / product);
      product *= size;
    }
  }
  v.numel = empty ? 0 : 1;
  for (uint32_t d = 0; d < ndim && !empty; ++d) {
    const auto size = static_cast<uint64_t>(sizes[d]);
    const auto stride = static_cast<uint64_t>(strides[d]);
    if (size > kInt64Max / v.numel) return fail(Fault::kNumelOverflow, d, kInt64Max / v.numel);
    v.numel *= size;
    if (size > 1) {
      const uint64_t max_stride = (UINT64_MAX - v.last) / (size - 1);
      if (stride > max_stride) return fail(Fault::kLastOverflow, d, max_stride);
      v.last += (size - 1) * stride;
    }
  }
  if (!CheckedMul(storage_offset, element_size, &v.begin)) {
    return fail(Fault::kOffsetOverflow, 0, 0);
  }
  v.end = v.begin;
  if (v.numel > 0 && (!CheckedAdd(storage_offset, v.last, &v.end) ||
                      !CheckedAdd(v.end, 1, &v.end) || !CheckedMul(v.end, element_size, &v.end))) {
    return fail(Fault::kEndOverflow, 0, 0);
  }
  return v;
}

ViewFaultText DescribeViewFault(const ViewExtent& v, const int64_t* sizes, const int64_t* strides,
                                uint64_t storage_offset, uint64_t element_size) {
  using Fault = ViewExtent::Fault;
  const std::string d = std::to_string(v.dim);
  // sizes[dim] and strides[dim] exist only for the per-dimension faults.
  const bool per_dim = v.fault == Fault::kSizeNegative || v.fault == Fault::kStrideNegative ||
                       v.fault == Fault::kNumelOverflow || v.fault == Fault::kLastOverflow ||
                       v.fault == Fault::kEmptyOverflow;
  const auto size = per_dim ? static_cast<uint64_t>(sizes[v.dim]) : 0;
  const auto stride = per_dim ? static_cast<uint64_t>(strides[v.dim]) : 0;
  const std::string e = std::to_string(element_size);
  switch (v.fault) {
    case Fault::kSizeNegative:
      return {"size " + d, "at most 2^63-1", std::to_string(size)};
    case Fault::kStrideNegative:
      return {"stride " + d, "at most 2^63-1", std::to_string(stride)};
    case Fault::kNumelOverflow:
      return {"size " + d,
              "at most " + std::to_string(v.limit) + " (an element count of at most 2^63-1)",
              std::to_string(size)};
    case Fault::kEmptyOverflow:
      return {
          "size " + d,
          "at most " + std::to_string(v.limit) + " (a product of non-zero sizes of at most 2^63-1)",
          std::to_string(size)};
    case Fault::kLastOverflow:
      return {"stride " + d,
              "at most " + std::to_string(v.limit) + " (a last element offset below 2^64)",
              std::to_string(stride)};
    case Fault::kOffsetOverflow:
      return {"storage_offset", "storage_offset * element size " + e + " below 2^64",
              std::to_string(storage_offset)};
    case Fault::kEndOverflow:
      return {
          "storage_offset", "(storage_offset + last + 1) * element size " + e + " below 2^64",
          "storage_offset " + std::to_string(storage_offset) + ", last " + std::to_string(v.last)};
    case Fault::kNone:
      break;
  }
  return {"shape", "a valid view", "none"};
}

}  // namespace tsar::format
