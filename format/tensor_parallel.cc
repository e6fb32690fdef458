// §4.12 (format 1.4): see format/tensor_parallel.h.
#include "format/tensor_parallel.h"

#include <algorithm>
#include <cstring>

namespace tsar::format {
namespace {

std::string Dec(uint64_t v) { return std::to_string(v); }

std::string List(const int64_t* v, uint32_t n) {
  std::string s = "[";
  for (uint32_t i = 0; i < n; ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

}  // namespace

std::vector<int64_t> ShardStrides(const int64_t* sizes, uint32_t ndim) {
  std::vector<int64_t> s(ndim);
  uint64_t p = 1;
  for (uint32_t k = ndim; k-- > 0;) {
    s[k] = static_cast<int64_t>(p);
    // Stays below 2^63 until a size 0 makes it 0 (R50, R78 bound the rest).
    p *= static_cast<uint64_t>(sizes[k]);
  }
  return s;
}

bool ComputeShardLayout(const int64_t* sizes, uint32_t ndim, uint32_t dim, uint64_t element_size,
                        uint32_t world, uint32_t alignment, ShardLayout* out) {
  ShardLayout l;
  l.world = world;
  l.outer = 1;
  for (uint32_t d = 0; d < dim; ++d) l.outer *= static_cast<uint64_t>(sizes[d]);
  uint64_t inner = element_size;
  for (uint32_t d = dim + 1; d < ndim; ++d) inner *= static_cast<uint64_t>(sizes[d]);
  // Every product here divides numel * element_size, which the caller bounds,
  // unless a size is 0, which makes the slice empty.
  bool empty = false;
  for (uint32_t d = 0; d < ndim; ++d) empty = empty || sizes[d] == 0;
  if (empty) {
    l.outer = 0;
    l.chunk = 0;
  } else {
    l.chunk = static_cast<uint64_t>(sizes[dim]) / world * inner;
  }
  l.slice_bytes = l.outer * l.chunk;
  const uint64_t a = l.slice_bytes >= alignment ? alignment : kMinAlignment;
  if (!AlignUp(l.slice_bytes, a, &l.block_stride)) return false;
  uint64_t before = 0;
  if (__builtin_mul_overflow(uint64_t{world - 1}, l.block_stride, &before) ||
      __builtin_add_overflow(before, l.slice_bytes, &l.nbytes)) {
    return false;
  }
  *out = l;
  return true;
}

ShardFault CheckShard(const int64_t* sizes, const int64_t* strides, uint32_t ndim,
                      uint64_t storage_offset, uint64_t element_size, bool sparse_component,
                      uint32_t dim, uint32_t world, uint32_t alignment, uint64_t storage_nbytes,
                      ShardLayout* layout) {
  using Rule = ShardFault::Rule;
  if (sparse_component) {  // R105
    return {Rule::kRole, "role", "a tensor that is not a sparse component (role 0-2)", "3"};
  }
  if (dim >= ndim) {  // R106
    return {Rule::kDim, "dim", "less than the tensor's ndim " + Dec(ndim), Dec(dim)};
  }
  if (static_cast<uint64_t>(sizes[dim]) % world != 0) {  // R107
    return {Rule::kDivisible, "size " + Dec(dim),
            "a multiple of the world size " + Dec(world), Dec(static_cast<uint64_t>(sizes[dim]))};
  }
  // R108: offset 0 and exactly the C-contiguous strides of its sizes.
  const std::vector<int64_t> want = ShardStrides(sizes, ndim);
  if (storage_offset != 0 || !std::equal(want.begin(), want.end(), strides)) {
    return {Rule::kContiguous, "view",
            "storage_offset 0 and C-contiguous strides " + List(want.data(), ndim),
            "storage_offset " + Dec(storage_offset) + " strides " + List(strides, ndim)};
  }
  ShardLayout l;
  if (!ComputeShardLayout(sizes, ndim, dim, element_size, world, alignment, &l)) {  // R109
    return {Rule::kNbytes, "storage nbytes", "a layout of " + Dec(world) + " slices below 2^64",
            Dec(storage_nbytes)};
  }
  if (l.nbytes != storage_nbytes) {  // R109
    return {Rule::kNbytes, "storage nbytes",
            Dec(l.nbytes) + " (" + Dec(world) + " slices of " + Dec(l.slice_bytes) + " bytes, " +
                Dec(l.block_stride) + " bytes apart)",
            Dec(storage_nbytes)};
  }
  if (layout) *layout = l;
  return {};
}

void GatherBlocked(const ShardLayout& l, const uint8_t* c_order, uint64_t begin, uint64_t n,
                   uint8_t* out) {
  const uint64_t row = l.chunk * l.world;  // one outer row of the C-order tensor
  uint64_t pos = begin;
  const uint64_t end = begin + n;
  if (l.block_stride == 0) {  // an empty tensor: nothing but (no) padding
    std::memset(out, 0, n);
    return;
  }
  while (pos < end) {
    const uint64_t rank = pos / l.block_stride;
    const uint64_t in_block = pos - rank * l.block_stride;
    if (rank >= l.world || in_block >= l.slice_bytes) {  // padding between (or after) slices
      const uint64_t stop =
          rank >= l.world ? end : std::min(end, (rank + 1) * l.block_stride);
      std::memset(out + (pos - begin), 0, stop - pos);
      pos = stop;
      continue;
    }
    const uint64_t o = in_block / l.chunk, c = in_block - o * l.chunk;
    const uint64_t len = std::min(end - pos, l.chunk - c);
    std::memcpy(out + (pos - begin), c_order + o * row + rank * l.chunk + c, len);
    pos += len;
  }
}

void ScatterBlocked(const ShardLayout& l, const uint8_t* blocked, uint8_t* c_order) {
  const uint64_t row = l.chunk * l.world;
  for (uint64_t r = 0; r < l.world; ++r) {
    const uint8_t* slice = blocked + r * l.block_stride;
    for (uint64_t o = 0; o < l.outer; ++o) {
      std::memcpy(c_order + o * row + r * l.chunk, slice + o * l.chunk, l.chunk);
    }
  }
}

}  // namespace tsar::format
