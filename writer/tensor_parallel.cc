// tsar::writer::ApplyShardPlan (writer/tensor_parallel.h).
#include "writer/tensor_parallel.h"

#include <fnmatch.h>

#include <map>
#include <tuple>

#include "format/reader.h"
#include "format/tensor_parallel.h"
#include "tsar/error.h"

namespace tsar::writer {
namespace {

std::string Dec(uint64_t v) { return std::to_string(v); }

std::string Shape(const std::vector<int64_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

[[noreturn]] void Refuse(const std::string& message) {
  throw Error(ErrorCode::kInvalidArgument, "", std::nullopt, message);
}

bool IsCContiguous(const TensorRef& t) {
  int64_t want = 1;
  for (size_t k = t.sizes.size(); k-- > 0;) {
    if (t.sizes[k] != 1 && t.strides[k] != want) return t.numel() == 0;
    want *= t.sizes[k];
  }
  return true;
}

}  // namespace

size_t MatchShardPattern(const std::string& name, const ShardPatterns& patterns) {
  size_t p = 0;
  while (p < patterns.size() && fnmatch(patterns[p].first.c_str(), name.c_str(), 0) != 0) ++p;
  return p;
}

uint32_t ShardDimOf(const std::string& name, const TensorRef& t, bool sparse_component,
                    uint32_t world, const std::pair<std::string, int64_t>& pattern) {
  const std::string what =
      "tensor " + format::Quote(name) + " (matched by " + format::Quote(pattern.first) + ")";
  if (sparse_component) {
    Refuse(what +
           ": expected a dense tensor, found a member of a sparse tensor or of a tensor group (a "
           "quantized weight), which a tensor-parallel layout does not split: narrow the pattern "
           "so that it leaves the tensor whole");
  }
  const auto ndim = static_cast<int64_t>(t.sizes.size());
  int64_t dim = pattern.second;
  if (ndim == 0) {
    Refuse(what + ": dim " + std::to_string(dim) +
           ": expected a tensor of at least one dimension to split, found a scalar (shape [])");
  }
  if (dim < -ndim || dim >= ndim) {
    Refuse(what + ": dim: expected -" + Dec(ndim) + " to " + std::to_string(ndim - 1) +
           " for shape " + Shape(t.sizes) + ", found " + std::to_string(dim));
  }
  if (dim < 0) dim += ndim;
  if (t.sizes[dim] % world != 0) {
    Refuse(what + ": size " + Dec(t.sizes[dim]) + " of dim " + Dec(dim) + " (shape " +
           Shape(t.sizes) + "): expected a multiple of tp " + Dec(world));
  }
  if (!IsCContiguous(t)) {
    Refuse(what + ": expected a C-contiguous tensor, found strides " + Shape(t.strides) +
           " for shape " + Shape(t.sizes) + " (make it contiguous before packing)");
  }
  return static_cast<uint32_t>(dim);
}

ShardPlan ApplyShardPlan(const std::vector<ShardItem>& items, uint32_t world,
                         const std::vector<std::pair<std::string, int64_t>>& patterns,
                         uint32_t alignment) {
  if (world < 2 || world > format::kMaxWorld) {
    Refuse("tp: expected 2 to " + Dec(format::kMaxWorld) + " ranks, found " + Dec(world));
  }
  if (patterns.empty()) Refuse("shard: expected at least one PATTERN=DIM with tp " + Dec(world));
  ShardPlan plan;
  plan.dims.assign(items.size(), format::kNone);
  std::vector<bool> used(patterns.size(), false);
  // One blocked storage per (source storage, offset, dtype, sizes, dim): tied
  // tensors sharded alike share it, as they shared their source.
  using Key = std::tuple<const Storage*, uint64_t, DType, std::vector<int64_t>, uint32_t>;
  std::map<Key, std::shared_ptr<const Storage>> made;
  std::map<const Storage*, std::string> sharded_sources;  // source -> a sharded tensor's name
  for (size_t i = 0; i < items.size(); ++i) {
    const ShardItem& it = items[i];
    const size_t p = MatchShardPattern(*it.name, patterns);
    if (p == patterns.size()) continue;
    used[p] = true;
    TensorRef& t = *it.tensor;
    const std::string what = "tensor " + format::Quote(*it.name) + " (matched by " +
                             format::Quote(patterns[p].first) + ")";
    const uint32_t d = ShardDimOf(*it.name, t, it.sparse_component, world, patterns[p]);
    const auto ndim = static_cast<int64_t>(t.sizes.size());
    plan.dims[i] = d;
    sharded_sources.emplace(t.storage.get(), *it.name);
    Key key{t.storage.get(), t.storage_offset, t.dtype, t.sizes, d};
    auto [slot, inserted] = made.emplace(key, nullptr);
    if (inserted) {
      format::ShardLayout layout;
      if (!format::ComputeShardLayout(t.sizes.data(), static_cast<uint32_t>(ndim), d,
                                      ElementSize(t.dtype), world, alignment, &layout)) {
        Refuse(what + ": expected a layout below 2^64 bytes");
      }
      const uint64_t begin = t.storage_offset * ElementSize(t.dtype);
      const uint64_t nbytes = t.numel() * ElementSize(t.dtype);
      auto src = t.storage;
      if (!src->data && nbytes > 0) {  // bytes that must be fetched (CUDA): fetched once, here
        std::vector<uint8_t> bytes(nbytes);
        src->fetch(begin, nbytes, bytes.data());
        src = Storage::Owning(std::move(bytes));
      }
      // The tensor's C-order bytes: in its source storage, or the fetched copy.
      const uint8_t* c_order =
          src == t.storage ? (src->data ? src->data + begin : nullptr) : src->data;
      auto blocked = std::make_shared<Storage>();
      blocked->nbytes = layout.nbytes;
      blocked->keep = src;
      blocked->device_type = t.storage->device_type;
      blocked->device_index = t.storage->device_index;
      blocked->fetch = [layout, c_order](uint64_t b, uint64_t n, uint8_t* out) {
        format::GatherBlocked(layout, c_order, b, n, out);
      };
      slot->second = std::move(blocked);
      plan.blocked.push_back(slot->second.get());
    }
    TensorRef view;
    view.storage = slot->second;
    view.dtype = t.dtype;
    view.sizes = t.sizes;
    view.strides = format::ShardStrides(t.sizes);
    view.storage_offset = 0;
    view.requires_grad = t.requires_grad;
    t = std::move(view);
  }
  for (size_t p = 0; p < patterns.size(); ++p) {
    if (!used[p]) {
      Refuse("shard pattern " + format::Quote(patterns[p].first) +
             ": expected a pattern that matches a tensor name, found none that it matches");
    }
  }
  // A source storage that a sharded tensor and a tensor left whole both view
  // is now written twice: say so.
  for (size_t i = 0; i < items.size(); ++i) {
    if (plan.dims[i] != format::kNone) continue;
    auto s = sharded_sources.find(items[i].tensor->storage.get());
    if (s == sharded_sources.end()) continue;
    plan.note += "tensor " + format::Quote(*items[i].name) + " shares its storage with " +
                 format::Quote(s->second) +
                 ", which the plan shards: both are stored (sharded and whole)\n";
  }
  if (!plan.note.empty()) plan.note.pop_back();
  return plan;
}

}  // namespace tsar::writer
