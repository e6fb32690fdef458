// Input readers of `tsar pack`: turn a file people have on disk (torch.save,
// TorchScript, safetensors, HDF5) into named entries of tensors and metadata,
// detected by content. Tensors are zero-copy views of the mapped input where
// the format allows, so packing never holds a second copy of the model.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tsar/archive_file.h"
#include "tsar/value.h"
#include "writer/detect.h"
#include "writer/tensor_ref.h"

namespace tsar::zip {
class Reader;
}

namespace tsar::importer {

struct Imported;
struct ImportOptions;
using ImportFunction = std::function<Imported(const std::string&, const ImportOptions&)>;

struct ImportOptions {
  // Refuse what cannot be kept as it is: objects that a torch.save file would
  // keep as opaque pickle fragments; values that HDF5 and safetensors
  // metadata cannot hold (instead of skipping them with a note).
  bool strict = false;
  // Entry name for inputs that hold a single state_dict.
  std::string default_entry = "model";
  // Inputs that read files below a directory (a TensorDict directory, the
  // shards of a safetensors index) refuse a symbolic link there that leaves
  // the directory (writer/safe_open.h); true follows every link (`tsar pack
  // --follow-symlinks`: a Hugging Face cache snapshot, whose files link to
  // ../../blobs).
  bool follow_symlinks = false;
  // Reads a TorchScript file: needs LibTorch, so it is ImportTorchScript
  // (writer/torchscript.h) where LibTorch is linked (tsar-torch, the Python
  // package) and unset elsewhere, where a TorchScript input is kUnsupported.
  ImportFunction torchscript;
};

struct Imported {
  struct Tensor {
    std::string name;
    writer::TensorRef tensor;
    Role role = Role::kTensor;
  };
  // A tensor group (spec §4.13, format 1.5: a torchao quantized weight):
  // `group` has layout kGroup, its members as components (suffix
  // ".<member>", each named "<name>.<member>" in the archive) and its
  // description. It stands in its entry before tensors[before]
  // (tensors.size(): after all of them).
  struct Group {
    std::string name;
    writer::SparseRef group;
    size_t before = 0;
  };
  struct Entry {
    std::string name;
    std::vector<Tensor> tensors;
    std::vector<Group> groups = {};  // in entry order (ascending `before`)
  };
  struct Meta {
    std::string entry;  // "" = archive-level
    std::string key;
    MetadataValue value;
  };
  InputKind kind = InputKind::kUnknown;
  std::vector<Entry> entries;
  // What the input was as a whole (torch.save files): its structure, whose
  // tensors are those of `entries` by (entry, name). The archive stores it
  // unless `entries` and `metadata` imply it already (spec §4.10.3).
  std::optional<Value> value;
  // Metadata to store when the archive has no tree (torch.save: the scalars at
  // the top of a dict and each state_dict's _metadata, which the implied tree
  // turns back into them).
  std::vector<Meta> metadata;
  // True when `metadata` is not derived from `value` (a tsar input holds
  // both side by side): it is stored with the tree instead of dropped.
  bool metadata_beside_tree = false;
  std::vector<std::string>
      skipped;  // one line each: what was skipped and why, without the input's path
};

// Detects and imports. Throws kBadInput naming the file, the offset where
// known, what was wrong and what was expected; kBadInput "not a ... file"
// listing the accepted kinds for anything else.
Imported Import(const std::string& path, const ImportOptions& options = {});

// The first line of an exception's message: a c10::Error without LibTorch's
// C++ backtrace.
std::string FirstLine(const std::exception& e);

Imported ImportSafetensors(const std::string& path, const ImportOptions& options);
Imported ImportSafetensorsIndex(const std::string& path, const ImportOptions& options);
Imported ImportHdf5(const std::string& path, const ImportOptions& options);
// A directory TensorDict's memmap() wrote, or its top meta.json
// (writer/import_tensordict.cc): one entry, nested keys joined with '.'.
Imported ImportTensorDict(const std::string& path, const ImportOptions& options);
// A tsar archive, a layer's base storages included (writer/import_tsar.cc):
// packing it writes a standalone archive (a flattened layer), or a layer
// over another base.
Imported ImportTsar(const std::string& path, const ImportOptions& options);

// A whole input file mapped read-only (MAP_PRIVATE, PROT_READ). Storages
// made from it keep the mapping alive.
//
// A file truncated while mapped would kill the process with SIGBUS at the
// first read of a page past its new end. While a MappedInput lives, such a
// fault on its pages is caught (a SIGBUS handler, installed at the first
// Open, that hands every other fault to the handler before it): the pages
// from there to the end of the mapping read as zeros from then on, and the
// input is marked changed; CheckInputsUnchanged() then throws naming it. Who
// reads a MappedInput's bytes into something that lasts (PackFiles: the
// archive) calls it before publishing.
class MappedInput {
 public:
  // Throws kNotFound / kIo.
  static std::shared_ptr<const MappedInput> Open(const std::string& path);
  // The regular file open at `fd` (of `size` bytes, named `path` in
  // messages); closes `fd`, also when it throws (kIo).
  static std::shared_ptr<const MappedInput> Open(int fd, uint64_t size, const std::string& path);
  ~MappedInput();
  const uint8_t* data() const { return data_; }
  uint64_t size() const { return size_; }
  const std::string& path() const { return path_; }
  // A storage over bytes [offset, offset + nbytes) of the file; the caller
  // has checked the range. The storage holds a reference to `self`.
  static std::shared_ptr<const writer::Storage> Storage(
      const std::shared_ptr<const MappedInput>& self, uint64_t offset, uint64_t nbytes);

 private:
  friend struct MappedInputRegistry;
  MappedInput() = default;
  std::string path_;
  const uint8_t* data_ = nullptr;
  uint64_t size_ = 0;
  size_t slot_ = SIZE_MAX;  // in the registry the SIGBUS handler reads
  long owner_ = 0;          // the thread that opened it (gettid)
};

// Throws kBadInput ("changed while being read") naming an input that the
// calling thread opened (MappedInput, still alive) and that a read found
// truncated; with `check_sizes`, also one whose file is now shorter than its
// mapping (a write(2) from such a mapping fails with EFAULT, no SIGBUS: call
// it with true when a write failed). Cheap when no input was ever truncated.
void CheckInputsUnchanged(bool check_sizes = false);

// ImportSafetensors over a file opened already (below an input directory:
// InputDir, writer/safe_open.h).
Imported ImportSafetensorsMapped(const std::shared_ptr<const MappedInput>& input,
                                 const ImportOptions& options);

Imported ImportTorchSave(const std::string& path, const ImportOptions& options);
// The same, for a torch.save zip whose central directory `zip` (over
// `input`) was read already.
Imported ImportTorchSave(const std::string& path, const std::shared_ptr<const MappedInput>& input,
                         const zip::Reader& zip, const ImportOptions& options);

// A tensor of `dtype` viewing `storage`; sizes and strides in elements. The
// caller has validated the extent against the storage. Throws kBadInput
// naming `path` and `what` for a view the spec's rules R48-R52, R78 refuse
// (LibTorch could not build it: sizes whose non-zero product passes
// 2^63 - 1, even when a size is 0).
writer::TensorRef MakeView(std::shared_ptr<const writer::Storage> storage, DType dtype,
                           const std::vector<int64_t>& sizes, const std::vector<int64_t>& strides,
                           uint64_t storage_offset, const std::string& what,
                           const std::string& path);

}  // namespace tsar::importer
