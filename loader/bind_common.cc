// Matching and in-place rebinding for tsar::bind (include/tsar/bind.h).
#include "loader/bind_common.h"

#include <ATen/ops/set.h>
#include <c10/core/GradMode.h>
#include <c10/core/TensorImpl.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <sstream>
#include <unordered_set>

#include "format/reader.h"
#include "loader/archive_impl.h"
#include "loader/read_ahead.h"
#include "loader/scalar_type.h"

namespace tsar {
namespace {

std::string Shape(c10::IntArrayRef s) {
  std::ostringstream o;
  o << "[";
  for (size_t i = 0; i < s.size(); ++i) o << (i ? ", " : "") << s[i];
  o << "]";
  return o.str();
}
std::string Shape(const int64_t* s, uint32_t n) { return Shape(c10::IntArrayRef(s, n)); }

// Starts loading the TensorImpl fields bind reads (dtype, sizes, storage,
// flags): a module's tensors lie scattered over the heap, and waiting on one
// cache miss after another was half of binding 100,000 tensors.
constexpr size_t kAhead = 8;
void PrefetchTensor(const c10::TensorImpl* t) {
  const char* p = reinterpret_cast<const char*>(t);
  for (size_t line = 0; line < sizeof(c10::TensorImpl); line += 64) __builtin_prefetch(p + line);
}

std::string List(const std::vector<std::string>& v, size_t max = 20) {
  std::string out;
  for (size_t i = 0; i < v.size() && i < max; ++i) out += (i ? ", " : "") + v[i];
  if (v.size() > max) out += ", ... (" + std::to_string(v.size() - max) + " more)";
  return out;
}

// A TensorImpl's dispatch keys, which choose the kernels of every op on it.
// key_set_ is protected: a pointer to it formed through a derived class
// applies to any TensorImpl.
struct KeysOf : c10::TensorImpl {
  static constexpr auto kMember = &KeysOf::key_set_;
};

// A meta tensor whose storage is now the archive's (a CPU storage; the device
// follows the storage) becomes a CPU tensor in place: the Meta backend bit of
// its dispatch keys, which both its Dense and its Autograd keys take, becomes
// the CPU bit, giving exactly the keys of a CPU tensor made by at::empty. The
// TensorImpl, and so the Parameter object around it, a C++ module's member
// handle and tied names, stay what they were.
void MetaToCpu(c10::TensorImpl* t) {
  c10::DispatchKeySet& keys = t->*KeysOf::kMember;
  if (!keys.has_backend(c10::BackendComponent::MetaBit)) return;
  keys = keys.remove_backend(c10::BackendComponent::MetaBit)
             .add(c10::DispatchKeySet(c10::BackendComponent::CPUBit));
}

constexpr int64_t kWhole = -1;

// Rank options.rank's part of `w` elements split options.world ways, as
// torch.chunk gives it.
int64_t ChunkSize(int64_t n, const BindOptions& o) {
  const int64_t c = n / o.world + (n % o.world != 0);  // ceil, without n + world overflowing
  if (c == 0 || o.rank > (n - 1) / c) return 0;        // rank * c would pass n (or overflow)
  return std::min(c, n - o.rank * c);
}

// §4.12: which part of archive tensor `rec` a slot of shape `mine` of a
// rank's module takes: the whole (*split = kWhole), or the rank's chunk along
// *split. Returns "" or why it cannot.
std::string RankShape(c10::IntArrayRef mine, const format::TensorRecord& rec,
                      const format::Index& index, const BindOptions& o, int64_t* split) {
  const c10::IntArrayRef full(index.sizes(rec), rec.ndim);
  *split = kWhole;
  if (o.world <= 1) {
    if (mine.equals(full)) return "";
    return "shape " + Shape(mine) + " vs archive " + Shape(full);
  }
  std::vector<int64_t> want(full.begin(), full.end());
  if (rec.shard_dim != format::kNone) {
    want[rec.shard_dim] = ChunkSize(full[rec.shard_dim], o);
    if (mine.equals(want)) {
      *split = rec.shard_dim;
      return "";
    }
    return "shape " + Shape(mine) + " vs " + Shape(want) + ", rank " + std::to_string(o.rank) +
           "'s slice of archive " + Shape(full) + " packed sharded along dim " +
           std::to_string(rec.shard_dim);
  }
  if (mine.equals(full)) return "";
  if (mine.size() == full.size()) {
    int64_t d = kWhole, differing = 0;
    for (size_t k = 0; k < full.size(); ++k) {
      if (mine[k] != full[k]) {
        ++differing;
        d = static_cast<int64_t>(k);
      }
    }
    if (differing == 1 && mine[d] == ChunkSize(full[d], o)) {
      *split = d;
      return "";
    }
  }
  return "shape " + Shape(mine) + " vs archive " + Shape(full) + " (neither whole nor rank " +
         std::to_string(o.rank) + "'s slice of " + std::to_string(o.world) + " along one dim)";
}

// The bytes a bound strided tensor views (sizes and strides are never
// negative), appended to `out`; a sparse or empty one adds nothing.
void AddViewed(const c10::TensorImpl& t, std::vector<ByteRange>& out) {
  if (t.layout() != c10::kStrided || !t.has_storage() || t.numel() == 0) return;
  const auto* data = static_cast<const uint8_t*>(t.storage().data());
  if (data == nullptr) return;
  uint64_t last = 0;  // the farthest element from the first, in elements
  const c10::IntArrayRef sizes = t.sizes(), strides = t.strides();
  for (size_t d = 0; d < sizes.size(); ++d) {
    last += static_cast<uint64_t>(sizes[d] - 1) * static_cast<uint64_t>(strides[d]);
  }
  const uint64_t item = t.itemsize();
  out.push_back({data + static_cast<uint64_t>(t.storage_offset()) * item, (last + 1) * item});
}

enum class SlotState : uint8_t { kMissing, kMatched, kMismatched, kTied };

// Whether two archive tensors hold the same values: the same view of one
// storage, or equal bytes (contiguous views of as many bytes).
bool SameValues(const at::Tensor& a, const at::Tensor& b) {
  if (a.dtype() != b.dtype() || !a.sizes().equals(b.sizes())) return false;
  if (a.is_same(b)) return true;
  if (a.layout() != c10::kStrided || b.layout() != c10::kStrided) return false;
  if (a.storage().is_alias_of(b.storage()) && a.storage_offset() == b.storage_offset() &&
      a.strides().equals(b.strides()))
    return true;
  if (!a.is_contiguous() || !b.is_contiguous()) return false;
  const size_t n = a.nbytes();
  if (n == 0) return true;
  const auto* pa = static_cast<const char*>(a.storage().data()) + a.storage_offset() * a.itemsize();
  const auto* pb = static_cast<const char*>(b.storage().data()) + b.storage_offset() * b.itemsize();
  return std::memcmp(pa, pb, n) == 0;
}

// Ties: one TensorImpl under several names (tied weights, a module reached
// twice). A missing name whose tensor is also matched under another name is
// bound through that tie (kTied): save_pretrained stores a tied lm_head.weight
// once. Two names of one tensor that the archive holds with different values
// would leave the tensor with whichever was bound last: the later one is a
// mismatch. Returns, per slot, whether its tensor is bound by some name.
std::vector<bool> ResolveTies(const std::vector<BindSlot>& slots,
                              const std::function<at::Tensor(size_t)>& source,
                              std::vector<uint32_t>& match, std::vector<SlotState>& state,
                              std::vector<std::pair<size_t, std::string>>& why_of) {
  std::vector<std::pair<const c10::TensorImpl*, size_t>> by_impl(slots.size());
  for (size_t i = 0; i < slots.size(); ++i) by_impl[i] = {slots[i].tensor, i};
  std::sort(by_impl.begin(), by_impl.end());  // by tensor, then slot order
  std::vector<bool> bound(slots.size(), false);
  for (size_t lo = 0, hi; lo < by_impl.size(); lo = hi) {
    for (hi = lo + 1; hi < by_impl.size() && by_impl[hi].first == by_impl[lo].first;) ++hi;
    if (hi - lo == 1) {
      bound[by_impl[lo].second] = state[by_impl[lo].second] == SlotState::kMatched;
      continue;
    }
    size_t first = slots.size();  // the first name matched
    for (size_t k = lo; k < hi; ++k) {
      const size_t i = by_impl[k].second;
      if (state[i] != SlotState::kMatched) continue;
      if (first == slots.size()) {
        first = i;
      } else if (match[i] != match[first] && !SameValues(source(first), source(i))) {
        state[i] = SlotState::kMismatched;
        match[i] = format::kNone;
        why_of.emplace_back(i, "the same tensor as " + format::Quote(slots[first].name) +
                                   " in the module, but the archive holds other values for it "
                                   "(tied in the module, not in the archive)");
      }
    }
    for (size_t k = lo; k < hi; ++k) {
      const size_t i = by_impl[k].second;
      bound[i] = first != slots.size();
      if (bound[i] && state[i] == SlotState::kMissing) state[i] = SlotState::kTied;
    }
  }
  return bound;
}

// Refuses (kBindMismatch) a bind that would leave a tensor of the module on
// the meta device: a slot neither bound nor tied, or a `loose` tensor (one no
// archive holds: a non-persistent buffer) on meta.
void CheckNothingStaysMeta(const std::vector<BindSlot>& slots, const std::vector<SlotState>& state,
                           const std::vector<bool>& bound, const std::vector<BindSlot>& loose,
                           const std::string& path, const std::string& entry_name) {
  std::vector<std::string> unbound, buffers;
  for (size_t i = 0; i < slots.size(); ++i) {
    if (!bound[i] && slots[i].tensor->device_type() == c10::DeviceType::Meta) {
      unbound.push_back(slots[i].name + (state[i] == SlotState::kMismatched
                                             ? " (mismatched)"
                                             : " (not in the archive)"));
    }
  }
  std::unordered_set<const c10::TensorImpl*> bound_impls;
  if (!loose.empty()) {
    for (size_t i = 0; i < slots.size(); ++i) {
      if (bound[i]) bound_impls.insert(slots[i].tensor);
    }
  }
  for (const BindSlot& s : loose) {
    if (s.tensor->device_type() == c10::DeviceType::Meta && bound_impls.count(s.tensor) == 0)
      buffers.push_back(s.name);
  }
  if (unbound.empty() && buffers.empty()) return;
  std::string msg =
      "bind: the module would keep tensors on the meta device, which the archive's "
      "entry " +
      format::Quote(entry_name) + " does not bind: ";
  if (!buffers.empty()) {
    msg += List(buffers) +
           " (non-persistent buffers: state_dict() leaves them out, so a bind never takes them "
           "from an archive, even one that holds a tensor of that name, and they were made on "
           "meta with the module). Build the module under "
           "tsar.empty_parameters() (parameters on meta, buffers made for real) instead of "
           "torch.device(\"meta\"), or give these buffers their values before binding";
    if (!unbound.empty()) msg += "; ";
  }
  if (!unbound.empty()) msg += List(unbound);
  throw Error(ErrorCode::kBindMismatch, path, std::nullopt,
              msg + ". A module on meta is bound completely or not at all. Nothing was changed");
}

}  // namespace

BindReport BindSlots(std::vector<BindSlot>& slots, bool training, const Archive& archive,
                     const BindOptions& options, const std::vector<BindSlot>& loose) {
  const Archive::Impl& impl = archive.impl();
  const format::Index& index = impl.index();
  const uint32_t entry = impl.BindEntry(options.entry);
  const std::string entry_name(index.entries()[entry].name);
  // On a GPU the module's tensors are copies: training writes them, not the mapping.
  CheckDevice(options.device, archive.path(), "bind", options.staging);
  if (training && archive.mode() == MapMode::kShared && !options.allow_training &&
      options.device.is_cpu()) {
    throw Error(ErrorCode::kInvalidArgument, archive.path(), std::nullopt,
                "bind: the module is in training mode and this archive is mapped read-only: "
                "training writes the weights (an optimizer's step) and train() layers write "
                "their buffers (BatchNorm's running stats), into pages of the file. To serve, "
                "call module.eval() before binding; to train or fine-tune, open the archive "
                "copy-on-write (C++ MapMode::kCopyOnWrite, Python mode=\"copy_on_write\": "
                "writes stay private to the process)");
  }

  // §4.12: a rank's module, or an archive with sharded tensors: some slots
  // take a slice or a full copy (targets[i]) instead of the record's view.
  const bool tp = options.world > 1 || index.tp_world() != 0;
  if (options.world < 0) {
    throw Error(ErrorCode::kInvalidArgument, archive.path(), std::nullopt,
                "bind: world: expected 0 or 1 (no tensor parallelism) or the number of ranks, "
                "found " +
                    std::to_string(options.world) + ". Nothing was changed");
  }
  if (options.world <= 1 && options.rank != 0) {
    throw Error(ErrorCode::kInvalidArgument, archive.path(), std::nullopt,
                "bind: rank: expected 0 without tensor parallelism (world " +
                    std::to_string(options.world) + "), found " + std::to_string(options.rank) +
                    "; pass world= the number of ranks. Nothing was changed");
  }
  if (options.world > 1 && (options.rank < 0 || options.rank >= options.world)) {
    throw Error(ErrorCode::kInvalidArgument, archive.path(), std::nullopt,
                "bind: rank: expected 0 to " + std::to_string(options.world - 1) + " for world " +
                    std::to_string(options.world) + ", found " + std::to_string(options.rank));
  }
  std::vector<at::Tensor> targets(tp ? slots.size() : 0);
  BindReport report;
  report.bound.reserve(slots.size());
  std::vector<uint32_t> match(slots.size(), format::kNone);
  std::vector<SlotState> state(slots.size(), SlotState::kMissing);
  std::vector<std::pair<size_t, std::string>> why_of;  // the mismatched slots' reasons
  const format::EntryRecord& e = index.entries()[entry];
  std::vector<bool> used(e.tensor_count);  // by position in the entry
  const std::string& mp = options.module_prefix;
  std::string key;
  // A module usually lists its tensors in the order the archive was packed
  // from: the record after the last match is tried before the name table.
  uint32_t next = e.first_tensor;
  size_t meta = 0;  // slots on the meta device
  const uint32_t end = e.first_tensor + e.tensor_count;
  for (size_t i = 0; i < slots.size(); ++i) {
    if (i + kAhead < slots.size()) PrefetchTensor(slots[i + kAhead].tensor);
    const std::string& name = slots[i].name;
    const c10::DeviceType device = slots[i].tensor->device_type();
    if (device != c10::DeviceType::CPU && device != c10::DeviceType::Meta) {
      throw Error(ErrorCode::kInvalidArgument, archive.path(), std::nullopt,
                  "bind: " + format::Quote(name) + " is on " + slots[i].tensor->device().str() +
                      ": tsar binds modules on cpu or meta (built with torch.device(\"meta\")); "
                      "move the module to cpu or meta first. Nothing was changed");
    }
    if (device == c10::DeviceType::Meta) {
      if (!slots[i].tensor->allow_tensor_metadata_change() ||
          slots[i].tensor->layout() != c10::kStrided) {
        throw Error(ErrorCode::kInvalidArgument, archive.path(), std::nullopt,
                    "bind: " + format::Quote(name) +
                        " is a meta tensor that does not allow its storage to change (a "
                        "tensor.data or detach() alias?); bind the module's own parameters. "
                        "Nothing was changed");
      }
      ++meta;
    }
    const bool prefixed = name.compare(0, mp.size(), mp) == 0;
    if (prefixed) key.assign(options.archive_prefix).append(name, mp.size());
    uint32_t t = format::kNone;
    if (prefixed) {
      t = next < end && index.tensors()[next].name == key ? next : index.FindTensor(entry, key);
    }
    if (t == format::kNone) continue;                  // missing, unless tied (ResolveTies)
    if (slots[i].tensor->layout() != c10::kStrided) {  // set_ would fail midway
      std::ostringstream layout;
      layout << slots[i].tensor->layout();
      throw Error(ErrorCode::kInvalidArgument, archive.path(), std::nullopt,
                  "bind: " + format::Quote(name) + " is a " + layout.str() +
                      " tensor: tsar binds strided (dense) tensors, whose storage can be the "
                      "archive's; make it dense first (to_dense()). Nothing was changed");
    }
    next = t + 1;
    used[t - e.first_tensor] = true;
    const format::TensorRecord& rec = index.tensors()[t];
    const c10::TensorImpl& mine = *slots[i].tensor;
    const c10::ScalarType mine_type = c10::typeMetaToScalarType(mine.dtype());
    const auto want = FromScalarType(mine_type);
    std::string why;
    if (!want || *want != rec.dtype) {
      why = "dtype " +
            (want ? std::string(DTypeName(*want)) : std::string(c10::toString(mine_type))) +
            " vs archive " + std::string(DTypeName(rec.dtype));
    }
    int64_t split = kWhole;
    if (tp) {
      const std::string w = RankShape(mine.sizes(), rec, index, options, &split);
      if (!w.empty()) why += std::string(why.empty() ? "" : ", ") + w;
    } else if (!mine.sizes().equals(c10::IntArrayRef(index.sizes(rec), rec.ndim))) {
      why += std::string(why.empty() ? "" : ", ") + "shape " + Shape(mine.sizes()) +
             " vs archive " + Shape(index.sizes(rec), rec.ndim);
    }
    if (!why.empty()) {
      state[i] = SlotState::kMismatched;
      why_of.emplace_back(i, std::move(why));
      continue;
    }
    state[i] = SlotState::kMatched;
    match[i] = t;
    if (tp && (split != kWhole || rec.shard_dim != format::kNone)) {
      targets[i] = split == kWhole ? impl.MakeFull(t)
                                   : impl.MakeShard(t, options.rank, options.world, split);
    }
  }
  const std::vector<bool> impl_bound = ResolveTies(
      slots,
      [&](size_t i) { return tp && targets[i].defined() ? targets[i] : impl.Make(match[i]); },
      match, state, why_of);
  for (size_t i = 0; i < slots.size(); ++i) {
    if (state[i] == SlotState::kMissing) report.missing.push_back(slots[i].name);
    if (state[i] == SlotState::kTied) report.tied.push_back(slots[i].name);
  }
  std::sort(why_of.begin(), why_of.end());
  for (auto& [i, why] : why_of) report.mismatched.push_back(slots[i].name + ": " + why);
  for (uint32_t i = 0; i < e.tensor_count; ++i) {
    const uint32_t t = e.first_tensor + i;
    if (!used[i] && index.tensors()[t].role != format::Role::kSparseComponent) {
      report.unexpected.push_back(std::string(index.tensors()[t].name));
    }
  }
  if (options.strict &&
      (!report.missing.empty() || !report.unexpected.empty() || !report.mismatched.empty())) {
    std::string msg = "bind: module and entry " + format::Quote(entry_name) + " do not match:";
    if (!report.missing.empty()) msg += " missing in archive: " + List(report.missing) + ";";
    if (!report.unexpected.empty()) msg += " not in module: " + List(report.unexpected) + ";";
    if (!report.mismatched.empty()) msg += " mismatched: " + List(report.mismatched) + ";";
    msg.pop_back();
    throw Error(ErrorCode::kBindMismatch, archive.path(), std::nullopt, msg);
  }

  // A meta tensor left unbound would leave a module that cannot run (or,
  // worse, one that runs on garbage): refused, strict or not, before anything
  // changes. A name the archive lacks is fine when its tensor is bound through
  // a tie (ResolveTies).
  CheckNothingStaysMeta(slots, state, impl_bound, loose, archive.path(), entry_name);
  // set_ on a leaf that requires grad is only allowed with grad mode off.
  c10::AutoGradMode no_grad(false);
  if (!options.device.is_cpu()) {
    // On a GPU: every byte copied before any slot changes (an allocation or
    // copy that fails leaves the module as it was), then each slot becomes,
    // in place, the device copy of what it would have viewed on the CPU.
    std::vector<size_t> which;
    std::vector<at::Tensor> sources;
    for (size_t i = 0; i < slots.size(); ++i) {
      if (match[i] == format::kNone) continue;
      if (slots[i].tensor->layout() != c10::kStrided) {  // set_data would refuse it midway
        std::ostringstream layout;
        layout << slots[i].tensor->layout();
        throw Error(ErrorCode::kInvalidArgument, archive.path(), std::nullopt,
                    "bind onto " + options.device.str() + ": " + format::Quote(slots[i].name) +
                        " is a " + layout.str() +
                        " tensor, which cannot take a dense device copy in place. Nothing was "
                        "changed");
      }
      which.push_back(i);
      sources.push_back(tp && targets[i].defined() ? targets[i] : impl.Make(match[i]));
    }
    const std::vector<at::Tensor> on_device =
        CopyToDevice(sources, options.device, options.staging, *impl.core);
    for (size_t k = 0; k < which.size(); ++k) {
      c10::TensorImpl* t = slots[which[k]].tensor;
      MetaToCpu(t);  // a meta TensorImpl takes a device tensor's data as a dense one does
      at::Tensor(c10::intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>::reclaim_copy(t))
          .set_data(on_device[k]);
      report.bound.push_back(std::move(slots[which[k]].name));
    }
    return report;
  }
  // What the bound tensors view, for the read-ahead thread.
  const bool read_ahead = options.read_ahead && archive.mode() != MapMode::kRead;
  std::vector<ByteRange> viewed;
  if (read_ahead) viewed.reserve(slots.size());
  for (size_t i = 0; i < slots.size(); ++i) {
    if (i + kAhead < slots.size()) PrefetchTensor(slots[i + kAhead].tensor);
    if (match[i] == format::kNone) continue;
    const format::TensorRecord& rec = index.tensors()[match[i]];
    c10::TensorImpl* t = slots[i].tensor;
    if (tp && targets[i].defined() && t->allow_tensor_metadata_change() &&
        t->layout() == c10::kStrided) {  // a slice or a full copy (§4.12)
      const c10::TensorImpl* src = targets[i].unsafeGetTensorImpl();
      t->set_storage_keep_dtype(src->storage());
      t->set_sizes_and_strides(src->sizes(), src->strides());
      t->set_storage_offset(src->storage_offset());
      if (meta) MetaToCpu(t);
      if (!t->is_inference()) t->bump_version();
    } else if (tp && targets[i].defined()) {
      at::Tensor(c10::intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>::reclaim_copy(t))
          .set_(targets[i]);
    } else if (t->allow_tensor_metadata_change() && t->layout() == c10::kStrided) {
      // What set_(storage, offset, sizes, strides) does, without a temporary
      // tensor or the dispatcher: about half the cost per tensor. The dtype
      // was checked equal above; the view was proved in bounds by R53.
      t->set_storage_keep_dtype(impl.Storage(rec.storage));
      t->set_sizes_and_strides(c10::IntArrayRef(index.sizes(rec), rec.ndim),
                               c10::IntArrayRef(index.strides(rec), rec.ndim));
      t->set_storage_offset(static_cast<int64_t>(rec.storage_offset));
      if (meta) MetaToCpu(t);  // after the storage: a no-op for a cpu tensor
      if (!t->is_inference()) t->bump_version();
    } else {
      at::Tensor(c10::intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>::reclaim_copy(t))
          .set_(impl.Make(match[i]));
    }
    if (read_ahead) AddViewed(*t, viewed);
    report.bound.push_back(std::move(slots[i].name));  // slots are the caller's scratch
  }
  if (read_ahead) StartReadAhead(impl.core, std::move(viewed));
  return report;
}

}  // namespace tsar
