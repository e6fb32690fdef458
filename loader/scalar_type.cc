// dtype mapping between spec §5 codes and c10::ScalarType, per LibTorch version.
#include "loader/scalar_type.h"

#include <torch/version.h>

#include "tsar/error.h"

#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 1)
#define TSAR_HAVE_FLOAT8 1
#endif
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 2)
#define TSAR_HAVE_FLOAT8_FNUZ 1
#endif
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 3)
#define TSAR_HAVE_UINT_WIDE 1
#endif
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 7)
#define TSAR_HAVE_FLOAT8_E8M0 1
#endif
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 8)
#define TSAR_HAVE_FLOAT4 1
#endif

namespace tsar {

std::optional<c10::ScalarType> MaybeScalarType(DType dtype) {
  switch (dtype) {
    case DType::kBool:
      return c10::ScalarType::Bool;
    case DType::kUInt8:
      return c10::ScalarType::Byte;
    case DType::kInt8:
      return c10::ScalarType::Char;
    case DType::kInt16:
      return c10::ScalarType::Short;
    case DType::kInt32:
      return c10::ScalarType::Int;
    case DType::kInt64:
      return c10::ScalarType::Long;
    case DType::kFloat16:
      return c10::ScalarType::Half;
    case DType::kBFloat16:
      return c10::ScalarType::BFloat16;
    case DType::kFloat32:
      return c10::ScalarType::Float;
    case DType::kFloat64:
      return c10::ScalarType::Double;
    case DType::kComplex32:
      return c10::ScalarType::ComplexHalf;
    case DType::kComplex64:
      return c10::ScalarType::ComplexFloat;
    case DType::kComplex128:
      return c10::ScalarType::ComplexDouble;
#ifdef TSAR_HAVE_FLOAT8
    case DType::kFloat8E5M2:
      return c10::ScalarType::Float8_e5m2;
    case DType::kFloat8E4M3FN:
      return c10::ScalarType::Float8_e4m3fn;
#endif
#ifdef TSAR_HAVE_UINT_WIDE
    case DType::kUInt16:
      return c10::ScalarType::UInt16;
    case DType::kUInt32:
      return c10::ScalarType::UInt32;
    case DType::kUInt64:
      return c10::ScalarType::UInt64;
#endif
#ifdef TSAR_HAVE_FLOAT8_FNUZ
    case DType::kFloat8E4M3FNUZ:
      return c10::ScalarType::Float8_e4m3fnuz;
    case DType::kFloat8E5M2FNUZ:
      return c10::ScalarType::Float8_e5m2fnuz;
#endif
#ifdef TSAR_HAVE_FLOAT8_E8M0
    case DType::kFloat8E8M0FNU:
      return c10::ScalarType::Float8_e8m0fnu;
#endif
#ifdef TSAR_HAVE_FLOAT4
    case DType::kFloat4E2M1FNx2:
      return c10::ScalarType::Float4_e2m1fn_x2;
#endif
    default:
      break;
  }
  return std::nullopt;
}

void ThrowUnsupportedDType(DType dtype, const std::string& what) {
  throw Error(ErrorCode::kUnsupported, "", std::nullopt,
              what + ": dtype " + std::string(DTypeName(dtype)) +
                  " is not supported by this LibTorch (" TORCH_VERSION ")");
}

std::optional<DType> FromScalarType(c10::ScalarType type) {
  switch (type) {
    case c10::ScalarType::Bool:
      return DType::kBool;
    case c10::ScalarType::Byte:
      return DType::kUInt8;
    case c10::ScalarType::Char:
      return DType::kInt8;
    case c10::ScalarType::Short:
      return DType::kInt16;
    case c10::ScalarType::Int:
      return DType::kInt32;
    case c10::ScalarType::Long:
      return DType::kInt64;
    case c10::ScalarType::Half:
      return DType::kFloat16;
    case c10::ScalarType::BFloat16:
      return DType::kBFloat16;
    case c10::ScalarType::Float:
      return DType::kFloat32;
    case c10::ScalarType::Double:
      return DType::kFloat64;
    case c10::ScalarType::ComplexHalf:
      return DType::kComplex32;
    case c10::ScalarType::ComplexFloat:
      return DType::kComplex64;
    case c10::ScalarType::ComplexDouble:
      return DType::kComplex128;
#ifdef TSAR_HAVE_FLOAT8
    case c10::ScalarType::Float8_e5m2:
      return DType::kFloat8E5M2;
    case c10::ScalarType::Float8_e4m3fn:
      return DType::kFloat8E4M3FN;
#endif
#ifdef TSAR_HAVE_UINT_WIDE
    case c10::ScalarType::UInt16:
      return DType::kUInt16;
    case c10::ScalarType::UInt32:
      return DType::kUInt32;
    case c10::ScalarType::UInt64:
      return DType::kUInt64;
#endif
#ifdef TSAR_HAVE_FLOAT8_FNUZ
    case c10::ScalarType::Float8_e4m3fnuz:
      return DType::kFloat8E4M3FNUZ;
    case c10::ScalarType::Float8_e5m2fnuz:
      return DType::kFloat8E5M2FNUZ;
#endif
#ifdef TSAR_HAVE_FLOAT8_E8M0
    case c10::ScalarType::Float8_e8m0fnu:
      return DType::kFloat8E8M0FNU;
#endif
#ifdef TSAR_HAVE_FLOAT4
    case c10::ScalarType::Float4_e2m1fn_x2:
      return DType::kFloat4E2M1FNx2;
#endif
    default:
      return std::nullopt;
  }
}

}  // namespace tsar
