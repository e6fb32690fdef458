// Maps tsar dtype codes (spec §5) to and from LibTorch's c10::ScalarType.
#pragma once

#include <c10/core/ScalarType.h>

#include <optional>
#include <string>

#include "tsar/dtype.h"

namespace tsar {

// nullopt when this LibTorch lacks the dtype.
std::optional<c10::ScalarType> MaybeScalarType(DType dtype);
[[noreturn]] void ThrowUnsupportedDType(DType dtype, const std::string& what);
// Throws kUnsupported when this LibTorch lacks the dtype (float8 and
// uint16/32/64 need LibTorch 2.1 / 2.3), naming what(): a callable, so the
// text is made only for the error (a quoted name per tensor was a tenth of
// state_dict() over 100,000 tensors).
template <typename What>
c10::ScalarType ToScalarType(DType dtype, const What& what) {
  if (const auto type = MaybeScalarType(dtype)) return *type;
  ThrowUnsupportedDType(dtype, what());
}
std::optional<DType> FromScalarType(c10::ScalarType type);

}  // namespace tsar
