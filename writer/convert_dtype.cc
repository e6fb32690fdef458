// tsar::writer::ConvertFloating (writer/convert_dtype.h).
#include "writer/convert_dtype.h"

#include <ATen/ops/as_strided.h>
#include <ATen/ops/empty_strided.h>
#include <ATen/ops/to.h>
#include <c10/core/GradMode.h>
#include <c10/core/Storage.h>

#include <algorithm>
#include <map>
#include <unordered_map>

#include "format/reader.h"
#include "loader/scalar_type.h"

namespace tsar::writer {
namespace {

std::string Name(at::ScalarType t) { return std::string(DTypeName(*FromScalarType(t))); }

// `t` as a fresh leaf with `like`'s requires_grad.
at::Tensor WithGrad(at::Tensor t, const at::Tensor& like) {
  t = t.detach();
  if (like.requires_grad()) t.requires_grad_(true);
  return t;
}

}  // namespace

bool IsConvertibleFloating(at::ScalarType t) {
  return t == at::kDouble || t == at::kFloat || t == at::kHalf || t == at::kBFloat16;
}

std::string ConvertFloating(const std::vector<ConvertItem>& items, at::ScalarType to) {
  c10::NoGradGuard no_grad;
  // Tensors by storage, storages in order of first use.
  std::unordered_map<const c10::StorageImpl*, size_t> group_of;
  std::vector<std::vector<size_t>> groups;
  for (size_t i = 0; i < items.size(); ++i) {
    const auto* key = items[i].tensor->storage().unsafeGetStorageImpl();
    auto [it, fresh] = group_of.emplace(key, groups.size());
    if (fresh) groups.emplace_back();
    groups[it->second].push_back(i);
  }
  std::map<std::string, size_t> converted;  // source dtype -> tensors
  size_t storages = 0, already = 0;
  uint64_t before = 0, after = 0;
  std::vector<std::string> mixed;  // floating tensors left as they were
  for (const auto& g : groups) {
    const at::ScalarType from = items[g[0]].tensor->scalar_type();
    const bool uniform = std::all_of(
        g.begin(), g.end(), [&](size_t i) { return items[i].tensor->scalar_type() == from; });
    if (!uniform) {
      for (size_t i : g) {
        if (IsConvertibleFloating(items[i].tensor->scalar_type())) mixed.push_back(*items[i].name);
      }
      continue;
    }
    if (!IsConvertibleFloating(from)) continue;
    if (from == to) {
      already += g.size();
      continue;
    }
    // The elements [lo, hi) of the storage that its non-empty tensors reach.
    int64_t lo = INT64_MAX, hi = 0;
    for (size_t i : g) {
      const at::Tensor& t = *items[i].tensor;
      if (t.numel() == 0) continue;
      int64_t last = t.storage_offset();
      for (int64_t d = 0; d < t.dim(); ++d) last += (t.size(d) - 1) * t.stride(d);
      lo = std::min(lo, t.storage_offset());
      hi = std::max(hi, last + 1);
    }
    at::Tensor span;
    if (hi > 0) {
      span = at::as_strided(*items[g[0]].tensor, {hi - lo}, {1}, lo).to(to);
      before += static_cast<uint64_t>(hi - lo) * c10::elementSize(from);
      after += static_cast<uint64_t>(span.nbytes());
    }
    ++storages;
    for (size_t i : g) {
      at::Tensor& t = *items[i].tensor;
      at::Tensor view = t.numel() == 0
                            ? at::empty_strided(t.sizes(), t.strides(), t.options().dtype(to))
                            : at::as_strided(span, t.sizes(), t.strides(), t.storage_offset() - lo);
      t = WithGrad(std::move(view), t);
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
