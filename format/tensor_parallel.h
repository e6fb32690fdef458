// §4.12 (format 1.4): tensors laid out for tensor-parallel ranks. A sharded
// tensor is split along one dimension into `world` equal slices, and its
// storage holds them one after another, rank 0 first: each slice C-contiguous
// and starting on a block boundary, so that a rank maps one contiguous,
// aligned run of the file. The geometry, the rules R105-R109 on one sharded
// tensor, and the byte moves between the blocked and the C-order layout live
// here, shared by decoder, encoder, writer and loader. Pure C++, no I/O.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "format/spec.h"

namespace tsar::format {

// Where rank r's slice lies in a sharded tensor's storage: bytes
// [r * block_stride, r * block_stride + slice_bytes). The slice is C-contiguous,
// with the tensor's sizes but sizes[dim] / world along `dim`.
struct ShardLayout {
  uint32_t world = 0;
  uint64_t outer = 0;         // product of sizes[0 .. dim)
  uint64_t chunk = 0;         // bytes of one rank's part of one outer row: sizes[dim] / world * inner
  uint64_t slice_bytes = 0;   // outer * chunk = numel / world * element size
  uint64_t block_stride = 0;  // align_up(slice_bytes, alignment if slice_bytes >= alignment else 64)
  uint64_t nbytes = 0;        // the storage's size: (world - 1) * block_stride + slice_bytes
};

// The layout of a C-contiguous tensor of `ndim` sizes (each >= 0, their
// product times element_size below 2^64) split `world` ways along `dim` (<
// ndim, sizes[dim] divisible by world) in an archive of header `alignment`.
// False when nbytes would pass 2^64 - 1.
bool ComputeShardLayout(const int64_t* sizes, uint32_t ndim, uint32_t dim, uint64_t element_size,
                        uint32_t world, uint32_t alignment, ShardLayout* out);

// R105-R109 of §6.3 on one shard record: the first rule that tensor
// (`sizes`, `strides`, `storage_offset`, element size, whether it is a sparse
// component) breaks when sharded `world` ways along `dim` in a storage of
// `storage_nbytes` bytes. `field` is relative to the shard record or the
// tensor ("dim", "strides", "storage nbytes"), as in §6.7.
struct ShardFault {
  enum class Rule : uint8_t { kNone, kRole, kDim, kDivisible, kContiguous, kNbytes };
  Rule rule = Rule::kNone;
  std::string field, expected, found;
};
ShardFault CheckShard(const int64_t* sizes, const int64_t* strides, uint32_t ndim,
                      uint64_t storage_offset, uint64_t element_size, bool sparse_component,
                      uint32_t dim, uint32_t world, uint32_t alignment, uint64_t storage_nbytes,
                      ShardLayout* layout);

// R108: the strides a sharded tensor's record holds, C-contiguous with no
// exception for sizes 0 and 1: strides[d] is the product of the sizes after d.
// Also the strides of one rank's slice, given the slice's sizes.
std::vector<int64_t> ShardStrides(const int64_t* sizes, uint32_t ndim);
inline std::vector<int64_t> ShardStrides(const std::vector<int64_t>& sizes) {
  return ShardStrides(sizes.data(), static_cast<uint32_t>(sizes.size()));
}

// Bytes [begin, begin + n) of the blocked storage of `layout` into `out`,
// taken from the tensor's C-order bytes `c_order` (zero in the padding
// between slices). The writer streams a storage with it.
void GatherBlocked(const ShardLayout& layout, const uint8_t* c_order, uint64_t begin, uint64_t n,
                   uint8_t* out);

// The tensor's C-order bytes (numel * element size) into `c_order`, from its
// blocked storage `blocked`: the full tensor of a tensor-parallel archive.
void ScatterBlocked(const ShardLayout& layout, const uint8_t* blocked, uint8_t* c_order);

}  // namespace tsar::format
