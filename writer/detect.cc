// Input detection by content (writer/detect.h). No LibTorch.
#include "writer/detect.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <memory>
#include <vector>

#include "format/endian.h"
#include "format/reader.h"
#include "format/spec.h"
#include "loader/mapping.h"
#include "loader/open_file.h"
#include "tsar/error.h"
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
    case InputKind::kTsar:
      return "tsar";
    case InputKind::kTensorDict:
      return "TensorDict memmap";
    case InputKind::kTransformers:
      return "transformers";
    case InputKind::kUnknown:
      break;
  }
  return "unknown";
}

// A zip whose central directory names TorchScript's records.
bool IsTorchScript(const zip::Reader& zip) {
  return zip.Find(zip.prefix() + "constants.pkl") || zip.Find(zip.prefix() + "code/__torch__.py");
}

namespace {

bool IsRegularFile(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

// What a directory holds, for a message: up to 12 names, sorted, directories
// with a '/', "empty" for none.
std::string DirectoryListing(const std::string& dir) {
  std::vector<std::string> names;
  if (DIR* d = opendir(dir.c_str())) {
    while (const dirent* e = readdir(d)) {
      const std::string name = e->d_name;
      if (name == "." || name == "..") continue;
      struct stat st;
      const bool sub = stat((dir + "/" + name).c_str(), &st) == 0 && S_ISDIR(st.st_mode);
      names.push_back(format::Quote(name) + (sub ? "/" : ""));
    }
    closedir(d);
  } else {
    return std::string("an unreadable directory (") + std::strerror(errno) + ")";
  }
  if (names.empty()) return "an empty directory";
  std::sort(names.begin(), names.end());
  std::string out;
  for (size_t i = 0; i < names.size() && i < 12; ++i) out += (i ? ", " : "") + names[i];
  if (names.size() > 12) out += ", ... (" + std::to_string(names.size()) + " in all)";
  return out;
}

}  // namespace

std::string TransformersWeights(const std::string& dir) {
  // Any config.json (a FIFO, a link out, a directory): the directory is a
  // transformers one by its weights, and the importer says what is wrong.
  struct stat st;
  if (lstat((dir + "/config.json").c_str(), &st) != 0) return "";
  for (const char* name : {"model.safetensors", "model.safetensors.index.json"}) {
    if (IsRegularFile(dir + "/" + name)) return name;
  }
  return "";
}

InputKind DetectByBytes(const std::string& path) {
  struct stat st;
  if (stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
    // Any meta.json (a FIFO, a link): the TensorDict importer says what it is.
    struct stat meta;
    if (lstat((path + "/meta.json").c_str(), &meta) == 0) return InputKind::kTensorDict;
    if (!TransformersWeights(path).empty()) return InputKind::kTransformers;
    std::string what =
        "expected a directory that transformers' save_pretrained wrote (config.json with "
        "model.safetensors or model.safetensors.index.json) or one that TensorDict's memmap() "
        "wrote (meta.json), found " +
        DirectoryListing(path);
    struct stat config;
    if (lstat((path + "/config.json").c_str(), &config) == 0) {
      what +=
          "; a transformers directory without safetensors weights: save it with "
          "save_pretrained(DIR) (safetensors is its default), or pack its weights file alone";
    } else {
      for (const char* weights : {"model.safetensors", "model.safetensors.index.json"}) {
        if (!IsRegularFile(path + "/" + weights)) continue;
        std::string file = path;
        while (file.size() > 1 && file.back() == '/') file.pop_back();
        what += std::string("; without config.json it is not a transformers directory: to pack ") +
                "its weights alone, pack the file: tsar pack " + file + "/" + weights;
        break;
      }
    }
    throw Error(ErrorCode::kBadInput, path, std::nullopt, what);
  }
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
  if (n >= 8 && std::memcmp(b, format::kMagic, 8) == 0) return InputKind::kTsar;
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

InputKind Detect(const std::string& path) {
  const InputKind kind = DetectByBytes(path);
  if (kind != InputKind::kTorchSave) return kind;
  try {
    struct stat st;
    const int fd = OpenRegularFile(path, &st, ErrorCode::kBadInput);
    bool refused = false;
    std::unique_ptr<Mapping> map;
    try {
      map = Mapping::Create(fd, st, MapMode::kShared, Prefetch::kNone, path, &refused);
    } catch (...) {
      close(fd);
      throw;
    }
    close(fd);
    if (!refused && IsTorchScript(zip::Reader(map->data(), map->size(), path)))
      return InputKind::kTorchScript;
  } catch (const Error&) {
    // A damaged or foreign zip: the torch.save importer names what is wrong.
  }
  return InputKind::kTorchSave;
}

}  // namespace tsar::importer
