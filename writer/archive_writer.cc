// writer::ArchiveWriter (writer/archive_writer.h): dedupes storages, writes
// only the byte span each storage's tensors cover, hashes while writing,
// publishes atomically. Layout and encoding are format/encode.cc's.
#include "writer/archive_writer.h"

#include <algorithm>
#include <optional>
#include <string_view>
#include <unordered_map>
#include <variant>

#include "format/attached_file.h"
#include "format/checksum.h"
#include "format/encode.h"
#include "format/reader.h"
#include "format/value_tree.h"
#include "writer/atomic_file.h"
#include "writer/convert_dtype.h"
#include "writer/layer_base.h"
#include "writer/tensor_parallel.h"

namespace tsar::writer {

struct ArchiveWriter::State {
  struct Item {
    std::string name;
    TensorRef tensor;
    Role role;
    int sparse = -1;  // index in `sparse` for a sparse tensor's component
  };
  // A sparse tensor (spec §4.6): its components follow as consecutive items.
  struct Sparse {
    std::string name;
    format::SparseLayout layout;
    bool coalesced;
    std::vector<int64_t> sizes;
    // A group's (§4.13): outer dtype and strides, component count.
    DType dtype = DType::kFloat32;
    std::vector<int64_t> strides;
    uint32_t component_count = 0;
  };
  struct Entry {
    std::string name;
    std::vector<Item> items;
  };
  std::string path;
  PackOptions options;
  std::vector<Entry> entries;
  std::unordered_map<std::string, uint32_t> entry_index;  // name -> position in entries
  std::vector<Sparse> sparse;
  std::vector<std::pair<std::string, std::pair<std::string, MetadataValue>>>
      metadata;  // entry, key, value
  std::optional<Value> value;
  bool finished = false;
};

namespace {

// Runs a builder call; its misuse errors carry no file, so name the output.
template <typename F>
void WithPath(const std::string& path, F&& f) {
  try {
    f();
  } catch (const Error& err) {
    if (!err.path().empty()) throw;
    throw Error(err.code(), path, std::nullopt, err.what());
  }
}

// Takes the value's bytes: an attached file is held once, not copied here.
format::MetadataSpec MetadataSpecOf(const std::string& key, MetadataValue&& value) {
  format::MetadataSpec m;
  m.key = key;
  m.entry = format::kNone;
  if (auto* s = std::get_if<std::string>(&value)) {
    m.type = format::MetaType::kString;
    m.bytes = std::move(*s);
  } else if (const auto* i = std::get_if<int64_t>(&value)) {
    m.type = format::MetaType::kInt;
    m.int_value = *i;
  } else if (const auto* d = std::get_if<double>(&value)) {
    m.type = format::MetaType::kFloat;
    m.float_value = *d;
  } else {
    m.type = format::MetaType::kBytes;
    m.bytes = std::move(std::get<Bytes>(value).data);
  }
  return m;
}

const char* TypeName(const MetadataValue& value) {
  if (std::holds_alternative<std::string>(value)) return "a str";
  if (std::holds_alternative<int64_t>(value)) return "an int";
  if (std::holds_alternative<double>(value)) return "a float";
  return "bytes";
}

}  // namespace

std::string FileKeyRefusal(const std::string& key, const MetadataValue& value,
                           const std::string& entry) {
  const std::string_view prefix = format::kAttachedFilePrefix;
  if (key.compare(0, prefix.size(), prefix) != 0) return "";
  const std::string_view name = std::string_view(key).substr(prefix.size());
  if (name.empty()) return "an empty file name";
  if (name.find('\0') != std::string_view::npos) return "a file name with a NUL byte";
  if (name.front() == '/') return "an absolute file name";
  size_t start = 0;
  while (start <= name.size()) {
    size_t slash = name.find('/', start);
    if (slash == std::string_view::npos) slash = name.size();
    const std::string_view part = name.substr(start, slash - start);
    if (part.empty()) return "a file name with an empty component";
    if (part == "." || part == "..")
      return "a file name with a " + format::Quote(part) + " component";
    start = slash + 1;
  }
  if (!std::holds_alternative<Bytes>(value))
    return std::string(TypeName(value)) + " value (an attached file's value is bytes)";
  if (!entry.empty())
    return "a record of entry " + format::Quote(entry) + " (attached files are archive-level)";
  return "";
}

ArchiveWriter::ArchiveWriter(std::string path, PackOptions options)
    : state_(std::make_unique<State>()) {
  state_->path = std::move(path);
  state_->options = std::move(options);
  WithPath(state_->path, [&] { format::IndexBuilder check(state_->options.alignment); });
  const auto& dtype = state_->options.dtype;
  if (dtype && !IsConvertibleFloating(*dtype)) {
    throw Error(ErrorCode::kInvalidArgument, state_->path, std::nullopt,
                "PackOptions::dtype: expected float16, bfloat16, float32 or float64, found " +
                    std::string(DTypeName(*dtype)));
  }
}

ArchiveWriter::~ArchiveWriter() = default;

const std::string& ArchiveWriter::path() const { return state_->path; }

void ArchiveWriter::set_value(Value root) { state_->value = std::move(root); }

void ArchiveWriter::add_entry(const std::string& name) {
  if (!state_->entry_index.emplace(name, static_cast<uint32_t>(state_->entries.size())).second) {
    throw Error(ErrorCode::kDuplicateName, state_->path, std::nullopt,
                "entry " + format::Quote(name) + ": expected a unique entry name, found it twice");
  }
  state_->entries.push_back({name, {}});
}

void ArchiveWriter::add(const std::string& name, TensorRef tensor, Role role) {
  if (state_->entries.empty()) add_entry(state_->options.entry);
  state_->entries.back().items.push_back({name, std::move(tensor), role});
}

void ArchiveWriter::add_sparse(const std::string& name, SparseRef sparse) {
  if (state_->entries.empty()) add_entry(state_->options.entry);
  const bool group = sparse.layout == format::SparseLayout::kGroup;
  if (group) {  // §4.13, R112: its description, in its entry
    if (sparse.description.empty()) {
      throw Error(ErrorCode::kInvalidArgument, state_->path, std::nullopt,
                  "group " + format::Quote(name) + ": expected a description, found none");
    }
    state_->metadata.push_back({state_->entries.back().name,
                                {format::kGroupKeyPrefix + name, std::move(sparse.description)}});
  }
  state_->sparse.push_back({name, sparse.layout, sparse.coalesced, std::move(sparse.sizes),
                            sparse.dtype, std::move(sparse.strides),
                            group ? static_cast<uint32_t>(sparse.components.size()) : 0});
  const int id = static_cast<int>(state_->sparse.size() - 1);
  for (auto& [suffix, part] : sparse.components) {
    state_->entries.back().items.push_back(
        {name + suffix, std::move(part), Role::kSparseComponent, id});
  }
}

void ArchiveWriter::add_metadata(const std::string& key, MetadataValue value,
                                 const std::string& entry) {
  if (!entry.empty() && !state_->entry_index.count(entry)) {
    throw Error(ErrorCode::kNotFound, state_->path, std::nullopt,
                "metadata " + format::Quote(key) + ": no entry " + format::Quote(entry));
  }
  if (const std::string why = FileKeyRefusal(key, value, entry); !why.empty()) {
    throw Error(ErrorCode::kInvalidValue, state_->path, std::nullopt,
                "metadata " + format::Quote(key) +
                    ": key: expected an attached file (spec §4.7.1: \"file:\" and a relative "
                    "path without empty, \".\" or \"..\" components or NUL bytes, archive-level "
                    "bytes), found " +
                    why);
  }
  state_->metadata.push_back({entry, {key, std::move(value)}});
}

void ArchiveWriter::finish() {
  State& st = *state_;
  if (st.finished)
    throw Error(ErrorCode::kInvalidArgument, st.path, std::nullopt, "finish() called twice");
  st.finished = true;
  if (st.options.dtype) {
    std::vector<ConvertItem> items;
    for (auto& e : st.entries) {
      for (auto& item : e.items) {
        // A group's inner tensors are what its class reads: never converted.
        if (item.sparse >= 0 && st.sparse[item.sparse].layout == format::SparseLayout::kGroup) {
          continue;
        }
        items.push_back({&item.name, &item.tensor});
      }
    }
    const std::string note = ConvertFloating(items, *st.options.dtype);
    if (!note.empty() && st.options.note) st.options.note(note);
  }
  // §4.12: the tensors a plan shards now view blocked storages.
  ShardPlan shards;
  if (st.options.tp != 0 || !st.options.shard.empty()) {
    std::vector<ShardItem> items;
    for (auto& e : st.entries) {
      for (auto& item : e.items)
        items.push_back({&item.name, &item.tensor, item.role == Role::kSparseComponent});
    }
    WithPath(st.path, [&] {
      shards = ApplyShardPlan(items, st.options.tp, st.options.shard, st.options.alignment);
    });
    if (!shards.note.empty() && st.options.note) st.options.note(shards.note);
  }
  format::IndexBuilder b(st.options.alignment);
  if (!shards.dims.empty()) WithPath(st.path, [&] { b.SetTensorParallel(st.options.tp); });

  // Storages in order of first use; each keeps the span its tensors cover.
  struct Span {
    const Storage* storage;
    uint64_t begin = UINT64_MAX, end = 0;
  };
  std::unordered_map<const Storage*, uint32_t> storage_ids;
  std::vector<Span> spans;
  for (const auto& e : st.entries) {
    for (const auto& item : e.items) {
      const Storage* key = item.tensor.storage.get();
      auto [it, inserted] = storage_ids.emplace(key, static_cast<uint32_t>(spans.size()));
      if (inserted) spans.push_back({key});
      uint64_t begin, end;
      item.tensor.ByteSpan(&begin, &end);
      Span& s = spans[it->second];
      s.begin = std::min(s.begin, begin);
      s.end = std::max(s.end, end);
    }
  }
  // A span starts on a multiple of 16 (the largest element size), so every
  // tensor's offset within it stays a whole number of its own elements.
  for (Span& s : spans) s.begin &= ~uint64_t{15};
  // A blocked storage is written whole: the padding between its slices too.
  for (const Storage* blocked : shards.blocked) {
    auto it = storage_ids.find(blocked);
    if (it != storage_ids.end()) spans[it->second].end = blocked->nbytes;
  }
  // With a base (spec §4.11), the spans whose bytes it holds become base
  // storages, named after the archive's own storages (both in first-use order).
  std::vector<uint32_t> in_base(spans.size(), format::kNone);
  std::optional<LayerBase> base;
  if (!st.options.base.empty()) {
    base.emplace(st.options.base, st.path);
    for (uint32_t i = 0; i < spans.size(); ++i) {
      in_base[i] = base->Find(*spans[i].storage, spans[i].begin, spans[i].end - spans[i].begin);
    }
  }
  std::vector<uint32_t> sids(spans.size());  // span -> storage index in the archive
  std::vector<uint32_t> own;                 // the spans written, in storage order
  uint64_t shared_bytes = 0, own_bytes = 0;
  for (uint32_t i = 0; i < spans.size(); ++i) {
    if (in_base[i] != format::kNone) continue;
    sids[i] = b.AddStorage(spans[i].end - spans[i].begin);
    own.push_back(i);
    own_bytes += spans[i].end - spans[i].begin;
  }
  if (base && own.size() < spans.size()) {
    WithPath(st.path, [&] { b.SetLayer(base->layer()); });
    const auto& records = base->archive().storages();
    for (uint32_t i = 0; i < spans.size(); ++i) {
      if (in_base[i] == format::kNone) continue;
      const StorageInfo& r = records[in_base[i]];
      WithPath(st.path, [&] { sids[i] = b.AddBaseStorage(in_base[i], r.nbytes, r.xxh3); });
      shared_bytes += r.nbytes;
    }
  }
  if (base && st.options.note) {
    st.options.note(own.size() == spans.size()
                        ? "no storage equals one of base " + format::Quote(st.options.base) +
                              ": wrote a standalone archive"
                        : "layer over " + format::Quote(base->layer().base_path) + ": " +
                              std::to_string(spans.size() - own.size()) + " of " +
                              std::to_string(spans.size()) + " storages (" +
                              std::to_string(shared_bytes) + " bytes) from the base, " +
                              std::to_string(own_bytes) + " bytes of its own");
  }
  uint32_t tensor_index = 0;                             // in the archive's tensor table
  size_t item_index = 0;                                 // over every entry's items, as `shards`
  std::unordered_map<std::string, uint32_t> tensor_ids;  // "entry\0name", for the value tree
  std::vector<uint32_t> sparse_ids(st.sparse.size(), format::kNone);
  for (const auto& e : st.entries) {
    b.AddEntry(e.name);
    for (const auto& item : e.items) {
      const TensorRef& t = item.tensor;
      if (item.sparse >= 0 && sparse_ids[item.sparse] == format::kNone) {
        const State::Sparse& sp = st.sparse[item.sparse];
        format::SparseSpec s;
        s.name = sp.name;
        s.layout = sp.layout;
        s.coalesced = sp.coalesced;
        s.sizes = sp.sizes;
        s.first_component = tensor_index;
        s.dtype = sp.dtype;
        s.strides = sp.strides;
        s.component_count = sp.component_count;
        WithPath(st.path, [&] { sparse_ids[item.sparse] = b.AddSparse(std::move(s)); });
      }
      const uint32_t span = storage_ids.at(t.storage.get());
      const uint32_t sid = sids[span];
      uint64_t begin, end;
      t.ByteSpan(&begin, &end);
      format::TensorSpec spec;
      spec.name = item.name;
      spec.storage = sid;
      spec.dtype = t.dtype;
      spec.role = static_cast<format::Role>(item.role);
      spec.requires_grad = t.requires_grad;
      spec.sizes = t.sizes;
      spec.strides = t.strides;
      spec.storage_offset = (begin - spans[span].begin) / ElementSize(t.dtype);
      spec.device_type = t.storage->device_type;
      spec.device_index = t.storage->device_index;
      if (item.sparse >= 0) spec.sparse = sparse_ids[item.sparse];
      if (!shards.dims.empty()) spec.shard_dim = shards.dims[item_index];
      ++item_index;
      WithPath(st.path, [&] { b.AddTensor(std::move(spec)); });
      if (st.value && item.sparse < 0) tensor_ids.emplace(e.name + '\0' + item.name, tensor_index);
      ++tensor_index;
    }
  }
  for (auto& [entry, kv] : st.metadata) {
    format::MetadataSpec m = MetadataSpecOf(kv.first, std::move(kv.second));
    if (!entry.empty()) {
      auto it = st.entry_index.find(entry);
      if (it != st.entry_index.end()) m.entry = it->second;
    }
    WithPath(st.path, [&] { b.AddMetadata(std::move(m)); });
  }
  if (st.value) {
    WithPath(st.path, [&] {
      b.SetValues(format::EncodeTree(
          *st.value,
          [&](const std::string& entry, const std::string& name) {
            auto it = tensor_ids.find(entry + '\0' + name);
            return it == tensor_ids.end() ? format::kNone : it->second;
          },
          [&](const std::string& entry) {
            auto it = st.entry_index.find(entry);
            return it == st.entry_index.end() ? format::kNone : it->second;
          }));
    });
  }
  WithPath(st.path, [&] { b.Plan(); });

  AtomicFile out(st.path);
  out.Resize(b.file_size());
  const uint64_t total = own_bytes;
  uint64_t done = 0;
  // Hash and write in cache-sized chunks: each chunk is read from RAM once.
  constexpr uint64_t kChunk = 4u << 20;
  std::vector<uint8_t> fetched;  // a chunk of a storage without host bytes (CUDA)
  SequentialWriter data(out);    // storages lie in increasing offset order (spec §4.8)
  for (uint32_t i = 0; i < own.size(); ++i) {
    const Span& s = spans[own[i]];
    const uint64_t n = s.end - s.begin;
    format::Xxh3Stream hash;
    for (uint64_t off = 0; off < n; off += kChunk) {
      const uint64_t len = std::min(kChunk, n - off);
      const uint8_t* src = s.storage->Bytes(s.begin + off, len, fetched);
      hash.Update(src, static_cast<size_t>(len));
      data.Write(b.storage_offset(i) + off, src, len);
      done += len;
      if (st.options.progress) st.options.progress(done, total);
    }
    b.SetStorageChecksum(i, hash.Digest());
  }
  data.Flush();
  const std::vector<uint8_t> head = b.EncodeHead();
  out.WriteAt(0, head.data(), head.size());
  out.Publish(st.options.durable);
  // A tensor-parallel archive leaves the page cache: written, its pages sit
  // there in folios of up to 2 MiB, and a fault maps a whole folio, so each
  // rank would map its neighbours' slices too (1.36x its bytes measured for
  // slices of 1-3 MiB). Read back by the ranks, each maps its own runs.
  if (!shards.dims.empty()) out.DropFromCache();
}

}  // namespace tsar::writer
