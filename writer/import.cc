// Input detection by content and dispatch for `tsar pack` (writer/importer.h).
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "format/endian.h"
#include "format/spec.h"
#include "loader/open_file.h"
#include "writer/importer.h"
#include "writer/zip_reader.h"

namespace tsar::importer {

const char* InputKindName(InputKind kind) {
  switch (kind) {
    case InputKind::kTorchSave:
      return "torch.save";
    case InputKind::kTorchScript:
      return "TorchScript";
    case InputKind::kSafetensors:
      return "safetensors";
    case InputKind::kSafetensorsIndex:
      return "safetensors index";
    case InputKind::kHdf5:
      return "HDF5";
    case InputKind::kUnknown:
      break;
  }
  return "unknown";
}

namespace {

// A zip whose central directory names TorchScript's records.
bool IsTorchScript(const zip::Reader& zip) {
  return zip.Find(zip.prefix() + "constants.pkl") || zip.Find(zip.prefix() + "code/__torch__.py");
}

// What the first bytes say; every zip is kTorchSave here.
InputKind DetectByBytes(const std::string& path) {
  struct stat st;
  const int fd = OpenRegularFile(path, &st, ErrorCode::kBadInput);
  uint8_t b[16] = {0};
  const ssize_t n = pread(fd, b, sizeof b, 0);
  const off_t size = lseek(fd, 0, SEEK_END);
  close(fd);
  if (n < 0)
    throw Error(ErrorCode::kIo, path, std::nullopt,
                std::string("cannot read: ") + std::strerror(errno));
  static const uint8_t kHdf5[8] = {0x89, 'H', 'D', 'F', '\r', '\n', 0x1a, '\n'};
  if (n >= 8 && std::memcmp(b, kHdf5, 8) == 0) return InputKind::kHdf5;
  if (n >= 4 && b[0] == 'P' && b[1] == 'K' && b[2] == 3 && b[3] == 4) return InputKind::kTorchSave;
  if (n >= 9) {
    const uint64_t header = format::LoadU64(b);
    // A header starting with whitespace is not valid safetensors, but it is
    // meant to be: the importer says what is wrong with it.
    const bool json_start =
        b[8] == '{' || b[8] == ' ' || b[8] == '\n' || b[8] == '\t' || b[8] == '\r';
    if (json_start && header >= 2 && header <= static_cast<uint64_t>(size) - 8)
      return InputKind::kSafetensors;
  }
  size_t i = 0;
  while (i < static_cast<size_t>(n) && std::isspace(b[i])) ++i;
  if (i < static_cast<size_t>(n) && b[i] == '{') return InputKind::kSafetensorsIndex;
  return InputKind::kUnknown;
}

}  // namespace

InputKind Detect(const std::string& path) {
  const InputKind kind = DetectByBytes(path);
  if (kind != InputKind::kTorchSave) return kind;
  try {
    const auto input = MappedInput::Open(path);
    if (IsTorchScript(zip::Reader(input->data(), input->size(), path)))
      return InputKind::kTorchScript;
  } catch (const Error&) {
    // A damaged or foreign zip: the torch.save importer names what is wrong.
  }
  return InputKind::kTorchSave;
}

Imported Import(const std::string& path, const ImportOptions& options) {
  const InputKind kind = DetectByBytes(path);
  if (kind == InputKind::kTorchSave) {
    // The central directory is read once, to tell TorchScript from torch.save
    // and to import (100,000 records take a tenth of a second).
    const auto input = MappedInput::Open(path);
    const zip::Reader zip(input->data(), input->size(), path);
    return IsTorchScript(zip) ? ImportTorchScript(path, options)
                              : ImportTorchSave(path, input, zip, options);
  }
  switch (kind) {
    case InputKind::kTorchSave:
    case InputKind::kTorchScript:
      break;  // above; DetectByBytes calls every zip torch.save
    case InputKind::kSafetensors:
      return ImportSafetensors(path, options);
    case InputKind::kSafetensorsIndex:
      return ImportSafetensorsIndex(path, options);
    case InputKind::kHdf5:
      return ImportHdf5(path, options);
    case InputKind::kUnknown:
      break;
  }
  uint8_t b[8] = {0};
  struct stat st;
  const int fd = OpenRegularFile(path, &st, ErrorCode::kBadInput);
  const ssize_t n = pread(fd, b, sizeof b, 0);
  if (fd >= 0) close(fd);
  std::string hint;
  if (n >= 5 && std::memcmp(b, format::kMagic, 5) == 0) hint = " (it is already a tsar archive)";
  if (n >= 2 && b[0] == 0x80 && b[1] <= 5) {
    hint =
        " (it looks like a legacy torch.save file from before PyTorch 1.6: re-save it with "
        "torch.save(obj, f, _use_new_zipfile_serialization=True))";
  }
  throw Error(
      ErrorCode::kBadInput, path, std::nullopt,
      "expected a torch.save zip, a TorchScript archive, a safetensors file or index, or an "
      "HDF5 file, found none of them" +
          hint);
}

}  // namespace tsar::importer
