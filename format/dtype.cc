// The dtype table of spec/FORMAT.md section 5: codes, element sizes, names.
#include "tsar/dtype.h"

#include "format/spec.h"

namespace tsar {
namespace {

struct DTypeInfo {
  DType dtype;
  size_t size;
  std::string_view name;
};

// Indexed by code - 1; codes are dense from 1 (spec section 5).
constexpr DTypeInfo kTable[] = {
    {DType::kBool, 1, "bool"},
    {DType::kUInt8, 1, "uint8"},
    {DType::kInt8, 1, "int8"},
    {DType::kInt16, 2, "int16"},
    {DType::kInt32, 4, "int32"},
    {DType::kInt64, 8, "int64"},
    {DType::kFloat16, 2, "float16"},
    {DType::kBFloat16, 2, "bfloat16"},
    {DType::kFloat32, 4, "float32"},
    {DType::kFloat64, 8, "float64"},
    {DType::kComplex32, 4, "complex32"},
    {DType::kComplex64, 8, "complex64"},
    {DType::kComplex128, 16, "complex128"},
    {DType::kFloat8E5M2, 1, "float8_e5m2"},
    {DType::kFloat8E4M3FN, 1, "float8_e4m3fn"},
    {DType::kUInt16, 2, "uint16"},
    {DType::kUInt32, 4, "uint32"},
    {DType::kUInt64, 8, "uint64"},
    {DType::kFloat8E4M3FNUZ, 1, "float8_e4m3fnuz"},
    {DType::kFloat8E5M2FNUZ, 1, "float8_e5m2fnuz"},
    {DType::kFloat8E8M0FNU, 1, "float8_e8m0fnu"},
    {DType::kFloat4E2M1FNx2, 1, "float4_e2m1fn_x2"},
};
constexpr size_t kCount = sizeof(kTable) / sizeof(kTable[0]);

struct Alias {
  std::string_view name;
  DType dtype;
};
constexpr Alias kAliases[] = {
    {"float", DType::kFloat32},    {"half", DType::kFloat16},       {"double", DType::kFloat64},
    {"long", DType::kInt64},       {"int", DType::kInt32},          {"short", DType::kInt16},
    {"cfloat", DType::kComplex64}, {"cdouble", DType::kComplex128}, {"chalf", DType::kComplex32},
};

}  // namespace

std::optional<DType> DTypeFromCode(uint16_t code) noexcept {
  if (code == 0 || code > kCount) return std::nullopt;
  return kTable[code - 1].dtype;
}

size_t ElementSize(DType dtype) noexcept {
  const auto code = static_cast<uint16_t>(dtype);
  return code >= 1 && code <= kCount ? kTable[code - 1].size : 0;
}

std::string_view DTypeName(DType dtype) noexcept {
  const auto code = static_cast<uint16_t>(dtype);
  return code >= 1 && code <= kCount ? kTable[code - 1].name : "unknown";
}

bool IsFloatingOrComplex(DType dtype) noexcept {
  return format::DTypeCodeMayRequireGrad(static_cast<uint16_t>(dtype));
}

uint16_t MinorForDType(DType dtype) noexcept {
  return static_cast<uint16_t>(dtype) >= format::kFirstMinor3DTypeCode ? 3 : 0;
}

std::optional<DType> DTypeFromName(std::string_view name) noexcept {
  if (name.substr(0, 6) == "torch.") name.remove_prefix(6);
  for (const auto& info : kTable) {
    if (info.name == name) return info.dtype;
  }
  for (const auto& alias : kAliases) {
    if (alias.name == name) return alias.dtype;
  }
  return std::nullopt;
}

}  // namespace tsar
