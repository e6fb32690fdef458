// Element-wise comparison of two tensors' values for `tsar diff`: how many
// elements differ and by how much at most, for every dtype, without LibTorch
// (half, bfloat16 and float8 are decoded here).
#pragma once

#include <cstddef>
#include <cstdint>

#include "tsar/dtype.h"

namespace tsar::cli {

struct Tolerance {
  double atol = 0, rtol = 0;
  // No tolerance: elements differ when their bytes do (0.0 and -0.0 differ,
  // a NaN equals the same NaN). With one, floating-point and complex
  // elements are close when |a - b| <= atol + rtol * |b| (NaN close to NaN,
  // an infinity to the same infinity); integers and bool still compare exactly.
  bool exact() const { return atol == 0 && rtol == 0; }
};

// One element of `dtype` at a and at b: whether they differ under `tol`, and
// |a - b| (NaN where one is NaN and the other is not).
bool ElementsDiffer(DType dtype, const uint8_t* a, const uint8_t* b, const Tolerance& tol,
                    double* abs_diff);

// Whether the dtype is compared with the tolerance (floating point, complex).
bool IsInexact(DType dtype);

}  // namespace tsar::cli
