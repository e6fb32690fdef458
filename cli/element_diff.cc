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

// The fnuz float8 formats (AMD/Graphcore): no infinities, no negative zero;
// 0x80 is the only NaN. Exponent bias 8 for e4m3fnuz, 16 for e5m2fnuz.
double Float8Fnuz(uint8_t b, int mant_bits, int bias) {
  if (b == 0x80) return std::numeric_limits<double>::quiet_NaN();
  const int exp = (b & 0x7f) >> mant_bits, mant = b & ((1 << mant_bits) - 1);
  const double v = exp == 0 ? std::ldexp(mant, 1 - bias - mant_bits)
                            : std::ldexp((1 << mant_bits) + mant, exp - bias - mant_bits);
  return (b & 0x80) ? -v : v;
}

// float8_e8m0fnu (OCP MX block scale): 2^(b - 127), unsigned; 0xff is NaN.
double Float8E8M0(uint8_t b) {
  return b == 0xff ? std::numeric_limits<double>::quiet_NaN() : std::ldexp(1.0, b - 127);
}

// One FP4 E2M1 value (a nibble): bias 1, no infinities or NaN; 0, 0.5, 1, 1.5, 2, 3, 4, 6.
double Float4E2M1(uint8_t nibble) {
  const int exp = (nibble >> 1) & 0x3, mant = nibble & 0x1;
  const double v = exp == 0 ? 0.5 * mant : std::ldexp(2 + mant, exp - 2);
  return (nibble & 0x8) ? -v : v;
}

// The element as (real, imaginary) doubles; imaginary 0 for real dtypes. A
// float4_e2m1fn_x2 element is the pair of FP4 values of its byte (low nibble,
// high nibble), compared as a pair the way complex elements are.
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
    case DType::kFloat8E4M3FNUZ:
      *re = Float8Fnuz(p[0], 3, 8);
      return;
    case DType::kFloat8E5M2FNUZ:
      *re = Float8Fnuz(p[0], 2, 16);
      return;
    case DType::kFloat8E8M0FNU:
      *re = Float8E8M0(p[0]);
      return;
    case DType::kFloat4E2M1FNx2:
      *re = Float4E2M1(p[0] & 0xf);
      *im = Float4E2M1(p[0] >> 4);
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

bool IsInexact(DType dtype) { return IsFloatingOrComplex(dtype); }

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
