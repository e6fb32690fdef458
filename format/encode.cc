// The deterministic encoder of spec/FORMAT.md §4; its layout rules are §4.4
// and its ordering rules §4.9. Everything it writes passes Index::Parse.
#include "format/encode.h"

#include <algorithm>
#include <unordered_set>

#include "format/checksum.h"
#include "format/endian.h"
#include "format/extent.h"
#include "format/reader.h"
#include "tsar/error.h"

namespace tsar::format {
namespace {

[[noreturn]] void Misuse(ErrorCode code, const std::string& message) {
  throw Error(code, "", std::nullopt, message);
}

void CheckName(const std::string& what, const std::string& name) {
  if (name.empty()) Misuse(ErrorCode::kInvalidArgument, what + ": name: expected a non-empty name, found \"\"");
  if (name.size() > kMaxNameLength) {
    Misuse(ErrorCode::kInvalidArgument, what + " " + Quote(name) + ": name: expected at most " +
                                            std::to_string(kMaxNameLength) + " bytes, found " +
                                            std::to_string(name.size()));
  }
  if (!IsValidUtf8(name)) {
    Misuse(ErrorCode::kInvalidArgument, what + " " + Quote(name) + ": name: expected valid UTF-8");
  }
}

bool MetaLess(const MetadataSpec& a, const MetadataSpec& b) {
  return a.entry != b.entry ? a.entry < b.entry : a.key < b.key;
}

}  // namespace

IndexBuilder::IndexBuilder(uint32_t alignment) : alignment_(alignment) {
  if (alignment < kMinAlignment || alignment > kMaxAlignment || (alignment & (alignment - 1))) {
    Misuse(ErrorCode::kInvalidArgument,
           "alignment: expected a power of two in [64, 2^30], found " + std::to_string(alignment));
  }
}

uint32_t IndexBuilder::AddEntry(const std::string& name) {
  CheckName("entry", name);
  for (const auto& e : entries_) {
    if (e.name == name) Misuse(ErrorCode::kDuplicateName, "entry " + Quote(name) + ": name: expected a unique entry name, found it twice");
  }
  entries_.push_back({name, static_cast<uint32_t>(tensors_.size()), 0});
  return static_cast<uint32_t>(entries_.size() - 1);
}

uint32_t IndexBuilder::AddStorage(uint64_t nbytes) {
  if (planned_) Misuse(ErrorCode::kInvalidArgument, "AddStorage after Plan");
  storage_nbytes_.push_back(nbytes);
  storage_xxh3_.push_back(Xxh3(nullptr, 0));
  return static_cast<uint32_t>(storage_nbytes_.size() - 1);
}

uint32_t IndexBuilder::AddTensor(TensorSpec t) {
  if (planned_) Misuse(ErrorCode::kInvalidArgument, "AddTensor after Plan");
  if (entries_.empty()) Misuse(ErrorCode::kInvalidArgument, "AddTensor before AddEntry");
  CheckName("tensor", t.name);
  const std::string what = "tensor " + Quote(t.name) + ": ";
  if (t.storage >= storage_nbytes_.size()) {
    Misuse(ErrorCode::kInvalidArgument, what + "storage: expected less than " +
                                            std::to_string(storage_nbytes_.size()) + ", found " +
                                            std::to_string(t.storage));
  }
  if (t.sizes.size() != t.strides.size() || t.sizes.size() > kMaxNdim) {
    Misuse(ErrorCode::kInvalidArgument, what + "shape: expected sizes and strides of equal rank <= 64");
  }
  // The decoder's own arithmetic (R48-R53), so both accept the same views.
  const uint64_t esize = ElementSize(t.dtype);
  const ViewExtent v = ComputeViewExtent(t.sizes.data(), t.strides.data(),
                                         static_cast<uint32_t>(t.sizes.size()), t.storage_offset,
                                         esize);
  if (v.fault != ViewExtent::Fault::kNone) {
    const ViewFaultText text =
        DescribeViewFault(v, t.sizes.data(), t.strides.data(), t.storage_offset, esize);
    const bool negative = v.fault == ViewExtent::Fault::kSizeNegative ||
                          v.fault == ViewExtent::Fault::kStrideNegative;
    Misuse(negative ? ErrorCode::kInvalidArgument : ErrorCode::kOverflow,
           what + text.field + ": expected " + text.expected + ", found " + text.found);
  }
  if (v.end > storage_nbytes_[t.storage]) {
    Misuse(ErrorCode::kInvalidArgument,
           what + "extent: expected at most storage nbytes " +
               std::to_string(storage_nbytes_[t.storage]) + ", found " + std::to_string(v.end));
  }
  Entry& e = entries_.back();
  if (t.sparse != kNone) t.role = Role::kSparseComponent;
  tensors_.push_back(std::move(t));
  ++e.tensor_count;
  return static_cast<uint32_t>(tensors_.size() - 1);
}

uint32_t IndexBuilder::AddSparse(SparseSpec s) {
  if (entries_.empty()) Misuse(ErrorCode::kInvalidArgument, "AddSparse before AddEntry");
  CheckName("sparse tensor", s.name);
  sparse_.push_back({std::move(s), static_cast<uint32_t>(entries_.size() - 1)});
  return static_cast<uint32_t>(sparse_.size() - 1);
}

void IndexBuilder::AddMetadata(MetadataSpec m) {
  if (m.key.empty() || m.key.size() > kMaxNameLength || !IsValidUtf8(m.key)) {
    Misuse(ErrorCode::kInvalidArgument,
           "metadata " + Quote(m.key) + ": key: expected 1 to 65535 bytes of UTF-8");
  }
  if (m.entry != kNone && m.entry >= entries_.size()) {
    Misuse(ErrorCode::kInvalidArgument, "metadata " + Quote(m.key) + ": entry: no such entry");
  }
  if (m.type == MetaType::kString && !IsValidUtf8(m.bytes)) {
    Misuse(ErrorCode::kInvalidArgument, "metadata " + Quote(m.key) + ": value: expected valid UTF-8");
  }
  for (const auto& o : metadata_) {
    if (o.entry == m.entry && o.key == m.key) {
      Misuse(ErrorCode::kDuplicateName, "metadata " + Quote(m.key) + ": key: expected a unique key, found it twice");
    }
  }
  if (m.type == MetaType::kInt || m.type == MetaType::kFloat) m.bytes.clear();
  metadata_.push_back(std::move(m));
}

void IndexBuilder::Plan() {
  if (planned_) return;
  // Names are unique per entry, sparse names included (§6 R66).
  for (uint32_t e = 0; e < entries_.size(); ++e) {
    std::unordered_set<std::string_view> seen;
    for (uint32_t i = 0; i < entries_[e].tensor_count; ++i) {
      const std::string& n = tensors_[entries_[e].first_tensor + i].name;
      if (!seen.insert(n).second) {
        Misuse(ErrorCode::kDuplicateName, "tensor " + Quote(n) + ": name: expected a name unique in entry " +
                                              Quote(entries_[e].name) + ", found it twice");
      }
    }
    for (const auto& s : sparse_) {
      if (s.entry == e && !seen.insert(s.spec.name).second) {
        Misuse(ErrorCode::kDuplicateName, "sparse tensor " + Quote(s.spec.name) + ": name: expected a unique name");
      }
    }
  }
  std::stable_sort(metadata_.begin(), metadata_.end(), MetaLess);

  uint64_t dims = 0, blob = 0;
  for (const auto& e : entries_) blob += e.name.size();
  for (const auto& t : tensors_) {
    dims += 2 * t.sizes.size();
    blob += t.name.size();
  }
  for (const auto& s : sparse_) {
    dims += s.spec.sizes.size();
    blob += s.spec.name.size();
  }
  for (const auto& m : metadata_) blob += m.key.size() + m.bytes.size();
  index_size_ = kIndexHeaderSize + entries_.size() * kEntryRecordSize +
                storage_nbytes_.size() * kStorageRecordSize + tensors_.size() * kTensorRecordSize +
                sparse_.size() * kSparseRecordSize + metadata_.size() * kMetadataRecordSize +
                dims * kDimSize + blob;
  if (index_size_ > kMaxIndexSize) {
    Misuse(ErrorCode::kInvalidArgument, "index: expected at most 2 GiB, found " + std::to_string(index_size_) + " bytes");
  }
  AlignUp(kHeaderSize + index_size_, kMinAlignment, &data_offset_);
  uint64_t pos = data_offset_;
  storage_offsets_.resize(storage_nbytes_.size());
  for (size_t i = 0; i < storage_nbytes_.size(); ++i) {
    const uint64_t align = storage_nbytes_[i] >= alignment_ ? alignment_ : kMinAlignment;
    if (!AlignUp(pos, align, &pos) || !CheckedAdd(pos, storage_nbytes_[i], &file_size_)) {
      Misuse(ErrorCode::kOverflow, "storage #" + std::to_string(i) + ": offset: expected below 2^64");
    }
    storage_offsets_[i] = pos;
    pos = file_size_;
  }
  file_size_ = pos;
  planned_ = true;
}

std::vector<uint8_t> IndexBuilder::EncodeHead() const {
  if (!planned_) Misuse(ErrorCode::kInvalidArgument, "EncodeHead before Plan");
  std::vector<uint8_t> out(data_offset_, 0);
  uint8_t* p = out.data();
  std::copy(kMagic, kMagic + sizeof kMagic, p);
  StoreU16(p + kOffMajor, kMajorVersion);
  StoreU16(p + kOffMinor, kMinorVersion);
  StoreU32(p + kOffHeaderSize, kHeaderSize);
  StoreU64(p + kOffFileSize, file_size_);
  StoreU64(p + kOffIndexOffset, kHeaderSize);
  StoreU64(p + kOffIndexSize, index_size_);
  StoreU64(p + kOffDataOffset, data_offset_);
  StoreU32(p + kOffAlignment, alignment_);

  uint32_t dims_count = 0;
  for (const auto& t : tensors_) dims_count += 2 * static_cast<uint32_t>(t.sizes.size());
  for (const auto& s : sparse_) dims_count += static_cast<uint32_t>(s.spec.sizes.size());
  uint8_t* ih = p + kHeaderSize;
  StoreU32(ih + 0, static_cast<uint32_t>(entries_.size()));
  StoreU32(ih + 4, static_cast<uint32_t>(storage_nbytes_.size()));
  StoreU32(ih + 8, static_cast<uint32_t>(tensors_.size()));
  StoreU32(ih + 12, static_cast<uint32_t>(sparse_.size()));
  StoreU32(ih + 16, static_cast<uint32_t>(metadata_.size()));
  StoreU32(ih + 20, dims_count);

  uint8_t* entry_p = ih + kIndexHeaderSize;
  uint8_t* storage_p = entry_p + entries_.size() * kEntryRecordSize;
  uint8_t* tensor_p = storage_p + storage_nbytes_.size() * kStorageRecordSize;
  uint8_t* sparse_p = tensor_p + tensors_.size() * kTensorRecordSize;
  uint8_t* meta_p = sparse_p + sparse_.size() * kSparseRecordSize;
  uint8_t* dims_p = meta_p + metadata_.size() * kMetadataRecordSize;
  uint8_t* blob_p = dims_p + uint64_t{dims_count} * kDimSize;
  uint32_t blob = 0, dim = 0;
  // §4.9: strings enter the blob in record order.
  auto put_string = [&](uint8_t* rec, const std::string& s) {
    StoreU32(rec, blob);
    StoreU32(rec + 4, static_cast<uint32_t>(s.size()));
    std::copy(s.begin(), s.end(), blob_p + blob);
    blob += static_cast<uint32_t>(s.size());
  };
  auto put_dims = [&](const std::vector<int64_t>& v) {
    for (int64_t x : v) StoreU64(dims_p + uint64_t{dim++} * kDimSize, static_cast<uint64_t>(x));
  };

  for (size_t i = 0; i < entries_.size(); ++i) {
    uint8_t* rec = entry_p + i * kEntryRecordSize;
    put_string(rec, entries_[i].name);
    StoreU32(rec + 8, entries_[i].first_tensor);
    StoreU32(rec + 12, entries_[i].tensor_count);
  }
  for (size_t i = 0; i < storage_nbytes_.size(); ++i) {
    uint8_t* rec = storage_p + i * kStorageRecordSize;
    StoreU64(rec, storage_offsets_[i]);
    StoreU64(rec + 8, storage_nbytes_[i]);
    StoreU64(rec + 16, storage_xxh3_[i]);
  }
  for (size_t i = 0; i < tensors_.size(); ++i) {
    const TensorSpec& t = tensors_[i];
    uint8_t* rec = tensor_p + i * kTensorRecordSize;
    put_string(rec, t.name);
    StoreU32(rec + 8, t.storage);
    StoreU16(rec + 12, static_cast<uint16_t>(t.dtype));
    rec[14] = static_cast<uint8_t>(t.role);
    rec[15] = t.requires_grad ? kTensorFlagRequiresGrad : 0;
    StoreU32(rec + 16, static_cast<uint32_t>(t.sizes.size()));
    StoreU32(rec + 20, dim);
    put_dims(t.sizes);
    put_dims(t.strides);
    StoreU64(rec + 24, t.storage_offset);
    StoreU32(rec + 32, t.sparse);
    rec[36] = static_cast<uint8_t>(t.device_type);
    StoreU16(rec + 38, t.device_index);
  }
  for (size_t i = 0; i < sparse_.size(); ++i) {
    const SparseSpec& s = sparse_[i].spec;
    uint8_t* rec = sparse_p + i * kSparseRecordSize;
    put_string(rec, s.name);
    StoreU32(rec + 8, sparse_[i].entry);
    rec[12] = static_cast<uint8_t>(s.layout);
    rec[13] = s.coalesced ? kSparseFlagCoalesced : 0;
    StoreU32(rec + 16, static_cast<uint32_t>(s.sizes.size()));
    StoreU32(rec + 20, dim);
    put_dims(s.sizes);
    StoreU32(rec + 24, s.first_component);
    StoreU32(rec + 28, s.layout == SparseLayout::kCoo ? 2 : 3);
  }
  for (size_t i = 0; i < metadata_.size(); ++i) {
    const MetadataSpec& m = metadata_[i];
    uint8_t* rec = meta_p + i * kMetadataRecordSize;
    put_string(rec, m.key);
    rec[8] = static_cast<uint8_t>(m.type);
    StoreU32(rec + 12, m.entry);
    if (m.type == MetaType::kInt) {
      StoreU64(rec + 16, static_cast<uint64_t>(m.int_value));
    } else if (m.type == MetaType::kFloat) {
      StoreU64(rec + 16, DoubleToBits(m.float_value));
    } else {
      StoreU64(rec + 16, blob);
      StoreU64(rec + 24, m.bytes.size());
      std::copy(m.bytes.begin(), m.bytes.end(), blob_p + blob);
      blob += static_cast<uint32_t>(m.bytes.size());
    }
  }
  StoreU64(ih + 24, blob);
  StoreU64(p + kOffIndexXxh3, IndexChecksum(p, kHeaderSize + index_size_));
  return out;
}

}  // namespace tsar::format
