// tsar::writer::ConvertFloating (writer/convert_dtype.h).
#include "writer/convert_dtype.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <unordered_map>

#include "format/reader.h"

namespace tsar::writer {
namespace {

uint32_t FloatBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
float BitsFloat(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// float16 -> float32: exact; a NaN is quieted with its payload kept (what
// LibTorch's conversion, a multiplication by a power of two, gives).
float HalfToFloat(uint16_t h) {
  const uint32_t sign = uint32_t{h & 0x8000u} << 16;
  const uint32_t exp = (h >> 10) & 0x1Fu, mant = h & 0x3FFu;
  if (exp == 0x1F) {
    return BitsFloat(sign | 0x7F800000u | (mant << 13) | (mant ? 0x00400000u : 0));
  }
  if (exp != 0) return BitsFloat(sign | ((exp + 112) << 23) | (mant << 13));
  // Subnormal (or zero): mant x 2^-24, exact in float.
  const float v = static_cast<float>(mant) * BitsFloat(0x33800000u);  // 2^-24
  return BitsFloat(sign | FloatBits(v));
}

// float32 -> float16, round to nearest, ties to even; NaN -> sign | 0x7E00.
uint16_t FloatToHalf(float f) {
  const uint32_t x = FloatBits(f);
  const auto sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  const uint32_t a = x & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return sign | 0x7E00u;   // NaN
  if (a >= 0x477FF000u) return sign | 0x7C00u;  // from 65520 (halfway past 65504) up: inf
  if (a >= 0x38800000u) {                       // a normal float16 (>= 2^-14)
    const uint32_t rounded = a + 0xFFFu + ((a >> 13) & 1u);
    return static_cast<uint16_t>(sign | ((rounded - 0x38000000u) >> 13));
  }
  const uint32_t e = a >> 23;
  if (e < 102) return sign;  // below 2^-25: rounds to zero
  // Subnormal float16: m x 2^-24 with m = the significand shifted right.
  const uint32_t mant = (a & 0x7FFFFFu) | 0x800000u, shift = 126 - e;  // 14..24
  uint32_t q = mant >> shift;
  const uint32_t rem = mant & ((1u << shift) - 1), half = 1u << (shift - 1);
  if (rem > half || (rem == half && (q & 1u))) ++q;
  return static_cast<uint16_t>(sign | q);
}

// float32 -> bfloat16, round to nearest, ties to even; NaN -> 0x7FC0.
uint16_t FloatToBFloat(float f) {
  const uint32_t x = FloatBits(f);
  if ((x & 0x7FFFFFFFu) > 0x7F800000u) return 0x7FC0u;
  return static_cast<uint16_t>((x + 0x7FFFu + ((x >> 16) & 1u)) >> 16);
}

template <typename T>
T Load(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}
template <typename T>
void Store(uint8_t* p, T v) {
  std::memcpy(p, &v, sizeof(T));
}

std::string Name(DType t) { return std::string(DTypeName(t)); }

}  // namespace

bool IsConvertibleFloating(DType t) {
  return t == DType::kFloat64 || t == DType::kFloat32 || t == DType::kFloat16 ||
         t == DType::kBFloat16;
}

void ConvertElements(DType from, const uint8_t* src, DType to, uint8_t* dst, uint64_t n) {
  const size_t in = ElementSize(from), out = ElementSize(to);
  for (uint64_t i = 0; i < n; ++i, src += in, dst += out) {
    if (from == DType::kFloat64) {  // to a 16-bit dtype through float32, as LibTorch
      const double d = Load<double>(src);
      if (to == DType::kFloat64) {
        Store(dst, d);
        continue;
      }
      const auto f = static_cast<float>(d);
      if (to == DType::kFloat32) Store(dst, f);
      if (to == DType::kFloat16) Store(dst, FloatToHalf(f));
      if (to == DType::kBFloat16) Store(dst, FloatToBFloat(f));
      continue;
    }
    float f = 0;
    if (from == DType::kFloat32) f = Load<float>(src);
    if (from == DType::kFloat16) f = HalfToFloat(Load<uint16_t>(src));
    if (from == DType::kBFloat16) f = BitsFloat(uint32_t{Load<uint16_t>(src)} << 16);
    if (to == DType::kFloat64) Store(dst, static_cast<double>(f));
    if (to == DType::kFloat32) Store(dst, f);
    if (to == DType::kFloat16) Store(dst, FloatToHalf(f));
    if (to == DType::kBFloat16) Store(dst, FloatToBFloat(f));
  }
}

std::string ConvertFloating(const std::vector<ConvertItem>& items, DType to) {
  // Tensors by storage, storages in order of first use.
  std::unordered_map<const Storage*, size_t> group_of;
  std::vector<std::vector<size_t>> groups;
  for (size_t i = 0; i < items.size(); ++i) {
    auto [it, fresh] = group_of.emplace(items[i].tensor->storage.get(), groups.size());
    if (fresh) groups.emplace_back();
    groups[it->second].push_back(i);
  }
  std::map<std::string, size_t> converted;  // source dtype -> tensors
  size_t storages = 0, already = 0;
  uint64_t before = 0, after = 0;
  std::vector<std::string> mixed;  // floating tensors left as they were
  for (const auto& g : groups) {
    const DType from = items[g[0]].tensor->dtype;
    const bool uniform =
        std::all_of(g.begin(), g.end(), [&](size_t i) { return items[i].tensor->dtype == from; });
    if (!uniform) {
      for (size_t i : g) {
        if (IsConvertibleFloating(items[i].tensor->dtype)) mixed.push_back(*items[i].name);
      }
      continue;
    }
    if (!IsConvertibleFloating(from)) continue;
    if (from == to) {
      already += g.size();
      continue;
    }
    const Storage& source = *items[g[0]].tensor->storage;
    // The elements [lo, hi) of the storage that its non-empty tensors reach.
    const uint64_t in_size = ElementSize(from), out_size = ElementSize(to);
    uint64_t lo = UINT64_MAX, hi = 0;
    for (size_t i : g) {
      const TensorRef& t = *items[i].tensor;
      if (t.numel() == 0) continue;
      uint64_t begin, end;
      t.ByteSpan(&begin, &end);
      lo = std::min(lo, begin / in_size);
      hi = std::max(hi, end / in_size);
    }
    std::shared_ptr<const Storage> span;
    if (hi > 0) {
      const uint64_t n = hi - lo;
      std::vector<uint8_t> fetched, out(n * out_size);  // fetched: a CUDA storage's span
      ConvertElements(from, source.Bytes(lo * in_size, n * in_size, fetched), to, out.data(), n);
      before += n * in_size;
      after += n * out_size;
      auto s = Storage::Owning(std::move(out));
      s->device_type = source.device_type;
      s->device_index = source.device_index;
      span = std::move(s);
    }
    ++storages;
    for (size_t i : g) {
      TensorRef& t = *items[i].tensor;
      if (t.numel() == 0) {  // a storage of its own, as an empty tensor of `to` has
        auto empty = Storage::Owning({});
        empty->device_type = source.device_type;
        empty->device_index = source.device_index;
        t.storage = std::move(empty);
        t.storage_offset = 0;
      } else {
        t.storage = span;
        t.storage_offset -= lo;
      }
      t.dtype = to;
      ++converted[Name(from)];
    }
  }
  if (converted.empty() && mixed.empty()) return "";
  std::string note = "dtype " + Name(to) + ": ";
  size_t n = 0;
  std::string from;
  for (const auto& [dtype, count] : converted) {
    n += count;
    from += (from.empty() ? "from " : ", ") + dtype + ": " + std::to_string(count);
  }
  if (n > 0) {
    note += "converted " + std::to_string(n) + " floating-point tensor" + (n == 1 ? "" : "s") +
            " in " + std::to_string(storages) + " storage" + (storages == 1 ? "" : "s") + " (" +
            from + "), " + format::HumanBytes(before) + " -> " + format::HumanBytes(after);
  } else {
    note += "converted no tensor";
  }
  if (already > 0) note += "; " + std::to_string(already) + " already " + Name(to);
  if (!mixed.empty()) {
    note += "; kept as they were, since their storage is also viewed with another dtype: ";
    for (size_t i = 0; i < mixed.size() && i < 5; ++i) note += (i ? ", " : "") + mixed[i];
    if (mixed.size() > 5) note += " and " + std::to_string(mixed.size() - 5) + " more";
  }
  return note;
}

}  // namespace tsar::writer
