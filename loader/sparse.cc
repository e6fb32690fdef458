// Sparse tensors of an archive (spec/FORMAT.md §4.6): built from their
// component tensors, zero-copy. LibTorch's own invariant checks (indices in
// range, compressed indices monotonic) run before a sparse tensor is returned.
#include <ATen/ops/_validate_sparse_coo_tensor_args.h>
#include <ATen/ops/_validate_sparse_csc_tensor_args.h>
#include <ATen/ops/_validate_sparse_csr_tensor_args.h>
#include <ATen/ops/sparse_coo_tensor.h>
#include <ATen/ops/sparse_csc_tensor.h>
#include <ATen/ops/sparse_csr_tensor.h>

#include "format/reader.h"
#include "loader/archive_impl.h"

namespace tsar {

at::Tensor Archive::Impl::MakeSparse(uint32_t s) const {
  const format::SparseRecord& sp = index().sparse()[s];
  if (sp.layout == format::SparseLayout::kGroup) {  // §4.13
    std::string members;
    for (uint32_t k = 0; k < sp.component_count; ++k) {
      members += (k ? ", " : "") +
                 format::Quote(std::string(index().tensors()[sp.first_component + k].name));
    }
    throw Error(ErrorCode::kUnsupported, core->path, std::nullopt,
                "tensor " + format::Quote(std::string(sp.name)) +
                    " is a tensor group (a torchao quantized tensor, spec §4.13), which C++ "
                    "cannot rebuild: its members are " + members +
                    " (Archive::state_dict() gives them; Python's tsar.open(path).state_dict() "
                    "rebuilds the tensor)");
  }
  const std::string what = "sparse tensor " + format::Quote(std::string(sp.name));
  std::vector<at::Tensor> c;
  for (uint32_t k = 0; k < sp.component_count; ++k) c.push_back(Make(sp.first_component + k));
  const std::vector<int64_t> sizes(index().dims().begin() + sp.dims_index,
                                   index().dims().begin() + sp.dims_index + sp.ndim);
  auto fail = [&](const std::string& why) -> at::Tensor {
    throw Error(ErrorCode::kInvalidValue, core->path, std::nullopt, what + ": " + why);
  };
  // Shape checks first, so LibTorch is only asked to check the index values.
  const at::Tensor& values = c.back();
  if (sp.layout == format::SparseLayout::kCoo) {
    const at::Tensor& indices = c[0];
    if (indices.scalar_type() != at::kLong || indices.dim() != 2 || values.dim() < 1 ||
        indices.size(1) != values.size(0) ||
        indices.size(0) + values.dim() - 1 != static_cast<int64_t>(sizes.size())) {
      return fail(
          "expected int64 indices [sparse_dim, nnz] and values [nnz, dense sizes...] matching the "
          "sizes");
    }
  } else {
    if (sizes.size() < 2 || c[0].dim() != 1 || c[1].dim() != 1 ||
        c[0].scalar_type() != c[1].scalar_type() ||
        (c[0].scalar_type() != at::kLong && c[0].scalar_type() != at::kInt) || values.dim() != 1 ||
        c[1].size(0) != values.size(0)) {
      return fail(
          "expected compressed and plain int32/int64 indices and 1-d values of equal length");
    }
  }
  try {
    const at::TensorOptions o = values.options();
    // The constructors below check shapes only: index values out of range
    // would let to_dense() and every kernel write out of bounds. Checked here,
    // as torch.sparse_*_tensor(check_invariants=True) does.
    switch (sp.layout) {
      case format::SparseLayout::kCoo:
        at::_validate_sparse_coo_tensor_args(c[0], values, sizes);
        break;
      case format::SparseLayout::kCsr:
        at::_validate_sparse_csr_tensor_args(c[0], c[1], values, sizes);
        break;
      case format::SparseLayout::kCsc:
        at::_validate_sparse_csc_tensor_args(c[0], c[1], values, sizes);
        break;
    }
    switch (sp.layout) {
      case format::SparseLayout::kCoo: {
        at::Tensor t = at::sparse_coo_tensor(c[0], values, sizes, o.layout(at::kSparse));
        return sp.coalesced ? t._coalesced_(true) : t;
      }
      case format::SparseLayout::kCsr:
        return at::sparse_csr_tensor(c[0], c[1], values, sizes, o.layout(at::kSparseCsr));
      case format::SparseLayout::kCsc:
        return at::sparse_csc_tensor(c[0], c[1], values, sizes, o.layout(at::kSparseCsc));
    }
  } catch (const c10::Error& e) {
    std::string msg = e.what_without_backtrace();
    return fail(msg.substr(0, msg.find('\n')));
  }
  return fail("unknown layout");
}

}  // namespace tsar
