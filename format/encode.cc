// The deterministic encoder of spec/FORMAT.md §4; its layout rules are §4.4
// and its ordering rules §4.9. Everything it writes passes Index::Parse: every
// input that would break a rule of §6 is refused before anything is written.
#include "format/encode.h"

#include <algorithm>
#include <map>
#include <string_view>
#include <unordered_set>

#include "format/checksum.h"
#include "format/endian.h"
#include "format/extent.h"
#include "format/reader.h"
#include "format/tensor_parallel.h"
#include "tsar/error.h"

namespace tsar::format {
namespace {

std::string Dec(uint64_t v) { return std::to_string(v); }

[[noreturn]] void Misuse(ErrorCode code, const std::string& message) {
  throw Error(code, "", std::nullopt, message);
}

// Sizes (and strides) of a tensor or sparse record: what R48/R49/R61 require,
// worded for a caller who passes signed values.
// `what()`: the tensor the message is about (made only for a message).
template <typename What>
void CheckDims(const What& what, const char* field, const std::vector<int64_t>& v) {
  for (size_t d = 0; d < v.size(); ++d) {
    if (v[d] < 0) {
      Misuse(ErrorCode::kInvalidArgument, what() + field + (" " + Dec(d)) +
                                              ": expected a non-negative value, found " +
                                              std::to_string(v[d]));
    }
  }
}

// The order of §4.7 (R75): entry as u32, then key bytewise. std::string's
// operator< compares as unsigned char, as the decoder's string_view does.
bool MetaLess(const MetadataSpec& a, const MetadataSpec& b) {
  return a.entry != b.entry ? a.entry < b.entry : a.key < b.key;
}

}  // namespace

void CheckName(const std::string& what, const std::string& name, const char* field) {
  if (name.empty()) {
    Misuse(ErrorCode::kInvalidArgument,
           what + " \"\": " + field + ": expected 1 to 65535 bytes, found 0");
  }
  if (name.size() > kMaxNameLength) {
    Misuse(ErrorCode::kInvalidArgument, what + " " + Quote(name) + ": " + field +
                                            ": expected at most " + Dec(kMaxNameLength) +
                                            " bytes, found " + Dec(name.size()));
  }
  if (!IsValidUtf8(name)) {
    Misuse(ErrorCode::kInvalidArgument, what + " " + Quote(name) + ": " + field +
                                            ": expected valid UTF-8, found " + Quote(name));
  }
}

IndexBuilder::IndexBuilder(uint32_t alignment) : alignment_(alignment) {
  if (alignment < kMinAlignment || alignment > kMaxAlignment || (alignment & (alignment - 1))) {
    Misuse(ErrorCode::kInvalidArgument,
           "alignment: expected a power of two in [64, 2^30], found " + Dec(alignment));
  }
}

void IndexBuilder::RequireNotPlanned(const char* call) const {
  // After Plan() the index size is fixed; anything added later would make
  // EncodeHead() write past the buffer it sized from it.
  if (planned_) {
    Misuse(ErrorCode::kInvalidArgument,
           std::string(call) + ": expected a call before Plan(), found one after it");
  }
}

uint32_t IndexBuilder::AddEntry(const std::string& name) {
  RequireNotPlanned("AddEntry");
  CheckName("entry", name);
  if (!entry_names_.insert(name).second) {  // R28
    Misuse(ErrorCode::kDuplicateName,
           "entry " + Quote(name) + ": name: expected a name unique among entries, found it twice");
  }
  entries_.push_back({name, static_cast<uint32_t>(tensors_.size()), 0});
  return static_cast<uint32_t>(entries_.size() - 1);
}

uint32_t IndexBuilder::AddStorage(uint64_t nbytes) {
  RequireNotPlanned("AddStorage");
  if (!base_storages_.empty()) {  // tensors name own storages first
    Misuse(ErrorCode::kInvalidArgument,
           "AddStorage: expected every own storage before the first AddBaseStorage");
  }
  storage_nbytes_.push_back(nbytes);
  storage_xxh3_.push_back(Xxh3(nullptr, 0));
  return static_cast<uint32_t>(storage_nbytes_.size() - 1);
}

void IndexBuilder::SetLayer(LayerSpec layer) {
  RequireNotPlanned("SetLayer");
  if (has_layer_) Misuse(ErrorCode::kInvalidArgument, "SetLayer: called twice");
  if (layer.depth < 1 || layer.depth > kMaxLayerDepth) {  // R96
    Misuse(ErrorCode::kInvalidArgument, "layer depth: expected 1 to " + Dec(kMaxLayerDepth) +
                                            " (1 + the depth of the base), found " +
                                            Dec(layer.depth));
  }
  CheckName("layer", layer.base_path, "base_path");  // R97
  if (!IsRelativePath(layer.base_path)) {
    Misuse(ErrorCode::kInvalidArgument,
           "layer base_path: expected a relative path ('/'-separated names, none empty, no "
           "NUL, not starting with '/'), found " +
               Quote(layer.base_path));
  }
  layer_ = std::move(layer);
  has_layer_ = true;
}

uint32_t IndexBuilder::AddBaseStorage(uint32_t base_storage, uint64_t nbytes, uint64_t xxh3) {
  RequireNotPlanned("AddBaseStorage");
  if (!has_layer_) {
    Misuse(ErrorCode::kInvalidArgument, "AddBaseStorage: expected SetLayer before it");
  }
  const auto what = [this] { return "base storage #" + Dec(base_storages_.size()) + ": "; };
  if (base_storage >= layer_.base_storage_count) {  // R99
    Misuse(ErrorCode::kInvalidArgument,
           what() + "base_storage: expected less than base_storage_count " +
               Dec(layer_.base_storage_count) + ", found " + Dec(base_storage));
  }
  if (AnyStorageCount() >= kNone) {
    Misuse(ErrorCode::kInvalidArgument, what() + "expected fewer than 2^32 - 1 storages");
  }
  base_storages_.push_back({base_storage, nbytes, xxh3});
  return static_cast<uint32_t>(AnyStorageCount() - 1);
}

uint64_t IndexBuilder::AnyStorageNbytes(uint32_t i) const {
  return i < storage_nbytes_.size() ? storage_nbytes_[i]
                                    : base_storages_[i - storage_nbytes_.size()].nbytes;
}

uint32_t IndexBuilder::AddTensor(TensorSpec t) {
  RequireNotPlanned("AddTensor");
  if (entries_.empty()) {
    Misuse(ErrorCode::kInvalidArgument,
           "tensor " + Quote(t.name) + ": entry: expected AddEntry before AddTensor, found none");
  }
  CheckName("tensor", t.name);
  // Made only for a message: quoting every name was a tenth of adding a tensor.
  const auto what = [&t] { return "tensor " + Quote(t.name) + ": "; };
  if (t.storage >= AnyStorageCount()) {  // R36
    Misuse(ErrorCode::kInvalidArgument, what() + "storage: expected less than storage_count " +
                                            Dec(AnyStorageCount()) + ", found " + Dec(t.storage));
  }
  const auto dtype = static_cast<uint16_t>(t.dtype);
  if (!DTypeFromCode(dtype)) {  // R37
    Misuse(ErrorCode::kInvalidArgument,
           what() + "dtype: expected a dtype code of §5 (1-" + Dec(kLastDTypeCode) + "), found " +
               Dec(dtype));
  }
  dtype_minor_ = std::max(dtype_minor_, MinorForDType(t.dtype));  // §7.1: codes 19-22 need 1.3
  const auto role = static_cast<uint8_t>(t.role);
  if (role > kRoleMax) {  // R38
    Misuse(ErrorCode::kInvalidArgument, what() + "role: expected 0-3, found " + Dec(role));
  }
  if (t.requires_grad && !DTypeCodeMayRequireGrad(dtype)) {  // R77
    Misuse(ErrorCode::kInvalidArgument,
           what() + "requires_grad: expected a floating-point or complex dtype, found " +
               std::string(DTypeName(t.dtype)));
  }
  if (t.sizes.size() > kMaxNdim) {  // R40
    Misuse(ErrorCode::kInvalidArgument,
           what() + "ndim: expected at most " + Dec(kMaxNdim) + ", found " + Dec(t.sizes.size()));
  }
  if (t.strides.size() != t.sizes.size()) {
    Misuse(ErrorCode::kInvalidArgument, what() + "strides: expected " + Dec(t.sizes.size()) +
                                            " (one per size), found " + Dec(t.strides.size()));
  }
  // R42: a sparse component has role 3 and names its sparse record; nothing
  // else does. (Whether that record exists is checked by Plan, R43, R64, R65.)
  if ((t.role == Role::kSparseComponent) != (t.sparse != kNone)) {
    Misuse(ErrorCode::kInvalidArgument,
           what() + "sparse: expected " +
               (t.role == Role::kSparseComponent ? "a sparse record index for role 3"
                                                 : "0xffffffff for roles 0-2") +
               ", found " + Dec(t.sparse));
  }
  const auto device_type = static_cast<uint8_t>(t.device_type);
  if (device_type > kDeviceTypeMax) {  // R44
    Misuse(ErrorCode::kInvalidArgument,
           what() + "device_type: expected 0-2, found " + Dec(device_type));
  }
  if (t.device_index != 0 && t.device_type != DeviceType::kCuda) {  // R46
    Misuse(ErrorCode::kInvalidArgument,
           what() + "device_index: expected 0 unless device_type is 2 (cuda), found " +
               Dec(t.device_index));
  }
  CheckDims(what, "size", t.sizes);      // R48
  CheckDims(what, "stride", t.strides);  // R49
  // R50-R53 and R78 with the decoder's own arithmetic, so both accept the
  // same views.
  const uint64_t esize = ElementSize(t.dtype);
  const ViewExtent v =
      ComputeViewExtent(t.sizes.data(), t.strides.data(), static_cast<uint32_t>(t.sizes.size()),
                        t.storage_offset, esize);
  if (v.fault != ViewExtent::Fault::kNone) {
    const ViewFaultText text =
        DescribeViewFault(v, t.sizes.data(), t.strides.data(), t.storage_offset, esize);
    Misuse(ErrorCode::kOverflow,
           what() + text.field + ": expected " + text.expected + ", found " + text.found);
  }
  if (v.end > AnyStorageNbytes(t.storage)) {
    Misuse(ErrorCode::kInvalidArgument, what() + "extent: expected at most storage nbytes " +
                                            Dec(AnyStorageNbytes(t.storage)) + ", found " +
                                            Dec(v.end));
  }
  if (t.shard_dim != kNone) {  // §4.12: R105-R109 as the decoder words them
    if (tp_world_ == 0) {
      Misuse(ErrorCode::kInvalidArgument,
             what() + "shard_dim: expected SetTensorParallel before a sharded tensor");
    }
    const ShardFault f =
        CheckShard(t.sizes.data(), t.strides.data(), static_cast<uint32_t>(t.sizes.size()),
                   t.storage_offset, esize, t.role == Role::kSparseComponent, t.shard_dim,
                   tp_world_, alignment_, AnyStorageNbytes(t.storage), nullptr);
    if (f.rule != ShardFault::Rule::kNone) {
      Misuse(ErrorCode::kInvalidArgument,
             what() + "shard " + f.field + ": expected " + f.expected + ", found " + f.found);
    }
    ++shard_count_;
  }
  Entry& e = entries_.back();
  tensors_.push_back(std::move(t));
  ++e.tensor_count;
  return static_cast<uint32_t>(tensors_.size() - 1);
}

uint32_t IndexBuilder::AddSparse(SparseSpec s) {
  RequireNotPlanned("AddSparse");
  if (entries_.empty()) {
    Misuse(ErrorCode::kInvalidArgument,
           "sparse tensor " + Quote(s.name) +
               ": entry: expected AddEntry before AddSparse, found none");
  }
  CheckName("sparse tensor", s.name);
  const std::string what = "sparse tensor " + Quote(s.name) + ": ";
  const auto layout = static_cast<uint8_t>(s.layout);
  if (layout == 0 || layout > static_cast<uint8_t>(SparseLayout::kGroup)) {  // R56
    Misuse(ErrorCode::kInvalidArgument, what + "layout: expected 1-4, found " + Dec(layout));
  }
  if (s.sizes.size() > kMaxNdim) {  // R59
    Misuse(ErrorCode::kInvalidArgument,
           what + "ndim: expected at most " + Dec(kMaxNdim) + ", found " + Dec(s.sizes.size()));
  }
  CheckDims([&what] { return what; }, "size", s.sizes);  // R61
  const bool group = s.layout == SparseLayout::kGroup;
  if (group) {
    if (s.strides.size() != s.sizes.size()) {  // R60: sizes, then as many strides
      Misuse(ErrorCode::kInvalidArgument, what + "strides: expected " + Dec(s.sizes.size()) +
                                              " (one per size), found " + Dec(s.strides.size()));
    }
    CheckDims([&what] { return what; }, "stride", s.strides);  // R61
    if (s.component_count < 1 || s.component_count > kMaxGroupMembers) {  // R62
      Misuse(ErrorCode::kInvalidArgument, what + "component_count: expected 1 to " +
                                              Dec(kMaxGroupMembers) + ", found " +
                                              Dec(s.component_count));
    }
    if (!DTypeFromCode(static_cast<uint16_t>(s.dtype))) {  // R111
      Misuse(ErrorCode::kInvalidArgument,
             what + "dtype: expected a dtype of §5, found " + Dec(static_cast<uint16_t>(s.dtype)));
    }
  } else if (!s.strides.empty() || s.component_count != 0) {
    Misuse(ErrorCode::kInvalidArgument,
           what + "strides, component_count: expected none for a sparse layout, found some");
  }
  if (group && s.coalesced) {  // R57
    Misuse(ErrorCode::kInvalidArgument, what + "coalesced: expected false for a group");
  }
  if (group) {
    has_groups_ = true;
    dtype_minor_ = std::max(dtype_minor_, MinorForDType(s.dtype));
  }
  // The components may be added after the record, so R63-R65 wait for Plan().
  sparse_.push_back({std::move(s), static_cast<uint32_t>(entries_.size() - 1)});
  return static_cast<uint32_t>(sparse_.size() - 1);
}

void IndexBuilder::AddMetadata(MetadataSpec m) {
  RequireNotPlanned("AddMetadata");
  CheckName("metadata", m.key, "key");  // R67
  const std::string what = "metadata " + Quote(m.key) + ": ";
  const auto type = static_cast<uint8_t>(m.type);
  if (type == 0 || type > kMetaTypeMax) {  // R68
    Misuse(ErrorCode::kInvalidArgument, what + "type: expected 1-4, found " + Dec(type));
  }
  if (m.entry != kNone && m.entry >= entries_.size()) {  // R70
    Misuse(ErrorCode::kInvalidArgument, what +
                                            "entry: expected 0xffffffff or less than entry_count " +
                                            Dec(entries_.size()) + ", found " + Dec(m.entry));
  }
  if (m.type == MetaType::kString && !IsValidUtf8(m.bytes)) {  // R73
    Misuse(ErrorCode::kInvalidArgument,
           what + "value: expected valid UTF-8, found " + Quote(m.bytes));
  }
  if (!metadata_keys_.insert({m.entry, m.key}).second) {  // R74
    Misuse(ErrorCode::kDuplicateName,
           what + "key: expected a key unique in its scope, found it twice");
  }
  if (m.type == MetaType::kInt || m.type == MetaType::kFloat) m.bytes.clear();
  metadata_.push_back(std::move(m));
}

void IndexBuilder::SetStorageChecksum(uint32_t i, uint64_t xxh3) {
  if (i >= storage_xxh3_.size()) {
    Misuse(ErrorCode::kInvalidArgument, "storage: expected less than storage_count " +
                                            Dec(storage_xxh3_.size()) + ", found " + Dec(i));
  }
  storage_xxh3_[i] = xxh3;
}

void IndexBuilder::CheckSparse() const {
  const std::string n = Dec(sparse_.size());
  for (uint32_t k = 0; k < tensors_.size(); ++k) {  // R43
    const TensorSpec& t = tensors_[k];
    if (t.sparse != kNone && t.sparse >= sparse_.size()) {
      Misuse(ErrorCode::kInvalidArgument, "tensor " + Quote(t.name) +
                                              ": sparse: expected less than sparse_count " + n +
                                              ", found " + Dec(t.sparse));
    }
  }
  for (uint32_t i = 0; i < sparse_.size(); ++i) {
    const SparseSpec& s = sparse_[i].spec;
    const Entry& e = entries_[sparse_[i].entry];
    const uint32_t count = ComponentCount(s);
    if (s.first_component < e.first_tensor ||
        uint64_t{s.first_component} + count > uint64_t{e.first_tensor} + e.tensor_count) {  // R63
      Misuse(ErrorCode::kInvalidArgument,
             "sparse tensor " + Quote(s.name) + ": first_component: expected " + Dec(count) +
                 " components inside entry " + Quote(e.name) + "'s tensors [" +
                 Dec(e.first_tensor) + ", " + Dec(uint64_t{e.first_tensor} + e.tensor_count) +
                 "), found " + Dec(s.first_component));
    }
    for (uint32_t c = 0; c < count; ++c) {  // R64
      const TensorSpec& t = tensors_[s.first_component + c];
      if (t.sparse != i) {
        Misuse(ErrorCode::kInvalidArgument,
               "tensor " + Quote(t.name) + ": sparse: expected " + Dec(i) + " (component " +
                   Dec(c) + " of sparse tensor " + Quote(s.name) + "), found " + Dec(t.sparse));
      }
    }
  }
  for (uint32_t k = 0; k < tensors_.size(); ++k) {  // R65
    const TensorSpec& t = tensors_[k];
    if (t.sparse == kNone) continue;
    const SparseSpec& s = sparse_[t.sparse].spec;
    const uint32_t count = ComponentCount(s);
    if (k < s.first_component || k - s.first_component >= count) {
      Misuse(ErrorCode::kInvalidArgument,
             "tensor " + Quote(t.name) +
                 ": sparse: expected a sparse record whose components include it, found " +
                 Dec(t.sparse));
    }
  }
}

void IndexBuilder::CheckGroupDescriptions() const {
  // The "group:" records by (entry, key), in one pass: a group per record
  // searched through all of them cost groups x records.
  const std::string_view prefix = kGroupKeyPrefix;
  std::map<std::pair<uint32_t, std::string_view>, MetaType> described;
  for (const MetadataSpec& m : metadata_) {
    if (std::string_view(m.key).substr(0, prefix.size()) == prefix) {
      described.emplace(std::make_pair(m.entry, std::string_view(m.key)), m.type);
    }
  }
  for (const SparseItem& s : sparse_) {
    if (s.spec.layout != SparseLayout::kGroup) continue;
    const std::string key = kGroupKeyPrefix + s.spec.name;
    const auto m = described.find({s.entry, key});
    if (m == described.end() || m->second != MetaType::kString) {  // R112
      Misuse(ErrorCode::kInvalidArgument,
             "group " + Quote(s.spec.name) + ": description: expected a string metadata record " +
                 Quote(key) + " in entry " + Quote(entries_[s.entry].name) + ", found " +
                 (m == described.end() ? "none" : "another type"));
    }
  }
}

void IndexBuilder::SetTensorParallel(uint32_t world) {
  RequireNotPlanned("SetTensorParallel");
  if (world < 2 || world > kMaxWorld) {  // R100
    Misuse(ErrorCode::kInvalidArgument,
           "tp_world: expected 2 to " + Dec(kMaxWorld) + ", found " + Dec(world));
  }
  if (shard_count_ != 0 && world != tp_world_) {
    Misuse(ErrorCode::kInvalidArgument,
           "SetTensorParallel: expected one world for every sharded tensor, found " +
               Dec(tp_world_) + " then " + Dec(world));
  }
  tp_world_ = world;
}

// R110: tensors that view a storage holding a sharded tensor's slices are all
// sharded like the first of them (same dim, dtype and sizes).
void IndexBuilder::CheckShardedStorages() const {
  if (tp_world_ == 0) return;
  std::vector<uint32_t> first(AnyStorageCount(), kNone);
  for (uint32_t i = 0; i < tensors_.size(); ++i) {
    if (tensors_[i].shard_dim != kNone && first[tensors_[i].storage] == kNone)
      first[tensors_[i].storage] = i;
  }
  for (uint32_t i = 0; i < tensors_.size(); ++i) {
    const TensorSpec& t = tensors_[i];
    const uint32_t k = first[t.storage];
    if (k == kNone || k == i) continue;
    const TensorSpec& f = tensors_[k];
    if (t.shard_dim != f.shard_dim || t.dtype != f.dtype || t.sizes != f.sizes) {
      Misuse(ErrorCode::kInvalidArgument,
             "tensor " + Quote(t.name) + ": storage: expected a storage that no sharded tensor "
             "views, or one sharded like tensor " + Quote(f.name) +
                 " (same dim, dtype and sizes), found storage #" + Dec(t.storage) +
                 (t.shard_dim == kNone ? " viewed whole" : " sharded otherwise"));
    }
  }
}

void IndexBuilder::SetValues(std::vector<ValueSpec> values) {
  RequireNotPlanned("SetValues");
  values_ = std::move(values);
}

void IndexBuilder::EncodeValues(uint8_t* values_p, uint8_t* blob_p, uint64_t* blob) const {
  uint8_t* links_p = values_p + values_.size() * kValueRecordSize;
  uint32_t link = 0;
  for (size_t i = 0; i < values_.size(); ++i) {
    const ValueSpec& v = values_[i];
    uint8_t* rec = values_p + i * kValueRecordSize;
    rec[0] = static_cast<uint8_t>(v.kind);
    rec[1] = v.flags;
    StoreU32(rec + 4, static_cast<uint32_t>(v.links.size()));
    StoreU32(rec + 8, link);
    for (uint32_t t : v.links) StoreU32(links_p + uint64_t{link++} * kLinkSize, t);
    if (ValueHasBytes(v.kind)) {
      StoreU64(rec + 16, *blob);
      StoreU64(rec + 24, v.bytes.size());
      std::copy(v.bytes.begin(), v.bytes.end(), blob_p + *blob);
      *blob += v.bytes.size();
    } else {
      StoreU64(rec + 16, v.value);
    }
  }
}

// R82-R93 for the tree the caller set: encoded on its own and checked by the
// decoder's own rules, so the builder can never write a tree a reader refuses.
void IndexBuilder::CheckValues() const {
  if (values_.empty()) return;
  uint64_t links = 0, bytes = 0;
  for (const auto& v : values_) {
    links += v.links.size();
    bytes += v.bytes.size();
  }
  if (values_.size() > UINT32_MAX || links > UINT32_MAX) {
    Misuse(ErrorCode::kInvalidArgument, "value tree: expected fewer than 2^32 values and links");
  }
  const uint64_t table = values_.size() * kValueRecordSize + links * kLinkSize;
  std::vector<uint8_t> buf(table + bytes, 0);
  uint64_t blob = 0;
  EncodeValues(buf.data(), buf.data() + table, &blob);
  ValueScope scope;
  scope.blob = table;
  scope.blob_size = bytes;
  scope.entry_count = static_cast<uint32_t>(entries_.size());
  scope.component.resize(tensors_.size());
  for (size_t i = 0; i < tensors_.size(); ++i)
    scope.component[i] = tensors_[i].role == Role::kSparseComponent;
  std::vector<ValueRecord> values;
  std::vector<uint32_t> decoded_links;
  const std::string path;
  try {
    DecodeValues(ByteReader(buf.data(), buf.size(), path), 0, static_cast<uint32_t>(values_.size()),
                 values_.size() * kValueRecordSize, static_cast<uint32_t>(links), scope, &values,
                 &decoded_links);
  } catch (const Error& e) {
    // The offsets are those of a scratch buffer: keep only "value #i ...".
    std::string m = e.what();
    const size_t at = m.find("): ");
    Misuse(ErrorCode::kInvalidArgument,
           "value tree: " + (at == std::string::npos ? m : m.substr(at + 3)));
  }
}

void IndexBuilder::Plan() {
  if (planned_) return;
  CheckSparse();
  if (has_groups_) CheckGroupDescriptions();
  CheckValues();
  CheckShardedStorages();
  if (tp_world_ != 0 && shard_count_ == 0) {  // R101
    Misuse(ErrorCode::kInvalidArgument,
           "shard_count: expected at least 1 sharded tensor in a tensor-parallel archive, found 0");
  }
  // Names are unique per entry, sparse names included (§6 R66). Tensors and
  // sparse records are checked in the decoder's order, in linear time.
  std::vector<std::unordered_set<std::string_view>> seen(entries_.size());
  for (uint32_t e = 0; e < entries_.size(); ++e) {
    seen[e].reserve(entries_[e].tensor_count);
    for (uint32_t i = 0; i < entries_[e].tensor_count; ++i) {
      const std::string& n = tensors_[entries_[e].first_tensor + i].name;
      if (!seen[e].insert(n).second) {
        Misuse(ErrorCode::kDuplicateName, "tensor " + Quote(n) +
                                              ": name: expected a name unique in entry " +
                                              Quote(entries_[e].name) + ", found it twice");
      }
    }
  }
  for (const auto& s : sparse_) {
    if (!seen[s.entry].insert(s.spec.name).second) {
      Misuse(ErrorCode::kDuplicateName, "sparse tensor " + Quote(s.spec.name) +
                                            ": name: expected a name unique in entry " +
                                            Quote(entries_[s.entry].name) + ", found it twice");
    }
  }

  uint64_t dims = 0, blob = 0;
  for (const auto& e : entries_) blob += e.name.size();
  for (const auto& t : tensors_) {
    dims += 2 * t.sizes.size();
    blob += t.name.size();
  }
  for (const auto& s : sparse_) {
    dims += s.spec.sizes.size() + s.spec.strides.size();
    blob += s.spec.name.size();
  }
  for (const auto& m : metadata_) blob += m.key.size() + m.bytes.size();
  uint64_t links = 0;
  for (const auto& v : values_) {
    blob += v.bytes.size();
    links += v.links.size();
  }
  if (has_layer_) blob += layer_.base_path.size();  // §4.9 blob order item 6
  uint64_t index_size = kIndexHeaderSize + entries_.size() * kEntryRecordSize +
                        storage_nbytes_.size() * kStorageRecordSize +
                        tensors_.size() * kTensorRecordSize + sparse_.size() * kSparseRecordSize +
                        metadata_.size() * kMetadataRecordSize + dims * kDimSize + blob;
  if (!values_.empty()) {  // §4.10: padding to 8, then the value and link tables
    index_size = ((kHeaderSize + index_size + 7) & ~uint64_t{7}) - kHeaderSize +
                 values_.size() * kValueRecordSize + links * kLinkSize;
  }
  if (has_layer_) {  // §4.11: padding to 8, the layer record, the base storage table
    index_size = ((kHeaderSize + index_size + 7) & ~uint64_t{7}) - kHeaderSize + kLayerRecordSize +
                 base_storages_.size() * kBaseStorageRecordSize;
  }
  if (tp_world_ != 0) {  // §4.12: padding to 8, the shard table
    index_size = ((kHeaderSize + index_size + 7) & ~uint64_t{7}) - kHeaderSize +
                 uint64_t{shard_count_} * kShardRecordSize;
  }
  if (index_size > kMaxIndexSize) {  // R8; it also keeps every count and blob offset in a u32
    Misuse(ErrorCode::kInvalidArgument, "index_size: expected at most " + Dec(kMaxIndexSize) +
                                            " (2 GiB), found " + Dec(index_size));
  }
  uint64_t data_offset = 0;
  AlignUp(kHeaderSize + index_size, kMinAlignment, &data_offset);
  std::vector<uint64_t> offsets(storage_nbytes_.size());
  uint64_t pos = data_offset;
  for (size_t i = 0; i < storage_nbytes_.size(); ++i) {  // the layout rule of §4.4
    const uint64_t align = storage_nbytes_[i] >= alignment_ ? alignment_ : kMinAlignment;
    if (!AlignUp(pos, align, &offsets[i]) || !CheckedAdd(offsets[i], storage_nbytes_[i], &pos)) {
      Misuse(ErrorCode::kOverflow, "storage #" + Dec(i) +
                                       ": nbytes: expected a storage that ends "
                                       "below 2^64, found " +
                                       Dec(storage_nbytes_[i]));
    }
  }
  // Nothing below throws: a failed Plan() leaves the builder as it was.
  std::stable_sort(metadata_.begin(), metadata_.end(), MetaLess);
  index_size_ = index_size;
  link_count_ = links;
  data_offset_ = data_offset;
  storage_offsets_ = std::move(offsets);
  file_size_ = pos;
  planned_ = true;
}

std::vector<uint8_t> IndexBuilder::EncodeHead() const {
  if (!planned_) {
    Misuse(ErrorCode::kInvalidArgument,
           "EncodeHead: expected a call after Plan(), found one before it");
  }
  std::vector<uint8_t> out(data_offset_, 0);
  uint8_t* p = out.data();
  std::copy(kMagic, kMagic + sizeof kMagic, p);
  StoreU16(p + kOffMajor, kMajorVersion);
  // §7.5: the lowest minor that defines the features used (0 with none).
  const bool tree = !values_.empty();
  const uint32_t flags = (tree ? kFeatureValueTree : 0) | (has_layer_ ? kFeatureLayers : 0) |
                        (tp_world_ != 0 ? kFeatureTensorParallel : 0) |
                        (has_groups_ ? kFeatureTensorGroups : 0);
  StoreU16(p + kOffMinor, std::max(MinorForFeatures(flags), dtype_minor_));
  StoreU32(p + kOffFlags, flags);
  StoreU32(p + kOffHeaderSize, kHeaderSize);
  StoreU64(p + kOffFileSize, file_size_);
  StoreU64(p + kOffIndexOffset, kHeaderSize);
  StoreU64(p + kOffIndexSize, index_size_);
  StoreU64(p + kOffDataOffset, data_offset_);
  StoreU32(p + kOffAlignment, alignment_);

  uint32_t dims_count = 0;
  for (const auto& t : tensors_) dims_count += 2 * static_cast<uint32_t>(t.sizes.size());
  for (const auto& s : sparse_) {
    dims_count += static_cast<uint32_t>(s.spec.sizes.size() + s.spec.strides.size());
  }
  uint8_t* ih = p + kHeaderSize;
  StoreU32(ih + 0, static_cast<uint32_t>(entries_.size()));
  StoreU32(ih + 4, static_cast<uint32_t>(storage_nbytes_.size()));
  StoreU32(ih + 8, static_cast<uint32_t>(tensors_.size()));
  StoreU32(ih + 12, static_cast<uint32_t>(sparse_.size()));
  StoreU32(ih + 16, static_cast<uint32_t>(metadata_.size()));
  StoreU32(ih + 20, dims_count);
  if (tree) {
    StoreU32(ih + 32, static_cast<uint32_t>(values_.size()));
    StoreU32(ih + 36, static_cast<uint32_t>(link_count_));
  }
  if (has_layer_) StoreU32(ih + 40, static_cast<uint32_t>(base_storages_.size()));
  if (tp_world_ != 0) {
    StoreU32(ih + 44, tp_world_);
    StoreU32(ih + 48, shard_count_);
  }

  uint8_t* entry_p = ih + kIndexHeaderSize;
  uint8_t* storage_p = entry_p + entries_.size() * kEntryRecordSize;
  uint8_t* tensor_p = storage_p + storage_nbytes_.size() * kStorageRecordSize;
  uint8_t* sparse_p = tensor_p + tensors_.size() * kTensorRecordSize;
  uint8_t* meta_p = sparse_p + sparse_.size() * kSparseRecordSize;
  uint8_t* dims_p = meta_p + metadata_.size() * kMetadataRecordSize;
  uint8_t* blob_p = dims_p + uint64_t{dims_count} * kDimSize;
  uint64_t blob = 0;
  uint32_t dim = 0;
  // §4.9: strings enter the blob in record order.
  auto put_string = [&](uint8_t* rec, const std::string& s) {
    StoreU32(rec, static_cast<uint32_t>(blob));
    StoreU32(rec + 4, static_cast<uint32_t>(s.size()));
    std::copy(s.begin(), s.end(), blob_p + blob);
    blob += s.size();
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
    if (s.layout == SparseLayout::kGroup) StoreU16(rec + 14, static_cast<uint16_t>(s.dtype));
    StoreU32(rec + 16, static_cast<uint32_t>(s.sizes.size()));
    StoreU32(rec + 20, dim);
    put_dims(s.sizes);
    put_dims(s.strides);  // groups only (§4.13)
    StoreU32(rec + 24, s.first_component);
    StoreU32(rec + 28, ComponentCount(s));
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
      blob += m.bytes.size();
    }
  }
  // The tree's bytes, then the base path, come last in the blob (§4.9).
  uint64_t blob_end = (blob_p - p) + blob + (has_layer_ ? layer_.base_path.size() : 0);
  for (const auto& v : values_) blob_end += v.bytes.size();
  uint64_t ext = (blob_end + 7) & ~uint64_t{7};
  if (tree) {
    EncodeValues(p + ext, blob_p, &blob);
    ext += values_.size() * kValueRecordSize + link_count_ * kLinkSize;
  }
  if (has_layer_) {
    ext = (ext + 7) & ~uint64_t{7};  // an odd link count leaves 4 bytes of padding
    uint8_t* rec = p + ext;
    StoreU64(rec, layer_.base_id_low);
    StoreU64(rec + 8, layer_.base_id_high);
    StoreU64(rec + 16, layer_.base_file_size);
    StoreU32(rec + 24, layer_.base_storage_count);
    StoreU32(rec + 28, layer_.depth);
    put_string(rec + 32, layer_.base_path);
    for (size_t k = 0; k < base_storages_.size(); ++k) {
      uint8_t* b = rec + kLayerRecordSize + k * kBaseStorageRecordSize;
      StoreU32(b, base_storages_[k].base_storage);
      StoreU64(b + 8, base_storages_[k].nbytes);
      StoreU64(b + 16, base_storages_[k].xxh3);
    }
    ext += kLayerRecordSize + base_storages_.size() * kBaseStorageRecordSize;
  }
  if (tp_world_ != 0) {  // §4.12: one record per sharded tensor, in tensor order
    ext = (ext + 7) & ~uint64_t{7};
    uint8_t* rec = p + ext;
    for (uint32_t i = 0; i < tensors_.size(); ++i) {
      if (tensors_[i].shard_dim == kNone) continue;
      StoreU32(rec, i);
      StoreU32(rec + 4, tensors_[i].shard_dim);
      rec += kShardRecordSize;
    }
  }
  StoreU64(ih + 24, blob);
  StoreU64(p + kOffIndexXxh3, IndexChecksum(p, kHeaderSize + index_size_));
  return out;
}

}  // namespace tsar::format
