// The index decoder's sparse records, tensor groups and metadata (spec/FORMAT.md
// §4.6, §4.13, §4.7): R54-R66, R111, R67-R75 and R112. Called from Index::Decode
// (format/index.cc) once entries, tensors and dims are read.
#include <string>
#include <string_view>
#include <vector>

#include "format/index.h"
#include "format/index_rules.h"
#include "format/reader.h"

namespace tsar::format {

using detail::BlobString;
using detail::Dec;
using detail::RequireZero;
using detail::TensorField;

// §4.6 sparse records and §4.13 groups (layout kGroup): R54-R64 and R111 per
// record, then R65 and R66.
void Index::DecodeSparse(const ByteReader& r, uint64_t blob, uint64_t blob_size) {
  const uint8_t* const base = head_.data();
  const uint32_t entry_count = static_cast<uint32_t>(entries_.size());
  const uint32_t tensor_count = static_cast<uint32_t>(tensors_.size());
  const uint32_t dims_count = static_cast<uint32_t>(dims_.size());
  const uint32_t sparse_count = LoadU32(base + header_.index_offset + 12);
  const bool groups = (header_.flags & kFeatureTensorGroups) != 0;
  const auto dim_offset = [this](uint64_t k) { return table_offset_[5] + k * kDimSize; };
  sparse_.resize(sparse_count);
  for (uint32_t i = 0; i < sparse_count; ++i) {
    const uint64_t off = table_offset_[3] + uint64_t{i} * kSparseRecordSize;
    const auto field = [i] { return std::string("sparse #") + Dec(i); };
    SparseRecord& sp = sparse_[i];
    sp.name = BlobString(
        r, off, blob, blob_size, [&] { return field() + " name"; }, true);  // R54
    sp.entry = LoadU32(base + off + 8);
    if (sp.entry >= entry_count) {  // R55
      r.Fail(ErrorCode::kOutOfBounds, off + 8, field() + " entry",
             "less than entry_count " + Dec(entry_count), Dec(sp.entry));
    }
    const uint8_t layout = base[off + 12];
    const uint8_t max_layout = groups ? static_cast<uint8_t>(SparseLayout::kGroup) : kSparseLayoutMax;
    if (layout == 0 || layout > max_layout) {  // R56: layout 4 needs feature bit 3
      r.Fail(ErrorCode::kInvalidValue, off + 12, field() + " layout", "1-" + Dec(max_layout),
             Dec(layout));
    }
    sp.layout = static_cast<SparseLayout>(layout);
    const bool group = sp.layout == SparseLayout::kGroup;
    const uint8_t flags = base[off + 13];
    const uint8_t allowed = group ? 0 : kSparseFlagCoalesced;
    if (flags & ~allowed) {  // R57
      r.Fail(ErrorCode::kReservedNonZero, off + 13, field() + " flags",
             group ? "0 (a group has no flags)" : "bits 1-7 zero", "0x" + HexBytes(&flags, 1));
    }
    sp.coalesced = flags & kSparseFlagCoalesced;
    if (!group) {
      RequireZero(r, off + 14, 2, [&] { return field() + " reserved"; });  // R58
    } else {  // R111: a group's outer dtype, as R37
      const uint16_t code = LoadU16(base + off + 14);
      const auto dt = DTypeFromCode(code);
      const uint16_t max_dtype = MaxDTypeCode(header_.minor);
      if (!dt || code > max_dtype) {
        r.Fail(ErrorCode::kBadDtype, off + 14, field() + " dtype",
               "a dtype code of §5 (1-" + Dec(max_dtype) + ")", Dec(code));
      }
      sp.dtype = *dt;
    }
    sp.ndim = LoadU32(base + off + 16);
    sp.dims_index = LoadU32(base + off + 20);
    if (sp.ndim > kMaxNdim) {  // R59
      r.Fail(ErrorCode::kBadShape, off + 16, field() + " ndim", "at most " + Dec(kMaxNdim),
             Dec(sp.ndim));
    }
    // A group names sizes and strides, as a tensor record does.
    const uint32_t dims = group ? 2 * sp.ndim : sp.ndim;
    if (sp.dims_index > dims_count || dims > dims_count - sp.dims_index) {  // R60
      r.Fail(ErrorCode::kOutOfBounds, off + 20, field() + " dims_index",
             (group ? "2 * ndim" : "ndim") + std::string(" dims inside the dims table of ") +
                 Dec(dims_count),
             Dec(sp.dims_index));
    }
    for (uint32_t d = 0; d < dims; ++d) {  // R61
      if (dims_[sp.dims_index + d] < 0) {
        r.Fail(ErrorCode::kBadShape, dim_offset(uint64_t{sp.dims_index} + d),
               field() + (d < sp.ndim ? " size " + Dec(d) : " stride " + Dec(d - sp.ndim)),
               "at most 2^63-1", Dec(static_cast<uint64_t>(dims_[sp.dims_index + d])));
      }
    }
    sp.first_component = LoadU32(base + off + 24);
    sp.component_count = LoadU32(base + off + 28);
    if (group ? sp.component_count < 1 || sp.component_count > kMaxGroupMembers
              : sp.component_count != (sp.layout == SparseLayout::kCoo ? 2u : 3u)) {  // R62
      r.Fail(ErrorCode::kInvalidValue, off + 28, field() + " component_count",
             group ? "1 to " + Dec(kMaxGroupMembers) + " for a group"
                   : Dec(sp.layout == SparseLayout::kCoo ? 2 : 3),
             Dec(sp.component_count));
    }
    const EntryRecord& e = entries_[sp.entry];
    if (sp.first_component < e.first_tensor ||
        uint64_t{sp.first_component} + sp.component_count >
            uint64_t{e.first_tensor} + e.tensor_count) {  // R63
      r.Fail(ErrorCode::kOutOfBounds, off + 24, field() + " first_component",
             "components inside entry #" + Dec(sp.entry) + "'s tensors", Dec(sp.first_component));
    }
    for (uint32_t c = 0; c < sp.component_count; ++c) {  // R64
      if (tensors_[sp.first_component + c].sparse != i) {
        r.Fail(ErrorCode::kInvalidValue, TensorRecordOffset(sp.first_component + c) + 32,
               TensorField(sp.first_component + c, tensors_[sp.first_component + c].name, "sparse"),
               Dec(i), Dec(tensors_[sp.first_component + c].sparse));
      }
    }
  }
  for (uint32_t i = 0; i < tensor_count; ++i) {  // R65: every component is claimed by its record
    const TensorRecord& t = tensors_[i];
    if (t.sparse == kNone) continue;
    const SparseRecord& sp = sparse_[t.sparse];
    if (i < sp.first_component || i - sp.first_component >= sp.component_count) {
      r.Fail(ErrorCode::kInvalidValue, TensorRecordOffset(i) + 32, TensorField(i, t.name, "sparse"),
             "a sparse record whose components include it", Dec(t.sparse));
    }
  }

  // R66: names are unique per entry, tensors and sparse records together.
  // The tables built here serve lookups after open.
  // Sparse records are bucketed by entry first (a counting sort that keeps
  // table order), so the work is linear: scanning every sparse record for
  // every entry would let a hostile index cost entry_count * sparse_count.
  std::vector<uint32_t> bucket_start(uint64_t{entry_count} + 1, 0);
  for (const SparseRecord& sp : sparse_) ++bucket_start[sp.entry + 1];
  for (uint32_t e = 0; e < entry_count; ++e) bucket_start[e + 1] += bucket_start[e];
  std::vector<uint32_t> by_entry(sparse_count);
  {
    std::vector<uint32_t> next(bucket_start.begin(), bucket_start.end() - 1);
    for (uint32_t i = 0; i < sparse_count; ++i) by_entry[next[sparse_[i].entry]++] = i;
  }
  std::vector<std::string_view> names;
  tensor_names_.resize(entry_count);
  for (uint32_t e = 0; e < entry_count; ++e) {
    names.clear();
    const EntryRecord& er = entries_[e];
    for (uint32_t i = 0; i < er.tensor_count; ++i) {
      names.push_back(tensors_[er.first_tensor + i].name);
    }
    const uint32_t* sparse_ids = by_entry.data() + bucket_start[e];
    for (uint32_t k = bucket_start[e]; k < bucket_start[e + 1]; ++k) {
      names.push_back(sparse_[by_entry[k]].name);
    }
    if (auto d = tensor_names_[e].Build(names); d.first != kNone) {
      // Names the record (tensor or sparse) at list position k.
      const auto record = [&](uint32_t k, uint64_t* off) {
        if (k < er.tensor_count) {
          *off = TensorRecordOffset(er.first_tensor + k);
          return "tensor #" + Dec(er.first_tensor + k);
        }
        const uint32_t sp = sparse_ids[k - er.tensor_count];
        *off = table_offset_[3] + uint64_t{sp} * kSparseRecordSize;
        return "sparse #" + Dec(sp);
      };
      uint64_t off = 0, first_off = 0;
      const std::string second = record(d.second, &off);
      r.Fail(ErrorCode::kDuplicateName, off, second + " name",
             "a name unique in entry " + Quote(er.name),
             Quote(names[d.second]) + ", also " + record(d.first, &first_off));
    }
  }
}

// §4.7 metadata: R67-R75.
void Index::DecodeMetadata(const ByteReader& r, uint64_t blob, uint64_t blob_size) {
  const uint8_t* const base = head_.data();
  const uint32_t entry_count = static_cast<uint32_t>(entries_.size());
  const uint32_t metadata_count = LoadU32(base + header_.index_offset + 16);
  metadata_.resize(metadata_count);
  for (uint32_t i = 0; i < metadata_count; ++i) {
    const uint64_t off = table_offset_[4] + uint64_t{i} * kMetadataRecordSize;
    const auto field = [i] { return std::string("metadata #") + Dec(i); };
    MetadataRecord& m = metadata_[i];
    m.key = BlobString(
        r, off, blob, blob_size, [&] { return field() + " key"; }, true);  // R67
    const uint8_t type = base[off + 8];
    if (type == 0 || type > kMetaTypeMax) {  // R68
      r.Fail(ErrorCode::kInvalidValue, off + 8, field() + " type", "1-4", Dec(type));
    }
    m.type = static_cast<MetaType>(type);
    RequireZero(r, off + 9, 3, [&] { return field() + " reserved"; });  // R69
    m.entry = LoadU32(base + off + 12);
    if (m.entry != kNone && m.entry >= entry_count) {  // R70
      r.Fail(ErrorCode::kOutOfBounds, off + 12, field() + " entry",
             "0xffffffff or less than entry_count " + Dec(entry_count), Dec(m.entry));
    }
    const uint64_t value = LoadU64(base + off + 16);
    const uint64_t length = LoadU64(base + off + 24);
    if (m.type == MetaType::kInt || m.type == MetaType::kFloat) {
      if (length != 0) {  // R71
        r.Fail(ErrorCode::kInvalidValue, off + 24, field() + " value_length",
               "0 for integer and float values", Dec(length));
      }
      m.int_value = static_cast<int64_t>(value);
      m.float_value = BitsToDouble(value);
    } else {
      if (value > blob_size || length > blob_size - value) {  // R72
        r.Fail(ErrorCode::kOutOfBounds, off + 16, field() + " value",
               "a range inside the blob of " + Dec(blob_size) + " bytes",
               "offset " + Dec(value) + " length " + Dec(length));
      }
      m.bytes = std::string_view(reinterpret_cast<const char*>(head_.data() + blob + value),
                                 static_cast<size_t>(length));
      if (m.type == MetaType::kString && !IsValidUtf8(m.bytes)) {  // R73
        r.Fail(ErrorCode::kInvalidValue, off + 16, field() + " value", "valid UTF-8",
               Quote(m.bytes));
      }
    }
    if (i > 0) {
      const MetadataRecord& p = metadata_[i - 1];
      if (p.entry == m.entry && p.key == m.key) {  // R74
        r.Fail(ErrorCode::kDuplicateName, off, field() + " key", "a key unique in its scope",
               Quote(m.key));
      }
      if (p.entry > m.entry || (p.entry == m.entry && p.key > m.key)) {  // R75
        r.Fail(ErrorCode::kInvalidValue, off, field() + " key", "records sorted by (entry, key)",
               Quote(m.key) + " after " + Quote(p.key));
      }
    }
  }
}

// §4.13 (format 1.5): R112, every group has its description, a string
// metadata record "group:" + name in its entry. Records are sorted by (entry,
// key) (R75), so each lookup is a binary search.
void Index::CheckGroupDescriptions(const ByteReader& r) const {
  for (uint32_t i = 0; i < sparse_.size(); ++i) {
    const SparseRecord& sp = sparse_[i];
    if (sp.layout != SparseLayout::kGroup) continue;
    const std::string key = kGroupKeyPrefix + std::string(sp.name);
    const MetadataRecord* m = FindMetadata(sp.entry, key);
    if (m == nullptr || m->type != MetaType::kString) {
      static const char* const kTypes[] = {"", "string", "int", "float", "bytes"};
      r.Fail(ErrorCode::kInvalidValue, table_offset_[3] + uint64_t{i} * kSparseRecordSize,
             "sparse #" + Dec(i) + " name",
             "a metadata record " + Quote(key) + " of type string in entry #" + Dec(sp.entry),
             m == nullptr ? std::string("none")
                          : std::string("one of type ") + kTypes[static_cast<int>(m->type)]);
    }
  }
}

std::string_view Index::GroupDescription(uint32_t s) const {
  const MetadataRecord* m =
      FindMetadata(sparse_[s].entry, kGroupKeyPrefix + std::string(sparse_[s].name));
  return m != nullptr ? m->bytes : std::string_view();  // R112: there is one
}

const MetadataRecord* Index::FindMetadata(uint32_t entry, std::string_view key) const {
  size_t lo = 0, hi = metadata_.size();
  while (lo < hi) {  // the first record not before (entry, key)
    const size_t mid = lo + (hi - lo) / 2;
    const MetadataRecord& m = metadata_[mid];
    if (m.entry < entry || (m.entry == entry && m.key < key)) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  if (lo < metadata_.size() && metadata_[lo].entry == entry && metadata_[lo].key == key) {
    return &metadata_[lo];
  }
  return nullptr;
}

}  // namespace tsar::format
