// Tensor-parallel reads (spec §4.12, format 1.4): a rank's slice of a tensor,
// and the full value of a tensor whose storage holds its slices blocked.
//
//   archive packed with W ranks, tensor sharded along d:
//     shard(rank, W)           zero-copy, C-contiguous: the rank's own block
//     shard(rank, k*W)         zero-copy: a narrow of one block (strided unless d
//                              is the first dimension with a size above 1)
//     any other world or dim   a copy of the slice alone (from the blocks it
//                              spans; the full tensor is never built)
//     the full tensor          zero-copy when the blocks lie back to back in
//                              C order (d leads and slices fill whole blocks),
//                              else a copy
//   tensor stored whole: torch.chunk(full, world, dim)[rank], a zero-copy
//   (strided) view.
// The slice is computed, never chosen among `world` chunks: its cost does not
// grow with `world` (a 260-byte archive can hold a stride-0 tensor of 2^40
// elements, and world can be 4e6).
#include <ATen/core/Tensor.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <c10/core/TensorImpl.h>

#include "format/reader.h"
#include "format/tensor_parallel.h"
#include "loader/archive_impl.h"
#include "loader/scalar_type.h"

namespace tsar {
namespace {

std::string Dec(int64_t v) { return std::to_string(v); }

}  // namespace

at::Tensor Archive::Impl::View(uint32_t i, const std::vector<int64_t>& sizes,
                               const std::vector<int64_t>& strides, uint64_t offset) const {
  const format::TensorRecord& t = index().tensors()[i];
  const c10::ScalarType type =
      ToScalarType(t.dtype, [&t] { return "tensor " + format::Quote(std::string(t.name)); });
  at::Tensor out = at::detail::make_tensor<c10::TensorImpl>(
      c10::Storage(Storage(t.storage)), c10::DispatchKeySet(c10::DispatchKey::CPU),
      c10::scalarTypeToTypeMeta(type));
  out.unsafeGetTensorImpl()->set_sizes_and_strides(sizes, strides);
  out.unsafeGetTensorImpl()->set_storage_offset(static_cast<int64_t>(offset));
  return out;
}

at::Tensor Archive::Impl::MakeFull(uint32_t i) const {
  const format::TensorRecord& t = index().tensors()[i];
  const format::ShardLayout l = index().ShardLayoutOf(t);
  const std::vector<int64_t> sizes(index().sizes(t), index().sizes(t) + t.ndim);
  at::Tensor out;
  if (l.outer <= 1 && l.block_stride == l.slice_bytes) {
    out = View(i, sizes, format::ShardStrides(sizes), 0);  // the blocks are the C-order bytes
  } else {
    const c10::ScalarType type =
        ToScalarType(t.dtype, [&t] { return "tensor " + format::Quote(std::string(t.name)); });
    out = at::empty(sizes, at::TensorOptions().dtype(type));
    if (l.slice_bytes > 0) {
      format::ScatterBlocked(l, core->StorageData(t.storage),
                             static_cast<uint8_t*>(out.data_ptr()));
    }
  }
  if (t.requires_grad) out.set_requires_grad(true);
  return out;
}

// Elements [start, start + length) along `dim` of sharded tensor `i`, as a
// C-contiguous copy made from the blocks the slice spans (every block when
// `dim` is not the split one), never from the full tensor.
at::Tensor Archive::Impl::BlockedSlice(uint32_t i, int64_t dim, int64_t start,
                                       int64_t length) const {
  const format::TensorRecord& t = index().tensors()[i];
  std::vector<int64_t> sizes(index().sizes(t), index().sizes(t) + t.ndim);
  std::vector<int64_t> out_sizes = sizes;
  out_sizes[dim] = length;
  bool empty = false;
  for (const int64_t s : out_sizes) empty = empty || s == 0;
  if (empty) {  // no bytes to read (and an empty tensor's blocks all lie at 0)
    const c10::ScalarType type =
        ToScalarType(t.dtype, [&t] { return "tensor " + format::Quote(std::string(t.name)); });
    return at::empty(out_sizes, at::TensorOptions().dtype(type));
  }
  const format::ShardLayout l = index().ShardLayoutOf(t);
  const auto d = static_cast<int64_t>(t.shard_dim);
  const int64_t w = static_cast<int64_t>(l.world);
  std::vector<int64_t> block_sizes = sizes;
  block_sizes[d] /= w;
  const std::vector<int64_t> block_strides = format::ShardStrides(block_sizes);
  const uint64_t esize = ElementSize(t.dtype);
  const auto block = [&](int64_t b) {
    return View(i, block_sizes, block_strides, static_cast<uint64_t>(b) * l.block_stride / esize);
  };
  std::vector<at::Tensor> pieces;
  if (dim == d) {  // the blocks [start, start + length) spans, each narrowed
    const int64_t bs = block_sizes[d];
    for (int64_t b = start / bs; b <= (start + length - 1) / bs; ++b) {
      const int64_t lo = std::max(start, b * bs), hi = std::min(start + length, (b + 1) * bs);
      pieces.push_back(block(b).narrow(d, lo - b * bs, hi - lo));
    }
  } else {  // every block, narrowed along `dim`, joined along d
    pieces.reserve(static_cast<size_t>(w));
    for (int64_t b = 0; b < w; ++b) pieces.push_back(block(b).narrow(dim, start, length));
  }
  return at::cat(pieces, d);  // a copy, also of a single piece
}

at::Tensor Archive::Impl::MakeShard(uint32_t i, int64_t rank, int64_t world, int64_t dim) const {
  const format::TensorRecord& t = index().tensors()[i];
  const std::string what = "shard of " + format::Quote(QualifiedName(i));
  const auto fail = [&](const std::string& why) -> at::Tensor {
    throw Error(ErrorCode::kInvalidArgument, core->path, std::nullopt, what + ": " + why);
  };
  if (world < 1) return fail("world: expected at least 1, found " + Dec(world));
  if (rank < 0 || rank >= world) {
    return fail("rank: expected 0 to " + Dec(world - 1) + ", found " + Dec(rank));
  }
  const auto ndim = static_cast<int64_t>(t.ndim);
  if (dim == kShardDimOfArchive) {
    if (t.shard_dim == format::kNone) {
      return fail("dim: the archive stores this tensor whole, so say which dimension to split");
    }
    dim = t.shard_dim;
  }
  if (ndim == 0) return fail("a scalar (0 dimensions) has no dimension to split");
  if (dim < -ndim || dim >= ndim) {
    return fail("dim: expected -" + Dec(ndim) + " to " + Dec(ndim - 1) + ", found " + Dec(dim));
  }
  if (dim < 0) dim += ndim;
  at::Tensor out;
  const uint32_t w = index().tp_world();
  // Nested chunks equal torch.chunk's only when every chunk has the same size.
  if (t.shard_dim == dim && world % w == 0 && index().sizes(t)[dim] % world == 0) {
    // The rank's block, or (world = k * W) a narrow of one block.
    const format::ShardLayout l = index().ShardLayoutOf(t);
    const int64_t k = world / w, block = rank / k;
    std::vector<int64_t> sizes(index().sizes(t), index().sizes(t) + t.ndim);
    sizes[dim] /= w;
    const uint64_t esize = ElementSize(t.dtype);
    out = View(i, sizes, format::ShardStrides(sizes), static_cast<uint64_t>(block) * l.block_stride / esize);
    if (k > 1) out = out.chunk(k, dim)[rank % k];
  } else {
    // torch.chunk(full, world, dim)[rank], computed: chunks of ceil(size /
    // world) along dim, as many as that takes (a size of 0 gives `world`
    // empty chunks).
    const int64_t size = index().sizes(t)[dim];
    int64_t start = 0, length = 0;
    if (size > 0) {
      const int64_t split = size / world + (size % world != 0 ? 1 : 0);
      const int64_t chunks = size / split + (size % split != 0 ? 1 : 0);
      if (rank >= chunks) {
        return fail("rank " + Dec(rank) + ": size " + Dec(size) + " of dim " + Dec(dim) +
                    " gives only " + Dec(chunks) + " chunks of " + Dec(world));
      }
      start = rank * split;  // < size: no overflow
      length = std::min(split, size - start);
    }
    if (t.shard_dim == format::kNone) {
      out = Make(i).detach().narrow(dim, start, length);  // a zero-copy view
    } else {
      out = BlockedSlice(i, dim, start, length);  // a copy of the slice alone
    }
  }
  if (t.requires_grad) out.set_requires_grad(true);
  return out;
}

at::Tensor Archive::shard(const std::string& name, int64_t rank, int64_t world, int64_t dim,
                          const std::string& entry) const {
  return impl_->MakeShard(impl_->Find(name, entry), rank, world, dim);
}

}  // namespace tsar
