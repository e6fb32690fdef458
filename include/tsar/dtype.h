// Element types of tensors in a tsar archive: the on-disk dtype codes of
// spec/FORMAT.md section 5 and their PyTorch names. No LibTorch here.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace tsar {

// On-disk dtype codes (spec/FORMAT.md section 5). Values are pinned; a new
// dtype takes the next free code and bumps the format's minor version.
enum class DType : uint16_t {
  kBool = 1,
  kUInt8 = 2,
  kInt8 = 3,
  kInt16 = 4,
  kInt32 = 5,
  kInt64 = 6,
  kFloat16 = 7,
  kBFloat16 = 8,
  kFloat32 = 9,
  kFloat64 = 10,
  kComplex32 = 11,  // torch.complex32 / torch.chalf
  kComplex64 = 12,
  kComplex128 = 13,
  kFloat8E5M2 = 14,  // torch.float8_e5m2 (LibTorch >= 2.1)
  kFloat8E4M3FN = 15,
  kUInt16 = 16,  // LibTorch >= 2.3
  kUInt32 = 17,
  kUInt64 = 18,
  // Format 1.3 (an archive using one of these is written as minor 3).
  kFloat8E4M3FNUZ = 19,  // torch.float8_e4m3fnuz (LibTorch >= 2.2)
  kFloat8E5M2FNUZ = 20,  // torch.float8_e5m2fnuz (LibTorch >= 2.2)
  kFloat8E8M0FNU = 21,   // torch.float8_e8m0fnu, MX block scales (LibTorch >= 2.7)
  kFloat4E2M1FNx2 = 22,  // torch.float4_e2m1fn_x2: two FP4 values per byte (LibTorch >= 2.8)
};

// Every code this version knows, in code order.
inline constexpr DType kAllDTypes[] = {
    DType::kBool,          DType::kUInt8,           DType::kInt8,           DType::kInt16,
    DType::kInt32,         DType::kInt64,           DType::kFloat16,        DType::kBFloat16,
    DType::kFloat32,       DType::kFloat64,         DType::kComplex32,      DType::kComplex64,
    DType::kComplex128,    DType::kFloat8E5M2,      DType::kFloat8E4M3FN,   DType::kUInt16,
    DType::kUInt32,        DType::kUInt64,          DType::kFloat8E4M3FNUZ, DType::kFloat8E5M2FNUZ,
    DType::kFloat8E8M0FNU, DType::kFloat4E2M1FNx2};

// The dtype with on-disk code `code`, or nullopt for an unknown code.
std::optional<DType> DTypeFromCode(uint16_t code) noexcept;

// Bytes per element: 1, 2, 4, 8 or 16.
size_t ElementSize(DType dtype) noexcept;

// PyTorch's name without the "torch." prefix: "float32", "bfloat16", "bool"...
std::string_view DTypeName(DType dtype) noexcept;

// Floating-point or complex (c10's isFloatingType || isComplexType): the
// dtypes that may require grad (spec R77).
bool IsFloatingOrComplex(DType dtype) noexcept;

// The lowest format minor version that defines `dtype` (spec section 5.1):
// 0 for codes 1-18, 3 for codes 19-22.
uint16_t MinorForDType(DType dtype) noexcept;

// Inverse of DTypeName; also accepts PyTorch's aliases ("float", "half",
// "double", "long", "int", "short", "cfloat", "cdouble", "chalf").
std::optional<DType> DTypeFromName(std::string_view name) noexcept;

}  // namespace tsar
