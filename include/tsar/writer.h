// tsar::pack and tsar::Writer: write a .tsar archive (spec/FORMAT.md) from
// LibTorch tensors, deterministically and atomically.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/ordered_dict.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "tsar/archive.h"
#include "tsar/pack_options.h"
#include "tsar/value.h"

namespace torch::nn {
class Module;
}
namespace torch::jit {
struct Module;
}

namespace tsar {

// Collects tensors and metadata, then writes the archive in finish():
// to an unnamed temporary file in the destination directory, flushed, then
// renamed into place and the directory flushed. Nothing is visible at `path`
// until finish() succeeds; an existing file there is replaced atomically or
// left untouched. Tensors are read where they are at finish() (no copy of
// the model in RAM; CUDA tensors are copied to the host 4 MiB at a time).
// Tensors sharing a storage are written once, only the byte span they cover.
// Sparse COO, CSR and CSC tensors are written as a sparse record plus their
// component tensors (spec §4.6) and load back as sparse tensors.
// Errors: kInvalidArgument / kDuplicateName (misuse, naming the tensor),
// kUnsupported (quantized or meta tensors, other layouts), kIo (writing).
// Not thread-safe.
class Writer {
 public:
  explicit Writer(std::string path, PackOptions options = {});
  ~Writer();
  Writer(const Writer&) = delete;
  Writer& operator=(const Writer&) = delete;

  // Starts a new named entry (a state_dict); later add() calls go to it.
  void add_entry(const std::string& name);
  void add(const std::string& name, const at::Tensor& tensor, Role role = Role::kTensor);
  void add(const torch::OrderedDict<std::string, at::Tensor>& tensors, Role role = Role::kTensor);
  // Parameters (role parameter) and buffers (role buffer) of a module, named
  // as state_dict() names them.
  void add_module(const torch::nn::Module& module);
  void add_module(const torch::jit::Module& module);

  // Metadata; entry "" = archive-level, else an entry added before.
  void add_metadata(const std::string& key, MetadataValue value, const std::string& entry = "");

  // The structure of what was packed (a checkpoint's dicts, lists, numbers,
  // opaque objects...), whose tensors and entries name ones added here
  // (spec §4.10). With it the archive is format 1.1, which 1.0 readers
  // refuse; Archive::value() reads it back. A tree that names an unknown
  // tensor or entry, or breaks a rule of §4.10, makes finish() throw
  // kInvalidArgument.
  void set_value(Value root);

  // Writes and publishes the archive. Call once.
  void finish();

 private:
  void AddSparse(const std::string& name, const at::Tensor& sparse);
  struct State;
  std::unique_ptr<State> state_;
};

// One-call forms. For a module, pack the module itself: its parameters and
// its buffers (BatchNorm's running statistics), named as state_dict() names
// them, with roles parameter and buffer, which is what bind() expects.
void pack(const std::string& path, const torch::nn::Module& module,
          const PackOptions& options = {});
void pack(const std::string& path, const torch::jit::Module& module,
          const PackOptions& options = {});
// Named tensors as they are (role tensor). Module::named_parameters() is such
// an OrderedDict, but it leaves the buffers out: a later bind() of a module
// with buffers finds them missing.
void pack(const std::string& path, const torch::OrderedDict<std::string, at::Tensor>& tensors,
          const PackOptions& options = {});
void pack(const std::string& path, const std::vector<std::pair<std::string, at::Tensor>>& tensors,
          const PackOptions& options = {});

}  // namespace tsar
