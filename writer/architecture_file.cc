// writer/architecture_file.h.
#include "writer/architecture_file.h"

#include <memory>

#include "writer/atomic_file.h"

namespace tsar::writer {

std::function<void(bool)> WriteArchitecture(const std::string& output, std::string_view bytes) {
  auto file = std::make_shared<AtomicFile>(output);
  file->CheckSpace(bytes.size());
  file->Resize(bytes.size());
  file->WriteAt(0, bytes.data(), bytes.size());
  return [file](bool durable) { file->Publish(durable); };
}

}  // namespace tsar::writer
