// NotAnArchiveHint (loader/not_an_archive.h). No LibTorch.
#include "loader/not_an_archive.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>

#include "loader/open_file.h"
#include "writer/detect.h"

namespace tsar {
namespace {

bool EndsWith(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// A pickle of protocol 2 to 5 (0x80 <proto>): what torch.save wrote before
// PyTorch 1.6, or with _use_new_zipfile_serialization=False.
bool IsLegacyPickle(const std::string& path) {
  struct stat st;
  int fd = -1;
  try {
    fd = OpenRegularFile(path, &st, ErrorCode::kInvalidArgument);
  } catch (const Error&) {
    return false;
  }
  uint8_t b[2] = {0, 0};
  const ssize_t n = pread(fd, b, sizeof b, 0);
  close(fd);
  return n == 2 && b[0] == 0x80 && b[1] >= 2 && b[1] <= 5;
}

}  // namespace

std::string NotAnArchiveHint(const std::string& path) {
  importer::InputKind kind = importer::InputKind::kUnknown;
  try {
    kind = importer::Detect(path);
  } catch (const Error&) {
    return "";
  }
  const char* what = nullptr;
  switch (kind) {
    case importer::InputKind::kTorchSave:
      what = "a torch.save file";
      break;
    case importer::InputKind::kTorchScript:
      what = "a TorchScript file";
      break;
    case importer::InputKind::kSafetensors:
      what = "a safetensors file";
      break;
    case importer::InputKind::kSafetensorsIndex:
      // Any JSON text reads as an index by content; only one named so is called one.
      if (EndsWith(path, ".index.json")) what = "a safetensors index";
      break;
    case importer::InputKind::kHdf5:
      what = "an HDF5 file";
      break;
    default:
      break;
  }
  if (what != nullptr) {
    return std::string("not a tsar archive (") + what + "): pack it first: tsar pack " + path +
           " -o ARCHIVE.tsar (tsar.pack in Python)";
  }
  if (IsLegacyPickle(path)) {
    return "not a tsar archive (a legacy torch.save file, a pickle from before PyTorch 1.6): "
           "tsar pack reads torch.save's zip format: re-save it with torch.save(torch.load(" +
           path + "), NEW.pt) and pack that: tsar pack NEW.pt -o ARCHIVE.tsar";
  }
  return "";
}

Error WithNotAnArchiveHint(const Error& e) {
  if (e.code() != ErrorCode::kBadMagic) return e;
  const std::string hint = NotAnArchiveHint(e.path());
  if (hint.empty()) return e;
  // what() is "<path>: offset <o> (0x<o>): <message>": keep the message part.
  const std::string prefix = Error(e.code(), e.path(), e.offset(), "").what();
  std::string message = e.what();
  if (message.compare(0, prefix.size(), prefix) == 0) message.erase(0, prefix.size());
  return Error(e.code(), e.path(), e.offset(), message + "; " + hint);
}

}  // namespace tsar
