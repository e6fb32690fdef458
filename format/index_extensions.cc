// The index decoder's extensions of format 1.2 and 1.4 (spec/FORMAT.md §4.11,
// §4.12): the layer record and its base storages, and the shard table. Called
// from Index::Decode (format/index.cc) once the tables they refer to are read.
#include <algorithm>
#include <string>
#include <vector>

#include "format/index.h"
#include "format/index_rules.h"
#include "format/reader.h"
#include "format/tensor_parallel.h"

namespace tsar::format {

using detail::BlobString;
using detail::Dec;
using detail::RequireZero;
using detail::TensorField;

// §4.11 (format 1.2): the layer record (R95-R97) and the base storage table
// (R98, R99), appended to storages_ after the archive's own storages. A base
// storage's nbytes is not bounded here: in a chain its bytes may lie in a
// base's base, larger than the base file (opening checks it, B6).
void Index::DecodeLayer(const ByteReader& r, uint64_t blob, uint64_t blob_size,
                        uint32_t ref_count) {
  const uint8_t* const base = head_.data();
  const uint64_t l = table_offset_[9];
  layer_.base_id_low = LoadU64(base + l);
  layer_.base_id_high = LoadU64(base + l + 8);
  layer_.base_file_size = LoadU64(base + l + 16);
  layer_.base_storage_count = LoadU32(base + l + 24);
  layer_.depth = LoadU32(base + l + 28);
  RequireZero(r, l + 40, 24, "layer reserved");             // R95
  if (layer_.depth < 1 || layer_.depth > kMaxLayerDepth) {  // R96
    r.Fail(ErrorCode::kInvalidValue, l + 28, "layer depth",
           "1 to " + Dec(kMaxLayerDepth) + " (1 + the depth of the base)", Dec(layer_.depth));
  }
  layer_.base_path = BlobString(r, l + 32, blob, blob_size, "layer base_path", true);  // R97
  if (!IsRelativePath(layer_.base_path)) {                                             // R97
    r.Fail(ErrorCode::kInvalidValue, l + 32, "layer base_path",
           "a relative path: '/'-separated names, none empty, no NUL, not starting with '/'",
           Quote(layer_.base_path));
  }
  storages_.resize(uint64_t{own_storage_count_} + ref_count);
  for (uint32_t k = 0; k < ref_count; ++k) {
    const uint64_t off = table_offset_[10] + uint64_t{k} * kBaseStorageRecordSize;
    const auto field = [k] { return std::string("base storage #") + Dec(k); };
    StorageRecord& s = storages_[own_storage_count_ + k];
    s.base_storage = LoadU32(base + off);
    s.nbytes = LoadU64(base + off + 8);
    s.xxh3 = LoadU64(base + off + 16);
    RequireZero(r, off + 4, 4, [&] { return field() + " reserved"; });   // R98
    RequireZero(r, off + 24, 8, [&] { return field() + " reserved"; });  // R98
    if (s.base_storage >= layer_.base_storage_count) {                   // R99
      r.Fail(ErrorCode::kOutOfBounds, off, field() + " base_storage",
             "less than the layer's base_storage_count " + Dec(layer_.base_storage_count),
             Dec(s.base_storage));
    }
  }
}

ShardLayout Index::ShardLayoutOf(const TensorRecord& t) const {
  ShardLayout l;
  // Validated by Parse (R105-R109): cannot fail.
  ComputeShardLayout(sizes(t), t.ndim, t.shard_dim, ElementSize(t.dtype), tp_world_,
                     header_.alignment, &l);
  return l;
}

// §4.12 (format 1.4): the shard table, R103-R109 per record in order, then
// R110 over the tensors: a storage that holds a sharded tensor's slices is
// viewed only by tensors sharded the same way.
void Index::DecodeShards(const ByteReader& r) {
  const uint8_t* const base = head_.data();
  const uint32_t tensor_count = static_cast<uint32_t>(tensors_.size());
  std::vector<uint32_t> first_of(storages_.size(), kNone);  // storage -> its first sharded tensor
  for (uint32_t j = 0; j < shard_count_; ++j) {
    const uint64_t off = ShardRecordOffset(j);
    const uint32_t i = LoadU32(base + off);
    const uint32_t dim = LoadU32(base + off + 4);
    const std::string rec = "shard #" + Dec(j);
    if (i >= tensor_count) {  // R103
      r.Fail(ErrorCode::kOutOfBounds, off, rec + " tensor",
             "less than tensor_count " + Dec(tensor_count), Dec(i));
    }
    const uint32_t prev = j == 0 ? kNone : LoadU32(base + off - kShardRecordSize);
    if (j > 0 && i <= prev) {  // R104
      r.Fail(ErrorCode::kInvalidValue, off, rec + " tensor",
             "more than shard #" + Dec(j - 1) + "'s tensor " + Dec(prev) +
                 " (records sorted by tensor, one per tensor)",
             Dec(i));
    }
    TensorRecord& t = tensors_[i];
    ShardLayout layout;
    const ShardFault f = CheckShard(sizes(t), strides(t), t.ndim, t.storage_offset,
                                    ElementSize(t.dtype), t.role == Role::kSparseComponent, dim,
                                    tp_world_, header_.alignment, storages_[t.storage].nbytes,
                                    &layout);  // R105-R109
    if (f.rule != ShardFault::Rule::kNone) {
      using Rule = ShardFault::Rule;
      const ErrorCode code = f.rule == Rule::kDim || f.rule == Rule::kDivisible
                                 ? ErrorCode::kBadShape
                                 : ErrorCode::kInvalidValue;
      r.Fail(code, f.rule == Rule::kDim ? off + 4 : off,
             rec + " " + TensorField(i, t.name, f.field.c_str()), f.expected, f.found);
    }
    t.shard_dim = dim;
    if (first_of[t.storage] == kNone) first_of[t.storage] = i;
  }
  for (uint32_t i = 0; i < tensor_count; ++i) {  // R110
    const TensorRecord& t = tensors_[i];
    const uint32_t k = first_of[t.storage];
    if (k == kNone || k == i) continue;
    const TensorRecord& f = tensors_[k];
    const bool same = t.shard_dim == f.shard_dim && t.dtype == f.dtype && t.ndim == f.ndim &&
                      std::equal(sizes(t), sizes(t) + t.ndim, sizes(f));
    if (!same) {
      r.Fail(ErrorCode::kInvalidValue, TensorRecordOffset(i) + 8, TensorField(i, t.name, "storage"),
             "a storage that no sharded tensor views, or one sharded like tensor #" + Dec(k) +
                 " (same dim, dtype and sizes)",
             Dec(t.storage) + (t.shard_dim == kNone ? " (viewed whole)" : " (sharded otherwise)"));
    }
  }
}

}  // namespace tsar::format
