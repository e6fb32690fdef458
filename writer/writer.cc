// tsar::Writer (include/tsar/writer.h): dedupes storages, writes only the
// byte span each storage's tensors cover, hashes while writing, publishes
// atomically. Layout and encoding are format/encode.cc's.
#include "tsar/writer.h"

#include <ATen/ops/empty.h>
#include <c10/core/Storage.h>

#include <algorithm>
#include <optional>
#include <sstream>
#include <unordered_map>

#include "format/checksum.h"
#include "format/encode.h"
#include "format/reader.h"
#include "format/value_tree.h"
#include "loader/scalar_type.h"
#include "writer/atomic_file.h"
#include "writer/convert_dtype.h"

namespace tsar {

struct Writer::State {
  struct Item {
    std::string name;
    at::Tensor tensor;
    Role role;
    int sparse = -1;  // index in `sparse` for a sparse tensor's component
  };
  // A sparse tensor (spec §4.6): its components follow as consecutive items.
  struct Sparse {
    std::string name;
    format::SparseLayout layout;
    bool coalesced;
    std::vector<int64_t> sizes;
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

[[noreturn]] void Refuse(ErrorCode code, const std::string& tensor, const std::string& what) {
  throw Error(code, "", std::nullopt, "tensor " + format::Quote(tensor) + ": " + what);
}

// The bytes [begin, end) of its storage that a strided view can reach.
void ByteSpan(const at::Tensor& t, uint64_t* begin, uint64_t* end) {
  const uint64_t esize = t.element_size();
  *begin = static_cast<uint64_t>(t.storage_offset()) * esize;
  if (t.numel() == 0) {
    *end = *begin;
    return;
  }
  uint64_t last = static_cast<uint64_t>(t.storage_offset());
  for (int64_t d = 0; d < t.dim(); ++d) {
    last += static_cast<uint64_t>(t.size(d) - 1) * static_cast<uint64_t>(t.stride(d));
  }
  *end = (last + 1) * esize;
}

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

}  // namespace

Writer::Writer(std::string path, PackOptions options) : state_(std::make_unique<State>()) {
  state_->path = std::move(path);
  state_->options = std::move(options);
  WithPath(state_->path, [&] { format::IndexBuilder check(state_->options.alignment); });
  const auto& dtype = state_->options.dtype;
  if (dtype && !writer::IsConvertibleFloating(*dtype)) {
    throw Error(ErrorCode::kInvalidArgument, state_->path, std::nullopt,
                std::string("PackOptions::dtype: expected float16, bfloat16, float32 or float64, "
                            "found ") +
                    c10::toString(*dtype));
  }
}

Writer::~Writer() = default;

void Writer::set_value(Value root) { state_->value = std::move(root); }

void Writer::add_entry(const std::string& name) {
  if (!state_->entry_index.emplace(name, static_cast<uint32_t>(state_->entries.size())).second) {
    throw Error(ErrorCode::kDuplicateName, state_->path, std::nullopt,
                "entry " + format::Quote(name) + ": expected a unique entry name, found it twice");
  }
  state_->entries.push_back({name, {}});
}

void Writer::add(const std::string& name, const at::Tensor& tensor, Role role) {
  if (state_->entries.empty()) add_entry(state_->options.entry);
  if (!tensor.defined()) Refuse(ErrorCode::kInvalidArgument, name, "undefined tensor");
  if (tensor.layout() != c10::kStrided) {
    AddSparse(name, tensor);
    return;
  }
  if (tensor.is_quantized()) {
    Refuse(ErrorCode::kUnsupported, name,
           "quantized tensors are not supported; dequantize() first");
  }
  if (!tensor.device().is_cpu() && !tensor.device().is_cuda()) {
    Refuse(ErrorCode::kUnsupported, name,
           "tensors on " + tensor.device().str() + " cannot be packed");
  }
  if (!FromScalarType(tensor.scalar_type())) {
    Refuse(ErrorCode::kUnsupported, name,
           std::string("dtype ") + c10::toString(tensor.scalar_type()) + " has no tsar code");
  }
  state_->entries.back().items.push_back({name, tensor, role});
}

// A sparse COO, CSR or CSC tensor becomes a sparse record and its component
// tensors "<name>.indices"/".values" (COO), "<name>.crow_indices"/".col_indices"
// /".values" (CSR), "<name>.ccol_indices"/".row_indices"/".values" (CSC): views,
// written like any other tensor.
void Writer::AddSparse(const std::string& name, const at::Tensor& t) {
  State::Sparse sp{name, format::SparseLayout::kCoo, false, {t.sizes().begin(), t.sizes().end()}};
  std::vector<std::pair<std::string, at::Tensor>> parts;
  if (t.layout() == c10::kSparse) {
    sp.coalesced = t.is_coalesced();
    parts = {{".indices", t._indices()}, {".values", t._values()}};
  } else if (t.layout() == c10::kSparseCsr) {
    sp.layout = format::SparseLayout::kCsr;
    parts = {{".crow_indices", t.crow_indices()},
             {".col_indices", t.col_indices()},
             {".values", t.values()}};
  } else if (t.layout() == c10::kSparseCsc) {
    sp.layout = format::SparseLayout::kCsc;
    parts = {{".ccol_indices", t.ccol_indices()},
             {".row_indices", t.row_indices()},
             {".values", t.values()}};
  } else {
    std::ostringstream layout;
    layout << t.layout();
    Refuse(ErrorCode::kUnsupported, name,
           "layout " + layout.str() + " is not supported (strided, sparse COO, CSR, CSC are)");
  }
  for (const auto& [suffix, part] : parts) {
    if (part.is_quantized() || (!part.device().is_cpu() && !part.device().is_cuda()) ||
        !FromScalarType(part.scalar_type())) {
      Refuse(ErrorCode::kUnsupported, name + suffix, "component of an unsupported dtype or device");
    }
  }
  state_->sparse.push_back(std::move(sp));
  const int id = static_cast<int>(state_->sparse.size() - 1);
  for (auto& [suffix, part] : parts) {
    state_->entries.back().items.push_back({name + suffix, part, Role::kSparseComponent, id});
  }
}

void Writer::add(const torch::OrderedDict<std::string, at::Tensor>& tensors, Role role) {
  for (const auto& item : tensors) add(item.key(), item.value(), role);
}

void Writer::add_metadata(const std::string& key, MetadataValue value, const std::string& entry) {
  if (!entry.empty()) {
    if (!state_->entry_index.count(entry)) {
      throw Error(ErrorCode::kNotFound, state_->path, std::nullopt,
                  "metadata " + format::Quote(key) + ": no entry " + format::Quote(entry));
    }
  }
  state_->metadata.push_back({entry, {key, std::move(value)}});
}

void Writer::finish() {
  State& st = *state_;
  if (st.finished)
    throw Error(ErrorCode::kInvalidArgument, st.path, std::nullopt, "finish() called twice");
  st.finished = true;
  if (st.options.dtype) {
    std::vector<writer::ConvertItem> items;
    for (auto& e : st.entries) {
      for (auto& item : e.items) items.push_back({&item.name, &item.tensor});
    }
    const std::string note = writer::ConvertFloating(items, *st.options.dtype);
    if (!note.empty() && st.options.note) st.options.note(note);
  }
  format::IndexBuilder b(st.options.alignment);

  // Storages in order of first use; each keeps the span its tensors cover.
  struct Span {
    at::Tensor any;  // a tensor on this storage, to reach its bytes
    uint64_t begin = UINT64_MAX, end = 0;
  };
  std::unordered_map<const c10::StorageImpl*, uint32_t> storage_ids;
  std::vector<Span> spans;
  for (const auto& e : st.entries) {
    for (const auto& item : e.items) {
      const c10::StorageImpl* key = item.tensor.storage().unsafeGetStorageImpl();
      auto [it, inserted] = storage_ids.emplace(key, static_cast<uint32_t>(spans.size()));
      if (inserted) spans.push_back({item.tensor});
      uint64_t begin, end;
      ByteSpan(item.tensor, &begin, &end);
      Span& s = spans[it->second];
      s.begin = std::min(s.begin, begin);
      s.end = std::max(s.end, end);
    }
  }
  // A span starts on a multiple of 16 (the largest element size), so every
  // tensor's offset within it stays a whole number of its own elements.
  for (Span& s : spans) {
    s.begin &= ~uint64_t{15};
    b.AddStorage(s.end - s.begin);
  }
  uint32_t tensor_index = 0;                             // in the archive's tensor table
  std::unordered_map<std::string, uint32_t> tensor_ids;  // "entry\0name", for the value tree
  std::vector<uint32_t> sparse_ids(st.sparse.size(), format::kNone);
  for (const auto& e : st.entries) {
    b.AddEntry(e.name);
    for (const auto& item : e.items) {
      const at::Tensor& t = item.tensor;
      if (item.sparse >= 0 && sparse_ids[item.sparse] == format::kNone) {
        const State::Sparse& sp = st.sparse[item.sparse];
        format::SparseSpec s;
        s.name = sp.name;
        s.layout = sp.layout;
        s.coalesced = sp.coalesced;
        s.sizes = sp.sizes;
        s.first_component = tensor_index;
        WithPath(st.path, [&] { sparse_ids[item.sparse] = b.AddSparse(std::move(s)); });
      }
      const uint32_t sid = storage_ids.at(t.storage().unsafeGetStorageImpl());
      uint64_t begin, end;
      ByteSpan(t, &begin, &end);
      format::TensorSpec spec;
      spec.name = item.name;
      spec.storage = sid;
      spec.dtype = *FromScalarType(t.scalar_type());
      spec.role = static_cast<format::Role>(item.role);
      spec.requires_grad = t.requires_grad();
      spec.sizes.assign(t.sizes().begin(), t.sizes().end());
      spec.strides.assign(t.strides().begin(), t.strides().end());
      spec.storage_offset = (begin - spans[sid].begin) / t.element_size();
      if (t.device().is_cuda()) {
        spec.device_type = format::DeviceType::kCuda;
        spec.device_index = static_cast<uint16_t>(t.device().index());
      }
      if (item.sparse >= 0) spec.sparse = sparse_ids[item.sparse];
      WithPath(st.path, [&] { b.AddTensor(std::move(spec)); });
      if (st.value && item.sparse < 0) tensor_ids.emplace(e.name + '\0' + item.name, tensor_index);
      ++tensor_index;
    }
  }
  const uint32_t none = format::kNone;
  for (const auto& [entry, kv] : st.metadata) {
    format::MetadataSpec m;
    m.key = kv.first;
    m.entry = none;
    if (!entry.empty()) {
      auto it = st.entry_index.find(entry);
      if (it != st.entry_index.end()) m.entry = it->second;
    }
    if (const auto* s = std::get_if<std::string>(&kv.second)) {
      m.type = format::MetaType::kString;
      m.bytes = *s;
    } else if (const auto* i = std::get_if<int64_t>(&kv.second)) {
      m.type = format::MetaType::kInt;
      m.int_value = *i;
    } else if (const auto* d = std::get_if<double>(&kv.second)) {
      m.type = format::MetaType::kFloat;
      m.float_value = *d;
    } else {
      m.type = format::MetaType::kBytes;
      m.bytes = std::get<Bytes>(kv.second).data;
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
  uint64_t total = 0, done = 0;
  for (const Span& s : spans) total += s.end - s.begin;
  // Hash and write in cache-sized chunks: each chunk is read from RAM once.
  constexpr uint64_t kChunk = 4u << 20;
  for (uint32_t i = 0; i < spans.size(); ++i) {
    const Span& s = spans[i];
    const uint64_t n = s.end - s.begin;
    at::Tensor host;  // for CUDA storages: this span, copied to the host
    const uint8_t* src;
    if (s.any.device().is_cuda()) {
      host =
          at::empty({0}, s.any.options().dtype(at::kByte))
              .set_(s.any.storage(), static_cast<int64_t>(s.begin), {static_cast<int64_t>(n)}, {1})
              .to(at::kCPU);
      src = static_cast<const uint8_t*>(host.data_ptr());
    } else {
      src = static_cast<const uint8_t*>(s.any.storage().data()) + s.begin;
    }
    format::Xxh3Stream hash;
    for (uint64_t off = 0; off < n; off += kChunk) {
      const uint64_t len = std::min(kChunk, n - off);
      hash.Update(src + off, static_cast<size_t>(len));
      out.WriteAt(b.storage_offset(i) + off, src + off, len);
      done += len;
      if (st.options.progress) st.options.progress(done, total);
    }
    b.SetStorageChecksum(i, hash.Digest());
  }
  const std::vector<uint8_t> head = b.EncodeHead();
  out.WriteAt(0, head.data(), head.size());
  out.Publish(st.options.durable);
}

void pack(const std::string& path, const torch::OrderedDict<std::string, at::Tensor>& tensors,
          const PackOptions& options) {
  Writer w(path, options);
  w.add(tensors);
  w.finish();
}

void pack(const std::string& path, const std::vector<std::pair<std::string, at::Tensor>>& tensors,
          const PackOptions& options) {
  Writer w(path, options);
  for (const auto& [name, t] : tensors) w.add(name, t);
  w.finish();
}

}  // namespace tsar
