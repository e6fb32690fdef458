// writer::ArchiveWriter: tsar::Writer without LibTorch. It takes storages and
// tensor views (writer/tensor_ref.h) and writes the archive; tsar::Writer
// turns at::Tensor into them, the importers of `tsar pack` make them over
// their mapped inputs. Same rules, same bytes for the same tensors.
#pragma once

#include <memory>
#include <string>

#include "tsar/pack_options.h"
#include "tsar/value.h"
#include "writer/tensor_ref.h"

namespace tsar::writer {

// Why a metadata record of `key` with `value` (of entry `entry`, "" for the
// archive) may not be written, or "" when it may: a key starting with
// "file:" names an attached file (spec §4.7.1), so it must be archive-level
// bytes under a file name of the grammar (not empty, not absolute, no empty,
// "." or ".." component, no NUL byte); writers must not write any other.
std::string FileKeyRefusal(const std::string& key, const MetadataValue& value,
                           const std::string& entry);

// As tsar::Writer (include/tsar/writer.h): collects, then writes and
// publishes atomically in finish(). Errors name the output file.
class ArchiveWriter {
 public:
  // Throws kInvalidArgument for a bad alignment or a dtype that is not a
  // convertible floating dtype.
  ArchiveWriter(std::string path, PackOptions options);
  ~ArchiveWriter();
  ArchiveWriter(const ArchiveWriter&) = delete;
  ArchiveWriter& operator=(const ArchiveWriter&) = delete;

  const std::string& path() const;
  void add_entry(const std::string& name);
  void add(const std::string& name, TensorRef tensor, Role role = Role::kTensor);
  void add_sparse(const std::string& name, SparseRef sparse);
  // Throws kNotFound (no such entry), kInvalidValue (a "file:" key
  // FileKeyRefusal refuses, naming the key). The value is moved, not copied,
  // into the archive's head at finish().
  void add_metadata(const std::string& key, MetadataValue value, const std::string& entry = "");
  void set_value(Value root);
  void finish();

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace tsar::writer
