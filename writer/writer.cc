// tsar::Writer (include/tsar/writer.h): checks what LibTorch hands it and
// passes the tensors on, as Torch-free views, to writer::ArchiveWriter, which
// writes the archive.
#include "tsar/writer.h"

#include <sstream>

#include "format/reader.h"
#include "loader/scalar_type.h"
#include "writer/archive_writer.h"
#include "writer/from_tensor.h"

namespace tsar {

struct Writer::State {
  State(std::string path, PackOptions options) : out(std::move(path), std::move(options)) {}
  writer::ArchiveWriter out;
  writer::TensorRefs refs;
};

namespace {

[[noreturn]] void Refuse(ErrorCode code, const std::string& tensor, const std::string& what) {
  throw Error(code, "", std::nullopt, "tensor " + format::Quote(tensor) + ": " + what);
}

}  // namespace

Writer::Writer(std::string path, PackOptions options)
    : state_(std::make_unique<State>(std::move(path), std::move(options))) {}

Writer::~Writer() = default;

void Writer::set_value(Value root) { state_->out.set_value(std::move(root)); }

void Writer::add_entry(const std::string& name) { state_->out.add_entry(name); }

void Writer::add(const std::string& name, const at::Tensor& tensor, Role role) {
  if (!tensor.defined()) Refuse(ErrorCode::kInvalidArgument, name, "undefined tensor");
  if (tensor.layout() != c10::kStrided) {
    AddSparse(name, tensor);
    return;
  }
  if (const std::string why = writer::WhyNotPackable(tensor); !why.empty()) {
    Refuse(ErrorCode::kUnsupported, name, why);
  }
  state_->out.add(name, state_->refs.Of(tensor), role);
}

// A sparse COO, CSR or CSC tensor becomes a sparse record and its component
// tensors "<name>.indices"/".values" (COO), "<name>.crow_indices"/".col_indices"
// /".values" (CSR), "<name>.ccol_indices"/".row_indices"/".values" (CSC): views,
// written like any other tensor.
void Writer::AddSparse(const std::string& name, const at::Tensor& t) {
  writer::SparseRef sp;
  sp.sizes.assign(t.sizes().begin(), t.sizes().end());
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
    if (!writer::WhyNotPackable(part).empty()) {
      Refuse(ErrorCode::kUnsupported, name + suffix, "component of an unsupported dtype or device");
    }
  }
  for (const auto& [suffix, part] : parts)
    sp.components.emplace_back(suffix, state_->refs.Of(part));
  state_->out.add_sparse(name, std::move(sp));
}

void Writer::add(const torch::OrderedDict<std::string, at::Tensor>& tensors, Role role) {
  for (const auto& item : tensors) add(item.key(), item.value(), role);
}

void Writer::add_metadata(const std::string& key, MetadataValue value, const std::string& entry) {
  state_->out.add_metadata(key, std::move(value), entry);
}

void Writer::finish() { state_->out.finish(); }

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
