// The validating decoder of spec/FORMAT.md §4 and §6. Rule numbers (R1...) in
// comments are the numbered reader-validation rules of §6.3, checked in order.
#include "format/index.h"

#include <cstdio>
#include <algorithm>
#include <cstring>
#include <utility>

#include "format/checksum.h"
#include "format/extent.h"
#include "format/index_rules.h"
#include "format/name_table.h"
#include "format/reader.h"
#include "format/tensor_parallel.h"
#include "format/values.h"

namespace tsar::format {

using detail::BlobString;
using detail::Dec;
using detail::RequireZero;
using detail::TensorField;

namespace {

// §4.10, §4.11: an index extension (the value tree, the layer record) starts
// at the first multiple of 8 after `end`, and the bytes before it are zero
// padding (R81 and R94, steps 1 and 2). Returns that start. `count_field`
// at `count_offset` is the count the failure names, `table` what must fit.
uint64_t ExtensionStart(const ByteReader& r, uint64_t end, uint64_t index_end, uint64_t index_size,
                        uint64_t count_offset, const char* count_field, const char* table,
                        const char* padding) {
  const uint64_t start = (end + 7) & ~uint64_t{7};
  if (start > index_end) {
    r.Fail(ErrorCode::kOutOfBounds, count_offset, count_field,
           std::string(table) + " that fits in index_size " + Dec(index_size), "no room left");
  }
  RequireZero(r, end, start - end, padding);
  return start;
}

}  // namespace

Header DecodeHeader(const uint8_t* data, uint64_t size, uint64_t file_size,
                    const std::string& path) {
  ByteReader r(data, size < file_size ? size : file_size, path);
  Header h;
  // R1: the magic comes first, so any foreign file is named as such.
  const size_t have = size < sizeof kMagic ? static_cast<size_t>(size) : sizeof kMagic;
  if (have == 0 || std::memcmp(data, kMagic, have) != 0) {
    r.Fail(ErrorCode::kBadMagic, 0, "magic", HexBytes(kMagic, sizeof kMagic),
           have == 0 ? "an empty file" : HexBytes(data, have));
  }
  r.Require(0, kHeaderSize, "header");  // R2
  h.major = r.U16(kOffMajor, "major");
  h.minor = r.U16(kOffMinor, "minor");
  if (h.major != kMajorVersion) {  // R3
    r.Fail(ErrorCode::kUnsupportedVersion, kOffMajor, "major", "major " + Dec(kMajorVersion),
           Dec(h.major));
  }
  h.header_size = r.U32(kOffHeaderSize, "header_size");
  const bool exact = h.minor <= kMinorVersion;
  if (exact ? h.header_size != kHeaderSize
            : (h.header_size < kHeaderSize || h.header_size > kMaxHeaderSize ||
               h.header_size % 8 != 0)) {  // R4
    r.Fail(ErrorCode::kInvalidValue, kOffHeaderSize, "header_size",
           exact ? Dec(kHeaderSize)
                 : "a multiple of 8 in [" + Dec(kHeaderSize) + ", " + Dec(kMaxHeaderSize) + "]",
           Dec(h.header_size));
  }
  h.file_size = r.U64(kOffFileSize, "file_size");
  if (file_size < h.file_size) {  // R5
    r.Fail(ErrorCode::kTruncated, kOffFileSize, "file_size",
           "a file of " + Dec(h.file_size) + " bytes", Dec(file_size) + " bytes");
  }
  if (file_size > h.file_size) {  // R6
    r.Fail(ErrorCode::kInvalidValue, kOffFileSize, "file_size",
           "the actual file size " + Dec(file_size), Dec(h.file_size));
  }
  h.index_offset = r.U64(kOffIndexOffset, "index_offset");
  if (h.index_offset != h.header_size) {  // R7
    r.Fail(ErrorCode::kInvalidValue, kOffIndexOffset, "index_offset",
           "header_size " + Dec(h.header_size), Dec(h.index_offset));
  }
  h.index_size = r.U64(kOffIndexSize, "index_size");
  if (h.index_size < kIndexHeaderSize || h.index_size > kMaxIndexSize) {  // R8
    r.Fail(ErrorCode::kInvalidValue, kOffIndexSize, "index_size",
           "a value in [" + Dec(kIndexHeaderSize) + ", " + Dec(kMaxIndexSize) + "]",
           Dec(h.index_size));
  }
  const uint64_t index_end = h.index_offset + h.index_size;  // both bounded: no overflow
  if (index_end > h.file_size) {                             // R9
    r.Fail(ErrorCode::kOutOfBounds, kOffIndexSize, "index_size",
           "index_offset + index_size <= file_size " + Dec(h.file_size), Dec(h.index_size));
  }
  h.data_offset = r.U64(kOffDataOffset, "data_offset");
  uint64_t want_data = 0;
  AlignUp(index_end, kMinAlignment, &want_data);
  if (h.data_offset != want_data) {  // R10
    r.Fail(ErrorCode::kInvalidValue, kOffDataOffset, "data_offset",
           Dec(want_data) + " (index end rounded up to 64)", Dec(h.data_offset));
  }
  if (h.data_offset > h.file_size) {  // R11
    r.Fail(ErrorCode::kOutOfBounds, kOffDataOffset, "data_offset",
           "at most file_size " + Dec(h.file_size), Dec(h.data_offset));
  }
  h.alignment = r.U32(kOffAlignment, "alignment");
  if (h.alignment < kMinAlignment || h.alignment > kMaxAlignment ||
      (h.alignment & (h.alignment - 1)) != 0) {  // R12
    r.Fail(ErrorCode::kInvalidValue, kOffAlignment, "alignment", "a power of two in [64, 2^30]",
           Dec(h.alignment));
  }
  h.flags = r.U32(kOffFlags, "flags");
  if (h.minor == 0 && h.flags != 0) {  // R13
    r.Fail(ErrorCode::kReservedNonZero, kOffFlags, "flags", "0", Dec(h.flags));
  }
  // R79: a bit this reader does not implement, or one that the archive's own
  // minor does not define (bit 2 is format 1.4's).
  const uint16_t defined_by = h.minor < kMinorVersion ? h.minor : kMinorVersion;
  if ((h.flags & ~FeaturesOfMinor(defined_by)) != 0) {
    char found[96];
    if (h.minor > kMinorVersion) {
      std::snprintf(found, sizeof found, "0x%x (the archive needs a reader of format 1.%u)",
                    h.flags, h.minor);
    } else {
      std::snprintf(found, sizeof found, "0x%x (bits that format 1.%u does not define)", h.flags,
                    h.minor);
    }
    char want[48];
    std::snprintf(want, sizeof want, "feature bits of format 1.%u (0x%x)", defined_by,
                  FeaturesOfMinor(defined_by));
    r.Fail(ErrorCode::kUnsupportedVersion, kOffFlags, "flags", want, found);
  }
  h.index_xxh3 = r.U64(kOffIndexXxh3, "index_xxh3");
  return h;
}

Index Index::ParseBytes(const uint8_t* data, uint64_t size, const std::string& path) {
  const Header h = DecodeHeader(data, size, size, path);
  return Parse(std::vector<uint8_t>(data, data + h.data_offset), size, path);
}

Index Index::Parse(std::vector<uint8_t> head, uint64_t file_size, const std::string& path) {
  Index index;
  index.header_ = DecodeHeader(head.data(), head.size(), file_size, path);
  if (head.size() < index.header_.data_offset) {  // R14
    ByteReader(head.data(), head.size(), path).Require(0, index.header_.data_offset, "index");
  }
  head.resize(index.header_.data_offset);
  index.head_ = std::move(head);
  index.Decode(path);
  return index;
}

uint64_t Index::TensorRecordOffset(uint32_t i) const {
  return table_offset_[2] + uint64_t{i} * kTensorRecordSize;
}
uint64_t Index::StorageRecordOffset(uint32_t i) const {
  if (i >= own_storage_count_) {
    return table_offset_[10] + uint64_t{i - own_storage_count_} * kBaseStorageRecordSize;
  }
  return table_offset_[1] + uint64_t{i} * kStorageRecordSize;
}

void Index::Decode(const std::string& path) {
  const Header& h = header_;
  const ByteReader r(head_.data(), head_.size(), path);
  // Record fields are read unchecked: R19 and R20 proved every table lies
  // inside the index, and each record's fields inside its record.
  const uint8_t* const base = head_.data();
  const uint64_t index_end = h.index_offset + h.index_size;

  // R15: the checksum guards everything below, so it is checked first.
  const uint64_t sum = IndexChecksum(head_.data(), index_end);
  if (sum != h.index_xxh3) {
    char want[32], got[32];
    std::snprintf(want, sizeof want, "0x%016llx", static_cast<unsigned long long>(sum));
    std::snprintf(got, sizeof got, "0x%016llx", static_cast<unsigned long long>(h.index_xxh3));
    r.Fail(ErrorCode::kChecksumMismatch, kOffIndexXxh3, "index_xxh3",
           std::string(want) + " (XXH3-64 of header and index)", got);
  }
  RequireZero(r, index_end, h.data_offset - index_end, "index padding");  // R16

  // §4.2 index header: R17 (reserved), R18 (tables fit), R19 (blob fits), R20.
  const uint64_t ih = h.index_offset;
  const uint32_t entry_count = r.U32(ih + 0, "entry_count");
  const uint32_t storage_count = r.U32(ih + 4, "storage_count");
  const uint32_t tensor_count = r.U32(ih + 8, "tensor_count");
  const uint32_t sparse_count = r.U32(ih + 12, "sparse_count");
  const uint32_t metadata_count = r.U32(ih + 16, "metadata_count");
  const uint32_t dims_count = r.U32(ih + 20, "dims_count");
  const uint64_t blob_size = r.U64(ih + 24, "blob_size");
  const bool tree = (h.flags & kFeatureValueTree) != 0;
  const bool layers = (h.flags & kFeatureLayers) != 0;
  const uint32_t value_count = tree ? r.U32(ih + 32, "value_count") : 0;
  const uint32_t link_count = tree ? r.U32(ih + 36, "link_count") : 0;
  const uint32_t ref_count = layers ? r.U32(ih + 40, "base_storage_count") : 0;
  const bool tp = (h.flags & kFeatureTensorParallel) != 0;
  tp_world_ = tp ? r.U32(ih + 44, "tp_world") : 0;
  shard_count_ = tp ? r.U32(ih + 48, "shard_count") : 0;
  // R17: whatever no feature bit gives a meaning, in offset order.
  if (!tree) RequireZero(r, ih + 32, 8, "index reserved");
  if (!layers) RequireZero(r, ih + 40, 4, "index reserved");
  if (!tp) RequireZero(r, ih + 44, 8, "index reserved");
  RequireZero(r, ih + 52, 12, "index reserved");
  if (tree && value_count == 0) {  // R80
    r.Fail(ErrorCode::kInvalidValue, ih + 32, "value_count", "at least 1 (the root)", "0");
  }
  if (tp && (tp_world_ < 2 || tp_world_ > kMaxWorld)) {  // R100
    r.Fail(ErrorCode::kInvalidValue, ih + 44, "tp_world", "2 to " + Dec(kMaxWorld),
           Dec(tp_world_));
  }
  if (tp && shard_count_ == 0) {  // R101
    r.Fail(ErrorCode::kInvalidValue, ih + 48, "shard_count", "at least 1 (a sharded tensor)", "0");
  }
  const uint64_t counts[6] = {entry_count,  storage_count,  tensor_count,
                              sparse_count, metadata_count, dims_count};
  const uint64_t record_sizes[6] = {kEntryRecordSize,  kStorageRecordSize,  kTensorRecordSize,
                                    kSparseRecordSize, kMetadataRecordSize, kDimSize};
  static const char* const kCountFields[6] = {"entry_count",  "storage_count",  "tensor_count",
                                              "sparse_count", "metadata_count", "dims_count"};
  uint64_t pos = ih + kIndexHeaderSize;
  for (int t = 0; t < 6; ++t) {
    table_offset_[t] = pos;
    const uint64_t bytes = counts[t] * record_sizes[t];  // < 2^32 * 48: no overflow
    if (bytes > index_end - pos) {                       // R18
      r.Fail(ErrorCode::kOutOfBounds, ih + 4 * t, kCountFields[t],
             "a table that fits in index_size " + Dec(h.index_size),
             Dec(counts[t]) + " records of " + Dec(record_sizes[t]) + " bytes");
    }
    pos += bytes;
  }
  table_offset_[6] = pos;
  if (blob_size > index_end - pos) {  // R19
    r.Fail(ErrorCode::kOutOfBounds, ih + 24, "blob_size",
           "at most " + Dec(index_end - pos) + " (the rest of the index)", Dec(blob_size));
  }
  const uint64_t blob = pos;
  // §4.10: the value and link tables follow the blob at a multiple of 8.
  uint64_t ext_end = blob + blob_size;
  if (tree) {
    const uint64_t values_start =
        ExtensionStart(r, ext_end, index_end, h.index_size, ih + 32, "value_count", "a value table",
                       "value padding");  // R81
    const uint64_t tables[2] = {uint64_t{value_count} * kValueRecordSize,
                                uint64_t{link_count} * kLinkSize};
    ext_end = values_start;
    for (int t = 0; t < 2; ++t) {
      if (tables[t] > index_end - ext_end) {  // R81
        r.Fail(ErrorCode::kOutOfBounds, ih + 32 + 4 * t, t == 0 ? "value_count" : "link_count",
               "a table that fits in index_size " + Dec(h.index_size),
               Dec(t == 0 ? value_count : link_count) + " records of " +
                   Dec(t == 0 ? kValueRecordSize : kLinkSize) + " bytes");
      }
      table_offset_[7 + t] = ext_end;
      ext_end += tables[t];
    }
  }
  // §4.11: the layer record and base storage table follow, at a multiple of 8.
  if (layers) {
    const uint64_t layer_start =
        ExtensionStart(r, ext_end, index_end, h.index_size, ih + 40, "base_storage_count",
                       "a layer record", "layer padding");  // R94
    const uint64_t bytes = kLayerRecordSize + uint64_t{ref_count} * kBaseStorageRecordSize;
    if (bytes > index_end - layer_start) {  // R94
      r.Fail(ErrorCode::kOutOfBounds, ih + 40, "base_storage_count",
             "a layer record and base storage table that fit in index_size " + Dec(h.index_size),
             Dec(ref_count) + " records of " + Dec(kBaseStorageRecordSize) + " bytes");
    }
    table_offset_[9] = layer_start;
    table_offset_[10] = layer_start + kLayerRecordSize;
    ext_end = layer_start + bytes;
  }
  // §4.12: the shard table follows, at a multiple of 8.
  if (tp) {
    const uint64_t start = ExtensionStart(r, ext_end, index_end, h.index_size, ih + 48,
                                          "shard_count", "a shard table", "shard padding");  // R102
    const uint64_t bytes = uint64_t{shard_count_} * kShardRecordSize;
    if (bytes > index_end - start) {  // R102
      r.Fail(ErrorCode::kOutOfBounds, ih + 48, "shard_count",
             "a shard table that fits in index_size " + Dec(h.index_size),
             Dec(shard_count_) + " records of " + Dec(kShardRecordSize) + " bytes");
    }
    table_offset_[11] = start;
    ext_end = start + bytes;
  }
  if (h.minor <= kMinorVersion && ext_end != index_end) {  // R20
    r.Fail(ErrorCode::kInvalidValue, kOffIndexSize, "index_size",
           Dec(ext_end - ih) + " (the sum of the tables)", Dec(h.index_size));
  }

  // §4.3 entries: R21-R24 on names, R25, R26; then R27 and R28. Everything
  // after refers to entries, so they come first (metadata is decoded last).
  entries_.resize(entry_count);
  std::vector<std::string_view> names;
  names.reserve(entry_count);
  uint64_t next_tensor = 0;
  for (uint32_t i = 0; i < entry_count; ++i) {
    const uint64_t off = table_offset_[0] + uint64_t{i} * kEntryRecordSize;
    const auto field = [i] { return std::string("entry #") + Dec(i); };
    EntryRecord& e = entries_[i];
    e.name = BlobString(
        r, off, blob, blob_size, [&] { return field() + " name"; }, true);
    e.first_tensor = LoadU32(base + off + 8);
    e.tensor_count = LoadU32(base + off + 12);
    if (e.first_tensor != next_tensor) {  // R25
      r.Fail(ErrorCode::kInvalidValue, off + 8, field() + " first_tensor",
             Dec(next_tensor) + " (entries partition the tensor table in order)",
             Dec(e.first_tensor));
    }
    next_tensor += e.tensor_count;
    if (next_tensor > tensor_count) {  // R26
      r.Fail(ErrorCode::kOutOfBounds, off + 12, field() + " tensor_count",
             "at most " + Dec(tensor_count - e.first_tensor), Dec(e.tensor_count));
    }
    names.push_back(e.name);
  }
  if (next_tensor != tensor_count) {  // R27
    r.Fail(ErrorCode::kInvalidValue, ih + 8, "tensor_count",
           Dec(next_tensor) + " (the sum of the entries' tensor_count)", Dec(tensor_count));
  }
  if (auto d = entry_names_.Build(names); d.first != kNone) {  // R28
    r.Fail(ErrorCode::kDuplicateName, table_offset_[0] + uint64_t{d.second} * kEntryRecordSize,
           "entry #" + Dec(d.second) + " name", "a name unique among entries",
           Quote(names[d.second]) + ", also entry #" + Dec(d.first));
  }

  // §4.4 storages: R29-R33 per record, then R34.
  storages_.resize(storage_count);
  uint64_t prev_end = h.data_offset;
  for (uint32_t i = 0; i < storage_count; ++i) {
    const uint64_t off = table_offset_[1] + uint64_t{i} * kStorageRecordSize;
    const auto field = [i] { return std::string("storage #") + Dec(i); };
    StorageRecord& s = storages_[i];
    s.offset = LoadU64(base + off);
    s.nbytes = LoadU64(base + off + 8);
    s.xxh3 = LoadU64(base + off + 16);
    RequireZero(r, off + 24, 8, [&] { return field() + " reserved"; });  // R29
    if (s.offset > h.file_size || s.nbytes > h.file_size - s.offset) {   // R30
      r.Fail(ErrorCode::kOutOfBounds, off + 8, field() + " nbytes",
             "a range inside the file of " + Dec(h.file_size) + " bytes",
             "offset " + Dec(s.offset) + " nbytes " + Dec(s.nbytes));
    }
    const uint64_t align = s.nbytes >= h.alignment ? h.alignment : kMinAlignment;
    if (s.offset % align != 0) {  // R31
      r.Fail(ErrorCode::kMisaligned, off, field() + " offset", "a multiple of " + Dec(align),
             Dec(s.offset));
    }
    if (s.offset < prev_end) {  // R32
      r.Fail(ErrorCode::kOverlap, off, field() + " offset",
             "at least " + Dec(prev_end) + " (the end of the previous storage or index)",
             Dec(s.offset));
    }
    uint64_t want = 0;
    AlignUp(prev_end, align, &want);  // prev_end <= file_size: no overflow
    if (s.offset != want) {           // R33
      r.Fail(ErrorCode::kInvalidValue, off, field() + " offset",
             Dec(want) + " (storages are packed in order without holes)", Dec(s.offset));
    }
    prev_end = s.offset + s.nbytes;
  }
  if (prev_end != h.file_size) {  // R34
    r.Fail(ErrorCode::kInvalidValue, kOffFileSize, "file_size",
           Dec(prev_end) + " (the end of the last storage)", Dec(h.file_size));
  }
  own_storage_count_ = storage_count;
  if (layers) DecodeLayer(r, blob, blob_size, ref_count);

  // §4.8 dims, needed by tensors and sparse records.
  const auto dim_offset = [this](uint64_t k) { return table_offset_[5] + k * kDimSize; };
  dims_.resize(dims_count);
  for (uint32_t i = 0; i < dims_count; ++i) {
    dims_[i] = static_cast<int64_t>(LoadU64(head_.data() + table_offset_[5] + uint64_t{i} * 8));
  }

  // §4.5 tensors: R35-R47 per record field (R77 after R39), then R48-R53 on
  // the view (R78 in place of R50 for an empty view).
  tensors_.resize(tensor_count);
  uint32_t entry = 0;
  for (uint32_t i = 0; i < tensor_count; ++i) {
    while (entry < entry_count &&
           i >= entries_[entry].first_tensor + uint64_t{entries_[entry].tensor_count}) {
      ++entry;
    }
    const uint64_t off = TensorRecordOffset(i);
    TensorRecord& t = tensors_[i];
    t.entry = entry;
    t.name = BlobString(
        r, off, blob, blob_size, [i] { return "tensor #" + Dec(i) + " name"; }, true);  // R35
    auto field = [&](const char* f) { return TensorField(i, t.name, f); };
    t.storage = LoadU32(base + off + 8);
    if (t.storage >= storages_.size()) {  // R36
      r.Fail(ErrorCode::kOutOfBounds, off + 8, field("storage"),
             layers ? "less than storage_count + base_storage_count " + Dec(storages_.size())
                    : "less than storage_count " + Dec(storage_count),
             Dec(t.storage));
    }
    const uint16_t dtype = LoadU16(base + off + 12);
    const auto dt = DTypeFromCode(dtype);
    const uint16_t max_dtype = MaxDTypeCode(header_.minor);
    if (!dt || dtype > max_dtype) {  // R37: codes 19-22 need minor 3
      r.Fail(ErrorCode::kBadDtype, off + 12, field("dtype"),
             "a dtype code of §5 (1-" + Dec(max_dtype) + ")" +
                 (dt ? " in format 1." + Dec(header_.minor) + "; code " + Dec(dtype) +
                           " needs minor 3"
                     : std::string()),
             Dec(dtype));
    }
    t.dtype = *dt;
    const uint8_t role = base[off + 14];
    if (role > kRoleMax) {  // R38
      r.Fail(ErrorCode::kInvalidValue, off + 14, field("role"), "0-3", Dec(role));
    }
    t.role = static_cast<Role>(role);
    const uint8_t flags = base[off + 15];
    if (flags & ~kTensorFlagRequiresGrad) {  // R39
      r.Fail(ErrorCode::kReservedNonZero, off + 15, field("flags"), "bits 1-7 zero",
             "0x" + HexBytes(&flags, 1));
    }
    t.requires_grad = flags & kTensorFlagRequiresGrad;
    // R77, checked here because dtype (R37) and flags are now known: LibTorch
    // refuses requires_grad on any dtype that is not floating-point or complex.
    if (t.requires_grad && !DTypeCodeMayRequireGrad(dtype)) {
      r.Fail(ErrorCode::kInvalidValue, off + 15, field("requires_grad"),
             "0 with dtype " + std::string(DTypeName(t.dtype)) +
                 " (only floating-point and complex dtypes, codes 7-15 and 19-22, may require grad)",
             "1");
    }
    t.ndim = LoadU32(base + off + 16);
    if (t.ndim > kMaxNdim) {  // R40
      r.Fail(ErrorCode::kBadShape, off + 16, field("ndim"), "at most " + Dec(kMaxNdim),
             Dec(t.ndim));
    }
    t.dims_index = LoadU32(base + off + 20);
    if (t.dims_index > dims_count || 2 * uint64_t{t.ndim} > dims_count - t.dims_index) {  // R41
      r.Fail(ErrorCode::kOutOfBounds, off + 20, field("dims_index"),
             "2 * ndim dims inside the dims table of " + Dec(dims_count),
             Dec(t.dims_index) + " with ndim " + Dec(t.ndim));
    }
    t.storage_offset = LoadU64(base + off + 24);
    t.sparse = LoadU32(base + off + 32);
    if ((t.role == Role::kSparseComponent) != (t.sparse != kNone)) {  // R42
      r.Fail(ErrorCode::kInvalidValue, off + 32, field("sparse"),
             t.role == Role::kSparseComponent ? "a sparse record index for role 3"
                                              : "0xffffffff for roles 0-2",
             Dec(t.sparse));
    }
    if (t.sparse != kNone && t.sparse >= sparse_count) {  // R43
      r.Fail(ErrorCode::kOutOfBounds, off + 32, field("sparse"),
             "less than sparse_count " + Dec(sparse_count), Dec(t.sparse));
    }
    const uint8_t device_type = base[off + 36];
    if (device_type > kDeviceTypeMax) {  // R44
      r.Fail(ErrorCode::kInvalidValue, off + 36, field("device_type"), "0-2", Dec(device_type));
    }
    t.device_type = static_cast<DeviceType>(device_type);
    RequireZero(r, off + 37, 1, [&] { return field("reserved"); });  // R45
    t.device_index = LoadU16(base + off + 38);
    if (t.device_index != 0 && t.device_type != DeviceType::kCuda) {  // R46
      r.Fail(ErrorCode::kInvalidValue, off + 38, field("device_index"),
             "0 unless device_type is 2 (cuda)", Dec(t.device_index));
    }
    RequireZero(r, off + 40, 8, [&] { return field("reserved"); });  // R47

    // R48-R53 and R78: the view must stay inside its storage, and an empty
    // view's non-zero sizes must multiply to at most 2^63-1, in checked
    // arithmetic shared with the encoder (format/extent.h).
    const int64_t* sizes = dims_.data() + t.dims_index;
    const int64_t* strides = sizes + t.ndim;
    const uint64_t esize = ElementSize(t.dtype);
    const ViewExtent v = ComputeViewExtent(sizes, strides, t.ndim, t.storage_offset, esize);
    if (v.fault != ViewExtent::Fault::kNone) {
      using Fault = ViewExtent::Fault;
      const ViewFaultText text = DescribeViewFault(v, sizes, strides, t.storage_offset, esize);
      const bool on_size = v.fault == Fault::kSizeNegative || v.fault == Fault::kNumelOverflow ||
                           v.fault == Fault::kEmptyOverflow;
      const bool on_stride = v.fault == Fault::kStrideNegative || v.fault == Fault::kLastOverflow;
      // A size or stride fault is reported at that value's dims-table entry.
      const uint64_t at = on_size     ? dim_offset(uint64_t{t.dims_index} + v.dim)
                          : on_stride ? dim_offset(uint64_t{t.dims_index} + t.ndim + v.dim)
                                      : off + 24;
      const bool bad_shape = v.fault == Fault::kSizeNegative || v.fault == Fault::kStrideNegative;
      r.Fail(bad_shape ? ErrorCode::kBadShape : ErrorCode::kOverflow, at, field(text.field.c_str()),
             text.expected, text.found);
    }
    const StorageRecord& s = storages_[t.storage];
    if (v.end > s.nbytes) {  // R53
      r.Fail(ErrorCode::kOutOfBounds, off + 24, field("extent"),
             "at most storage #" + Dec(t.storage) + " nbytes " + Dec(s.nbytes),
             Dec(v.end) + " bytes");
    }
    t.numel = v.numel;
    t.nbytes_spanned = v.end - v.begin;
  }
  if (tp) DecodeShards(r);  // §4.12: R103-R110

  DecodeSparse(r, blob, blob_size);  // §4.6, §4.13: R54-R66, R111
  DecodeMetadata(r, blob, blob_size);  // §4.7: R67-R75
  if (h.flags & kFeatureTensorGroups) CheckGroupDescriptions(r);  // §4.13: R112

  // §4.10 the value tree (format 1.1): R82-R93.
  if (tree) {
    ValueScope scope;
    scope.blob = blob;
    scope.blob_size = blob_size;
    scope.entry_count = entry_count;
    scope.link_count_offset = ih + 36;
    scope.component.resize(tensor_count);
    for (uint32_t i = 0; i < tensor_count; ++i)
      scope.component[i] = tensors_[i].role == Role::kSparseComponent;
    DecodeValues(r, table_offset_[7], value_count, table_offset_[8], link_count, scope, &values_,
                 &links_);
  }
}

}  // namespace tsar::format
