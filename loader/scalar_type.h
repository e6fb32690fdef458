// Maps tsar dtype codes (spec §5) to and from LibTorch's c10::ScalarType.
#pragma once

#include <c10/core/ScalarType.h>

#include <optional>
#include <string>

#include "tsar/dtype.h"

namespace tsar {

// nullopt when this LibTorch lacks the dtype.
std::optional<c10::ScalarType> MaybeScalarType(DType dtype);
// Throws kUnsupported when this LibTorch lacks the dtype (float8 and
// uint16/32/64 need LibTorch 2.1 / 2.3), naming `what`.
c10::ScalarType ToScalarType(DType dtype, const std::string& what);
std::optional<DType> FromScalarType(c10::ScalarType type);

}  // namespace tsar
