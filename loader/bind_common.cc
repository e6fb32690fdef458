// Matching and in-place rebinding for tsar::bind (include/tsar/bind.h).
#include "loader/bind_common.h"

#include <ATen/ops/set.h>
#include <c10/core/GradMode.h>
#include <c10/core/TensorImpl.h>

#include <algorithm>
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
  const int64_t c = (n + o.world - 1) / o.world;
  return std::max<int64_t>(0, std::min(c, n - o.rank * c));
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

}  // namespace

BindReport BindSlots(std::vector<BindSlot>& slots, bool training, const Archive& archive,
                     const BindOptions& options) {
  const Archive::Impl& impl = archive.impl();
  const format::Index& index = impl.index();
  const uint32_t entry = impl.BindEntry(options.entry);
  const std::string entry_name(index.entries()[entry].name);
  // On a GPU the module's tensors are copies: training writes them, not the mapping.
  CheckDevice(options.device, archive.path(), "bind", options.staging);
  if (training && archive.mode() == MapMode::kShared && !options.allow_training &&
      options.device.is_cpu()) {
    throw Error(ErrorCode::kInvalidArgument, archive.path(), std::nullopt,
                "bind: the module is in training mode, whose layers (BatchNorm running stats) "
                "write their buffers, and this archive is mapped read-only: call module.eval() "
                "before binding, or open the archive copy-on-write (C++ MapMode::kCopyOnWrite, "
                "Python mode=\"copy_on_write\")");
  }

  // §4.12: a rank's module, or an archive with sharded tensors: some slots
  // take a slice or a full copy (targets[i]) instead of the record's view.
  const bool tp = options.world > 1 || index.tp_world() != 0;
  if (options.world > 1 && (options.rank < 0 || options.rank >= options.world)) {
    throw Error(ErrorCode::kInvalidArgument, archive.path(), std::nullopt,
                "bind: rank: expected 0 to " + std::to_string(options.world - 1) + " for world " +
                    std::to_string(options.world) + ", found " + std::to_string(options.rank));
  }
  std::vector<at::Tensor> targets(tp ? slots.size() : 0);
  BindReport report;
  report.bound.reserve(slots.size());
  std::vector<uint32_t> match(slots.size(), format::kNone);
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
                  "bind: " + format::Quote(name) + " is on " +
                      slots[i].tensor->device().str() +
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
    if (t == format::kNone) {
      report.missing.push_back(slots[i].name);
      continue;
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
      report.mismatched.push_back(slots[i].name + ": " + why);
      continue;
    }
    match[i] = t;
    if (tp && (split != kWhole || rec.shard_dim != format::kNone)) {
      targets[i] = split == kWhole ? impl.MakeFull(t)
                                   : impl.MakeShard(t, options.rank, options.world, split);
    }
  }
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

  // A meta slot left unbound would leave a module that cannot run: refused,
  // strict or not, before anything changes.
  // A name the archive lacks is fine when its tensor is bound through another
  // name (a tied weight stored once, as save_pretrained stores lm_head).
  std::vector<std::string> stay_meta;
  std::unordered_set<const c10::TensorImpl*> bound_impls;
  for (size_t i = 0; meta && i < slots.size(); ++i) {
    if (match[i] != format::kNone) bound_impls.insert(slots[i].tensor);
  }
  for (size_t i = 0; meta && i < slots.size(); ++i) {
    if (match[i] == format::kNone && slots[i].tensor->device_type() == c10::DeviceType::Meta &&
        bound_impls.count(slots[i].tensor) == 0)
      stay_meta.push_back(slots[i].name);
  }
  if (!stay_meta.empty()) {
    throw Error(ErrorCode::kBindMismatch, archive.path(), std::nullopt,
                "bind: the module would keep tensors on the meta device, which the archive's "
                "entry " + format::Quote(entry_name) + " does not bind (" + List(stay_meta) +
                    "); a module on meta is bound completely or not at all. Nothing was changed");
  }
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
    const std::vector<at::Tensor> on_device = CopyToDevice(sources, options.device, options.staging);
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
