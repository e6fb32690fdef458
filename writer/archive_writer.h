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
  void add_metadata(const std::string& key, MetadataValue value, const std::string& entry = "");
  void set_value(Value root);
  void finish();

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace tsar::writer
