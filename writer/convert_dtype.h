// PackOptions::dtype: floating-point tensors stored as another floating
// dtype (float16, bfloat16, float32, float64), one storage at a time so that
// tensors which share a storage (views, tied weights) still share the
// converted one. No LibTorch: the element conversions are those of
// LibTorch's scalar casts, bit for bit (tested against torch's .to()).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tsar/dtype.h"
#include "writer/tensor_ref.h"

namespace tsar::writer {

struct ConvertItem {
  const std::string* name;  // for the note
  TensorRef* tensor;        // replaced by its converted view
};

// True for the dtypes PackOptions::dtype converts from and to.
bool IsConvertibleFloating(DType t);

// Converts `n` elements of floating dtype `from` at `src` to `to` at `dst`
// (both convertible dtypes; unaligned pointers are fine).
void ConvertElements(DType from, const uint8_t* src, DType to, uint8_t* dst, uint64_t n);

// Replaces every float64, float32, float16 and bfloat16 tensor among `items`
// by a view, with the same sizes, strides, offset and requires_grad, of a
// converted copy of the byte span its storage's tensors cover. Integer, bool
// and complex tensors are untouched; so is a storage that tensors view with
// more than one dtype (a float32 tensor and an int32 .view() of it), since no
// single conversion keeps both. Returns one line for the pack's notes, what
// was converted and what was left, or "" when nothing floating was found.
std::string ConvertFloating(const std::vector<ConvertItem>& items, DType to);

}  // namespace tsar::writer
