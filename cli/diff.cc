// `tsar diff A B [--json]`: which entries, tensors and metadata keys two archives
// do not share, compared by value (names, dtypes, shapes, bytes), not by layout.
#include <cmath>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <sstream>

#include "cli/commands.h"
#include "cli/common.h"
#include "cli/describe.h"
#include "cli/element_diff.h"
#include "tsar/archive_file.h"

namespace tsar::cli {
namespace {

using Json = nlohmann::ordered_json;

// Equal types and equal bytes: a float NaN equals itself, 0.0 and -0.0 differ.
bool SameValue(const MetadataValue& a, const MetadataValue& b) {
  if (a.index() != b.index()) return false;
  if (const auto* d = std::get_if<double>(&a)) {
    const double e = std::get<double>(b);
    return std::memcmp(d, &e, sizeof e) == 0;
  }
  return a == b;
}

uint64_t SatMul(uint64_t a, uint64_t b) {
  uint64_t r;
  return __builtin_mul_overflow(a, b, &r) ? UINT64_MAX : r;
}

// A pair of same-shaped tensors reduced to the dimensions that matter for a
// value comparison: size-1 dimensions and dimensions both tensors repeat
// (stride 0 in both) are dropped, and neighbours that are contiguous in both
// are merged, so two dense tensors become a single memcmp whatever their
// shape. Strides are in bytes.
struct Dim {
  uint64_t size;
  uint64_t stride_a, stride_b;
};
struct Plan {
  const uint8_t* a;
  const uint8_t* b;
  size_t element_size;
  std::vector<Dim> dims;  // outermost first; empty = one element
  uint64_t work;          // bytes compared, for the progress bar
  bool empty;
  uint64_t repeat;  // logical elements per element of `dims` (the dropped stride-0 dimensions)
};

Plan MakePlan(const uint8_t* a, const TensorInfo& ta, const uint8_t* b, const TensorInfo& tb,
              size_t e) {
  Plan p{a, b, e, {}, 0, false, 1};
  for (int64_t s : ta.sizes) p.empty |= s == 0;
  if (p.empty) return p;
  // Valid archives bound every used extent by the storage (spec R50), so
  // byte strides of dimensions with size > 1 cannot overflow.
  for (size_t d = 0; d < ta.sizes.size(); ++d) {
    if (ta.sizes[d] == 1) continue;
    if (ta.strides[d] == 0 && tb.strides[d] == 0) {
      p.repeat = SatMul(p.repeat, static_cast<uint64_t>(ta.sizes[d]));
      continue;
    }
    const Dim cur{static_cast<uint64_t>(ta.sizes[d]), static_cast<uint64_t>(ta.strides[d]) * e,
                  static_cast<uint64_t>(tb.strides[d]) * e};
    if (!p.dims.empty()) {
      Dim& prev = p.dims.back();
      if (prev.stride_a == cur.size * cur.stride_a && prev.stride_b == cur.size * cur.stride_b) {
        prev = {prev.size * cur.size, cur.stride_a, cur.stride_b};
        continue;
      }
    }
    p.dims.push_back(cur);
  }
  p.work = e;
  for (const Dim& d : p.dims) p.work = SatMul(p.work, d.size);
  return p;
}

template <size_t E>
bool EqualStrided(const uint8_t* a, uint64_t sa, const uint8_t* b, uint64_t sb, uint64_t n) {
  for (uint64_t i = 0; i < n; ++i, a += sa, b += sb) {
    if (std::memcmp(a, b, E) != 0) return false;
  }
  return true;
}

bool EqualRun(const uint8_t* a, uint64_t sa, const uint8_t* b, uint64_t sb, uint64_t n, size_t e) {
  switch (e) {
    case 1:
      return EqualStrided<1>(a, sa, b, sb, n);
    case 2:
      return EqualStrided<2>(a, sa, b, sb, n);
    case 4:
      return EqualStrided<4>(a, sa, b, sb, n);
    case 8:
      return EqualStrided<8>(a, sa, b, sb, n);
    default:
      return EqualStrided<16>(a, sa, b, sb, n);
  }
}

// Rows [r0, r0 + nr) of the two innermost dimensions, compared in square
// tiles: when one tensor is a transpose of the other, a tile's rows and
// columns stay in cache for both, where a row-by-row walk would take a cache
// miss per element in one of them.
bool EqualTiles(const uint8_t* a, const uint8_t* b, const Dim& rows, const Dim& cols, uint64_t r0,
                uint64_t nr, size_t e) {
  constexpr uint64_t kTile = 64;
  for (uint64_t c0 = 0; c0 < cols.size; c0 += kTile) {
    const uint64_t nc = std::min(kTile, cols.size - c0);
    for (uint64_t r = r0; r < r0 + nr; ++r) {
      if (!EqualRun(a + r * rows.stride_a + c0 * cols.stride_a, cols.stride_a,
                    b + r * rows.stride_b + c0 * cols.stride_b, cols.stride_b, nc, e)) {
        return false;
      }
    }
  }
  return true;
}

// Compares in logical (row-major) order straight from both mappings: no
// copy, and the comparison stops at the first differing element.
bool SameBytes(const Plan& p, Progress& progress, uint64_t& done) {
  if (p.empty) return true;
  if (p.dims.empty()) return std::memcmp(p.a, p.b, p.element_size) == 0;
  const size_t e = p.element_size;
  const Dim& inner = p.dims.back();
  const bool dense = inner.stride_a == e && inner.stride_b == e;
  const bool tiled = !dense && p.dims.size() >= 2;
  const size_t outer = p.dims.size() - (tiled ? 2 : 1);
  std::vector<uint64_t> idx(outer, 0);
  uint64_t off_a = 0, off_b = 0;
  constexpr uint64_t kChunk = 16u << 20;
  for (;;) {
    const uint8_t* a = p.a + off_a;
    const uint8_t* b = p.b + off_b;
    if (dense) {
      const uint64_t n = inner.size * e;
      for (uint64_t o = 0; o < n; o += kChunk) {
        const uint64_t len = std::min(kChunk, n - o);
        if (std::memcmp(a + o, b + o, len) != 0) return false;
        progress.Update(done += len);
      }
    } else if (tiled) {
      const Dim& rows = p.dims[outer];
      const uint64_t band = std::max<uint64_t>(64, kChunk / e / inner.size / 64 * 64);
      for (uint64_t r0 = 0; r0 < rows.size; r0 += band) {
        const uint64_t nr = std::min(band, rows.size - r0);
        if (!EqualTiles(a, b, rows, inner, r0, nr, e)) return false;
        progress.Update(done += nr * inner.size * e);
      }
    } else {
      if (!EqualRun(a, inner.stride_a, b, inner.stride_b, inner.size, e)) return false;
      progress.Update(done += inner.size * e);
    }
    size_t d = outer;
    while (d > 0) {
      --d;
      off_a += p.dims[d].stride_a;
      off_b += p.dims[d].stride_b;
      if (++idx[d] < p.dims[d].size) break;
      off_a -= p.dims[d].stride_a * p.dims[d].size;
      off_b -= p.dims[d].stride_b * p.dims[d].size;
      idx[d] = 0;
      if (d == 0) return true;
    }
    if (outer == 0) return true;
  }
}

// Elements that differ between the two tensors of a plan (every element is
// visited; called once their bytes are known to differ).
struct Difference {
  uint64_t differing = 0, elements = 0;  // logical elements, saturating
  double max_abs = 0;                    // NaN when a NaN faced a number
};

Difference CountDifferences(const Plan& p, DType dtype, const Tolerance& tol) {
  Difference d;
  if (p.empty) return d;
  uint64_t unique = 0;  // elements of `dims`
  auto visit = [&](const uint8_t* a, const uint8_t* b) {
    double abs_diff = 0;
    ++unique;
    if (ElementsDiffer(dtype, a, b, tol, &abs_diff)) ++d.differing;
    if (!std::isnan(d.max_abs) && !(abs_diff <= d.max_abs)) d.max_abs = abs_diff;  // NaN sticks
  };
  std::vector<uint64_t> idx(p.dims.size(), 0);
  uint64_t off_a = 0, off_b = 0;
  for (bool more = true; more;) {
    visit(p.a + off_a, p.b + off_b);
    more = false;
    for (size_t k = p.dims.size(); k-- > 0;) {  // the next index, innermost first
      off_a += p.dims[k].stride_a;
      off_b += p.dims[k].stride_b;
      if (++idx[k] < p.dims[k].size) {
        more = true;
        break;
      }
      off_a -= p.dims[k].stride_a * p.dims[k].size;
      off_b -= p.dims[k].stride_b * p.dims[k].size;
      idx[k] = 0;
    }
  }
  d.differing = SatMul(d.differing, p.repeat);
  d.elements = SatMul(unique, p.repeat);
  return d;
}

// "1e-05", "0.25", "2.5": six significant digits for people (--json has
// the exact double).
std::string Number(double v) {
  if (std::isnan(v)) return "nan";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}

std::string Count(size_t n, const char* one, const char* many) {
  return std::to_string(n) + " " + (n == 1 ? one : many);
}

// Where a tensor's element [0, ..., 0] lies in this process.
const uint8_t* Origin(const ArchiveFile& a, const TensorInfo& t) {
  return static_cast<const uint8_t*>(a.storage_values(t.storage)) +
         t.storage_offset * ElementSize(t.dtype);
}

struct MetaDiff {
  std::string entry;  // "" = archive-level
  std::string key;
  std::optional<MetadataValue> from, to;
};

struct Changed {
  std::string name;
  std::vector<std::string> what;
  std::optional<Difference> values;  // when the values were compared and differ
};

struct DiffOptions {
  bool values_only = false;  // ignore roles, requires_grad and metadata
  Tolerance tolerance;
};

struct Report {
  std::vector<std::string> added_entries, removed_entries;
  std::vector<const TensorInfo*> added, removed;
  std::vector<Changed> changed;
  std::vector<MetaDiff> metadata;
  size_t tensors = 0, entries = 0, keys = 0;  // in A, for the summary of an equal pair
  bool equal() const {
    return added_entries.empty() && removed_entries.empty() && added.empty() && removed.empty() &&
           changed.empty() && metadata.empty();
  }
};

// Metadata of one scope (entry "" = archive-level); an entry that one side
// lacks has no keys there.
void DiffMetadata(const ArchiveFile& a, const ArchiveFile& b, const std::string& entry, bool in_a,
                  bool in_b, Report& r) {
  using Items = std::vector<std::pair<std::string, MetadataValue>>;
  const Items ma = in_a ? a.metadata_items(entry) : Items{};
  const Items mb = in_b ? b.metadata_items(entry) : Items{};
  std::map<std::string, const MetadataValue*> va, vb;
  for (const auto& [k, v] : ma) va[k] = &v;
  for (const auto& [k, v] : mb) vb[k] = &v;
  for (const auto& [k, v] : ma) {
    const auto it = vb.find(k);
    if (it == vb.end()) {
      r.metadata.push_back({entry, k, v, std::nullopt});
    } else if (!SameValue(v, *it->second)) {
      r.metadata.push_back({entry, k, v, *it->second});
    }
  }
  for (const auto& [k, v] : mb) {
    if (!va.count(k)) r.metadata.push_back({entry, k, std::nullopt, v});
  }
  r.keys += ma.size();
}

Report Compare(const ArchiveFile& a, const ArchiveFile& b, bool show_progress,
               const std::vector<TensorInfo>& ia, const std::vector<TensorInfo>& ib,
               const DiffOptions& options) {
  Report r;
  const auto ea = a.entries(), eb = b.entries();
  const std::set<std::string> has_a(ea.begin(), ea.end()), has_b(eb.begin(), eb.end());
  for (const auto& e : ea) {
    if (!has_b.count(e)) r.removed_entries.push_back(e);
  }
  for (const auto& e : eb) {
    if (!has_a.count(e)) r.added_entries.push_back(e);
  }
  r.entries = ea.size();
  r.tensors = ia.size();

  std::map<std::pair<std::string, std::string>, const TensorInfo*> by_name_b, by_name_a;
  for (const auto& t : ib) by_name_b[{t.entry, t.name}] = &t;
  for (const auto& t : ia) by_name_a[{t.entry, t.name}] = &t;
  // Tensors in both, with what differs so far; plans for those whose bytes
  // are still to compare (index into `pending`).
  std::vector<std::pair<const TensorInfo*, std::vector<std::string>>> pending;
  std::vector<std::pair<size_t, Plan>> plans;
  for (const auto& t : ia) {
    const auto it = by_name_b.find({t.entry, t.name});
    if (it == by_name_b.end()) {
      r.removed.push_back(&t);
      continue;
    }
    const TensorInfo& u = *it->second;
    std::vector<std::string> what;
    if (t.dtype != u.dtype) {
      what.push_back("dtype " + std::string(DTypeName(t.dtype)) + " -> " +
                     std::string(DTypeName(u.dtype)));
    }
    if (t.sizes != u.sizes) what.push_back("shape " + Dims(t.sizes) + " -> " + Dims(u.sizes));
    if (t.role != u.role && !options.values_only)
      what.push_back(std::string("role ") + RoleName(t.role) + " -> " + RoleName(u.role));
    if (t.requires_grad != u.requires_grad && !options.values_only) {
      what.push_back(std::string("requires_grad ") + (t.requires_grad ? "true" : "false") + " -> " +
                     (u.requires_grad ? "true" : "false"));
    }
    if (t.dtype == u.dtype && t.sizes == u.sizes) {
      plans.emplace_back(pending.size(),
                         MakePlan(Origin(a, t), t, Origin(b, u), u, ElementSize(t.dtype)));
    }
    pending.emplace_back(&t, std::move(what));
  }
  for (const auto& t : ib) {
    if (!by_name_a.count({t.entry, t.name})) r.added.push_back(&t);
  }

  uint64_t total = 0, done = 0;
  for (const auto& [i, p] : plans) total = std::min(UINT64_MAX - p.work, total) + p.work;
  Progress progress("comparing", total, show_progress);
  std::vector<std::optional<Difference>> values(pending.size());
  for (const auto& [i, p] : plans) {
    if (SameBytes(p, progress, done)) continue;
    const Difference d = CountDifferences(p, pending[i].first->dtype, options.tolerance);
    if (d.differing) {
      values[i] = d;
      pending[i].second.push_back(
          std::to_string(d.differing) + " of " + Count(d.elements, "element", "elements") +
          (d.differing == 1 ? " differs" : " differ") + ", max |a - b| " + Number(d.max_abs));
    }
  }
  progress.Done();
  for (size_t i = 0; i < pending.size(); ++i) {
    auto& [t, what] = pending[i];
    if (!what.empty()) r.changed.push_back({t->entry + "/" + t->name, std::move(what), values[i]});
  }

  if (options.values_only) return r;
  DiffMetadata(a, b, "", true, true, r);
  std::vector<std::string> all = ea;
  for (const auto& e : r.added_entries) all.push_back(e);
  for (const auto& e : all) DiffMetadata(a, b, e, has_a.count(e) > 0, has_b.count(e) > 0, r);
  return r;
}

std::string MetaName(const MetaDiff& m) {
  return Printable(m.entry.empty() ? m.key : m.key + " (entry \"" + m.entry + "\")");
}

void PrintHuman(const std::string& pa, const std::string& pb, const Report& r) {
  for (const auto& e : r.removed_entries)
    std::printf("removed entry \"%s\"\n", Printable(e).c_str());
  for (const auto& e : r.added_entries) std::printf("added entry \"%s\"\n", Printable(e).c_str());
  auto tensors = [](const char* how, const std::vector<const TensorInfo*>& v) {
    for (const TensorInfo* t : v) {
      std::printf("%s %s/%s: %s %s\n", how, Printable(t->entry).c_str(), Printable(t->name).c_str(),
                  std::string(DTypeName(t->dtype)).c_str(), Dims(t->sizes).c_str());
    }
  };
  tensors("removed", r.removed);
  tensors("added", r.added);
  for (const auto& c : r.changed) {
    std::string list;
    for (const auto& w : c.what) list += (list.empty() ? "" : "; ") + w;
    std::printf("changed %s: %s\n", Printable(c.name).c_str(), list.c_str());
  }
  size_t meta_added = 0, meta_removed = 0, meta_changed = 0;
  for (const auto& m : r.metadata) {
    if (!m.from) {
      ++meta_added;
      std::printf("added metadata %s = %s\n", MetaName(m).c_str(), MetaText(*m.to).c_str());
    } else if (!m.to) {
      ++meta_removed;
      std::printf("removed metadata %s = %s\n", MetaName(m).c_str(), MetaText(*m.from).c_str());
    } else {
      ++meta_changed;
      std::printf("changed metadata %s: %s -> %s\n", MetaName(m).c_str(), MetaText(*m.from).c_str(),
                  MetaText(*m.to).c_str());
    }
  }
  if (r.equal()) {
    std::printf("same: %s and %s hold the same %s in %s and %s\n", pa.c_str(), pb.c_str(),
                Count(r.tensors, "tensor", "tensors").c_str(),
                Count(r.entries, "entry", "entries").c_str(),
                Count(r.keys, "metadata key", "metadata keys").c_str());
    return;
  }
  std::string parts;
  auto part = [&](size_t n, const char* one, const char* many, const char* how) {
    if (n) parts += (parts.empty() ? "" : ", ") + Count(n, one, many) + " " + how;
  };
  part(r.added.size(), "tensor", "tensors", "added");
  part(r.removed.size(), "tensor", "tensors", "removed");
  part(r.changed.size(), "tensor", "tensors", "changed");
  part(r.added_entries.size(), "entry", "entries", "added");
  part(r.removed_entries.size(), "entry", "entries", "removed");
  part(meta_added, "metadata key", "metadata keys", "added");
  part(meta_removed, "metadata key", "metadata keys", "removed");
  part(meta_changed, "metadata key", "metadata keys", "changed");
  std::printf("differ: %s and %s: %s\n", pa.c_str(), pb.c_str(), parts.c_str());
}

void PrintJson(const Report& r) {
  Json j;
  j["equal"] = r.equal();
  auto names = [](const std::vector<const TensorInfo*>& v) {
    Json out = Json::array();
    for (const TensorInfo* t : v) out.push_back(t->entry + "/" + t->name);
    return out;
  };
  j["added"] = names(r.added);
  j["removed"] = names(r.removed);
  Json& changed = j["changed"] = Json::array();
  for (const auto& c : r.changed) {
    Json item = {{"name", c.name}, {"what", c.what}};
    if (c.values) {
      item["differing_elements"] = c.values->differing;
      item["elements"] = c.values->elements;
      // JSON has no NaN: null when a NaN faced a number.
      item["max_abs_diff"] = std::isnan(c.values->max_abs) ? Json() : Json(c.values->max_abs);
    }
    changed.push_back(std::move(item));
  }
  Json meta = {{"added", Json::array()}, {"removed", Json::array()}, {"changed", Json::array()}};
  for (const auto& m : r.metadata) {
    Json item = {{"key", m.key}};
    if (!m.entry.empty()) item["entry"] = m.entry;
    if (!m.from) {
      item["value"] = MetaJson(*m.to);
      meta["added"].push_back(item);
    } else if (!m.to) {
      item["value"] = MetaJson(*m.from);
      meta["removed"].push_back(item);
    } else {
      item["from"] = MetaJson(*m.from);
      item["to"] = MetaJson(*m.to);
      meta["changed"].push_back(item);
    }
  }
  j["metadata"] = meta;
  j["entries"] = {{"added", r.added_entries}, {"removed", r.removed_entries}};
  std::printf("%s\n", j.dump(2, ' ', false, Json::error_handler_t::replace).c_str());
}

int RunDiff(const std::string& pa, const std::string& pb, bool json, const DiffOptions& options) {
  std::optional<ArchiveFile> a, b;
  try {
    a = OpenArchive(pa);
    b = OpenArchive(pb);
  } catch (const Error& e) {
    // Any unreadable input is exit 3, even "not a regular file" (kInvalidArgument).
    PrintError(e.what());
    return kExitBadInput;
  }
  const auto ia = a->infos(), ib = b->infos();
  const Report r = Compare(*a, *b, !json, ia, ib, options);
  if (json) {
    PrintJson(r);
  } else {
    PrintHuman(pa, pb, r);
  }
  return r.equal() ? kExitOk : kExitCheckFailed;
}

}  // namespace

Run AddDiff(CLI::App& app) {
  auto a = std::make_shared<std::string>();
  auto b = std::make_shared<std::string>();
  auto json = std::make_shared<bool>(false);
  auto options = std::make_shared<DiffOptions>();
  CLI::App* sub =
      app.add_subcommand("diff", "Compare two archives by value: entries, tensors and metadata");
  sub->add_option("a", *a, "The first .tsar file")->required();
  sub->add_option("b", *b, "The second .tsar file")->required();
  sub->add_flag("--json", *json, "One JSON object on stdout (fields below)");
  sub->add_flag("--values-only", options->values_only,
                "Compare names, dtypes, shapes and values only: not roles, requires_grad or\n"
                "metadata (a state_dict against the same model packed from TorchScript)");
  sub->add_option("--atol", options->tolerance.atol,
                  "Floating-point values are equal when |a - b| <= atol + rtol * |b|\n"
                  "(default 0 and 0: bytes must be equal)")
      ->check(CLI::NonNegativeNumber);
  sub->add_option("--rtol", options->tolerance.rtol, "See --atol")->check(CLI::NonNegativeNumber);
  sub->footer(
      "Tensors are equal when name, dtype, shape, role, requires_grad and every value's bytes\n"
      "are; strides, storage sharing and file layout may differ. For each tensor whose values\n"
      "differ: how many elements and the largest |a - b|.\n"
      "Exit status: 0 same, 1 differences (one line each, then a summary), 3 unreadable input.\n"
      "--json: {\"equal\", \"added\": [\"entry/name\"...], \"removed\": [...], \"changed\": "
      "[{\"name\", \"what\": [...],\n"
      "  \"differing_elements\", \"elements\", \"max_abs_diff\" (values differ; null for NaN)}],\n"
      "  \"metadata\": {\"added\"|\"removed\": [{\"key\", \"entry\"?, \"value\"}], \"changed\": "
      "[{\"key\", \"entry\"?, \"from\", \"to\"}]},\n"
      "  \"entries\": {\"added\", \"removed\"}}; \"entry\" is absent for archive-level keys.\n"
      "Examples:\n"
      "  tsar diff old.tsar new.tsar\n"
      "  tsar diff old.tsar new.tsar --json | jq -r '.changed[] | .name + \": \" + (.what | "
      "join(\", \"))'");
  return [a, b, json, options] { return RunDiff(*a, *b, *json, *options); };
}

}  // namespace tsar::cli
