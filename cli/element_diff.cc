// Element decoding and comparison of `tsar diff` (cli/element_diff.h).
#include "cli/element_diff.h"

#include <cmath>
#include <cstring>
#include <limits>

namespace tsar::cli {
namespace {

template <class T>
T Load(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// IEEE binary16 to double.
double Half(uint16_t h) {
  const int sign = h >> 15, exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
  double v;
  if (exp == 0) {
    v = std::ldexp(mant, -24);
  } else if (exp == 31) {
    v = mant ? std::numeric_limits<double>::quiet_NaN() : std::numeric_limits<double>::infinity();
  } else {
    v = std::ldexp(1024 + mant, exp - 25);
  }
  return sign ? -v : v;
}

double BFloat16(uint16_t b) {
  const uint32_t bits = static_cast<uint32_t>(b) << 16;
  return Load<float>(reinterpret_cast<const uint8_t*>(&bits));
}

// float8_e4m3fn: bias 7, no infinities, NaN when every exponent and mantissa bit is set.
double Float8E4M3(uint8_t b) {
  const int sign = b >> 7, exp = (b >> 3) & 0xf, mant = b & 0x7;
  double v;
  if (exp == 15 && mant == 7) {
    v = std::numeric_limits<double>::quiet_NaN();
  } else if (exp == 0) {
    v = std::ldexp(mant, -9);
  } else {
    v = std::ldexp(8 + mant, exp - 10);
  }
  return sign ? -v : v;
}

// The element as (real, imaginary) doubles; imaginary 0 for real dtypes.
void Decode(DType dtype, const uint8_t* p, double* re, double* im) {
  *im = 0;
  switch (dtype) {
    case DType::kFloat16:
      *re = Half(Load<uint16_t>(p));
      return;
    case DType::kBFloat16:
      *re = BFloat16(Load<uint16_t>(p));
      return;
    case DType::kFloat32:
      *re = Load<float>(p);
      return;
    case DType::kFloat64:
      *re = Load<double>(p);
      return;
    case DType::kComplex32:
      *re = Half(Load<uint16_t>(p));
      *im = Half(Load<uint16_t>(p + 2));
      return;
    case DType::kComplex64:
      *re = Load<float>(p);
      *im = Load<float>(p + 4);
      return;
    case DType::kComplex128:
      *re = Load<double>(p);
      *im = Load<double>(p + 8);
      return;
    case DType::kFloat8E5M2:
      *re = Half(static_cast<uint16_t>(p[0] << 8));
      return;
    case DType::kFloat8E4M3FN:
      *re = Float8E4M3(p[0]);
      return;
    default:
      *re = 0;
      return;
  }
}

// Integers as a signed 128-bit value (uint64 fits).
__int128 Integer(DType dtype, const uint8_t* p) {
  switch (dtype) {
    case DType::kBool:
    case DType::kUInt8:
      return p[0];
    case DType::kInt8:
      return Load<int8_t>(p);
    case DType::kInt16:
      return Load<int16_t>(p);
    case DType::kUInt16:
      return Load<uint16_t>(p);
    case DType::kInt32:
      return Load<int32_t>(p);
    case DType::kUInt32:
      return Load<uint32_t>(p);
    case DType::kInt64:
      return Load<int64_t>(p);
    case DType::kUInt64:
      return Load<uint64_t>(p);
    default:
      return 0;
  }
}

}  // namespace

bool IsInexact(DType dtype) {
  switch (dtype) {
    case DType::kFloat16:
    case DType::kBFloat16:
    case DType::kFloat32:
    case DType::kFloat64:
    case DType::kComplex32:
    case DType::kComplex64:
    case DType::kComplex128:
    case DType::kFloat8E5M2:
    case DType::kFloat8E4M3FN:
      return true;
    default:
      return false;
  }
}

bool ElementsDiffer(DType dtype, const uint8_t* a, const uint8_t* b, const Tolerance& tol,
                    double* abs_diff) {
  if (!IsInexact(dtype)) {
    const __int128 d = Integer(dtype, a) - Integer(dtype, b);
    *abs_diff = static_cast<double>(d < 0 ? -d : d);
    return d != 0;
  }
  double ar, ai, br, bi;
  Decode(dtype, a, &ar, &ai);
  Decode(dtype, b, &br, &bi);
  const bool nan_a = std::isnan(ar) || std::isnan(ai), nan_b = std::isnan(br) || std::isnan(bi);
  if (nan_a || nan_b) {
    *abs_diff = nan_a && nan_b ? 0 : std::numeric_limits<double>::quiet_NaN();
    if (tol.exact()) return std::memcmp(a, b, ElementSize(dtype)) != 0;
    return !(nan_a && nan_b);
  }
  if (ar == br && ai == bi) {  // equal values, infinities included
    *abs_diff = 0;
    return tol.exact() && std::memcmp(a, b, ElementSize(dtype)) != 0;  // 0.0 and -0.0
  }
  *abs_diff = std::hypot(ar - br, ai - bi);
  if (tol.exact()) return true;
  return !(*abs_diff <= tol.atol + tol.rtol * std::hypot(br, bi));
}

}  // namespace tsar::cli
