// PackOptions::dtype: floating-point tensors stored as another floating
// dtype (float16, bfloat16, float32), one storage at a time so that tensors
// which share a storage (views, tied weights) still share the converted one.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>
#include <vector>

namespace tsar::writer {

struct ConvertItem {
  const std::string* name;  // for the note
  at::Tensor* tensor;       // replaced by its converted view
};

// True for the dtypes PackOptions::dtype converts from and to.
bool IsConvertibleFloating(at::ScalarType t);

// Replaces every float64, float32, float16 and bfloat16 tensor among `items`
// by a view, with the same sizes, strides, offset and requires_grad, of a
// converted copy of the byte span its storage's tensors cover. Integer, bool
// and complex tensors are untouched; so is a storage that tensors view with
// more than one dtype (a float32 tensor and an int32 .view() of it), since no
// single conversion keeps both. Returns one line for the pack's notes, what
// was converted and what was left, or "" when nothing floating was found.
std::string ConvertFloating(const std::vector<ConvertItem>& items, at::ScalarType to);

}  // namespace tsar::writer
