// Input reader for transformers' save_pretrained directories
// (writer/import_transformers.h): the weights through the safetensors
// importer, the other files attached under the rule of spec §4.7.1.
#include "writer/import_transformers.h"

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

#include "format/attached_file.h"
#include "format/reader.h"
#include "loader/open_file.h"
#include "tsar/error.h"
#include "writer/detect.h"
#include "writer/safe_open.h"

namespace tsar::importer {
namespace {

using format::Quote;

// transformers (≥ 4.5x) writes chat templates beyond the default one here.
constexpr const char* kChatTemplatesDir = "additional_chat_templates";
constexpr const char* kAttachedSuffixes[] = {".json", ".txt", ".model", ".jinja", ".tiktoken"};
constexpr const char* kWeightSuffixes[] = {".safetensors", ".bin",     ".pt",   ".pth",  ".ckpt",
                                           ".h5",          ".msgpack", ".gguf", ".onnx", ".pkl"};

bool EndsWith(const std::string& s, const char* suffix) {
  const size_t n = std::strlen(suffix);
  return s.size() >= n && s.compare(s.size() - n, n, suffix) == 0;
}

// transformers' shard names, "model-00001-of-00004.safetensors": the files
// the index names, packed as the weights, so they get no note.
bool IsShardName(const std::string& name) {
  if (name.rfind("model-", 0) != 0 || !EndsWith(name, ".safetensors")) return false;
  const std::string mid = name.substr(6, name.size() - 6 - 12);  // "00001-of-00004"
  const size_t of = mid.find("-of-");
  if (of == std::string::npos || of == 0 || of + 4 == mid.size()) return false;
  const std::string digits = mid.substr(0, of) + mid.substr(of + 4);
  return std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; });
}

struct Listed {
  std::string name;
  enum class Type { kRegular, kDirectory, kOther, kUnreadable } type;
  uint64_t size = 0;
  std::string error;  // kUnreadable: stat's error text
};

// The names in `dir`, sorted bytewise, with what stat (following symbolic
// links, as the Hugging Face cache's snapshots need) says they are.
std::vector<Listed> List(const std::string& dir) {
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) {
    throw Error(errno == ENOENT ? ErrorCode::kNotFound : ErrorCode::kIo, dir, std::nullopt,
                std::string("cannot read the directory: ") + std::strerror(errno));
  }
  std::vector<Listed> out;
  while (const dirent* e = readdir(d)) {
    Listed l;
    l.name = e->d_name;
    if (l.name == "." || l.name == "..") continue;
    struct stat st;
    if (stat((dir + "/" + l.name).c_str(), &st) != 0) {
      l.type = Listed::Type::kUnreadable;
      l.error = std::strerror(errno);
    } else if (S_ISREG(st.st_mode)) {
      l.type = Listed::Type::kRegular;
      l.size = static_cast<uint64_t>(st.st_size);
    } else {
      l.type = S_ISDIR(st.st_mode) ? Listed::Type::kDirectory : Listed::Type::kOther;
    }
    out.push_back(std::move(l));
  }
  closedir(d);
  std::sort(out.begin(), out.end(),
            [](const Listed& a, const Listed& b) { return a.name < b.name; });
  return out;
}

// The whole of the regular file open at `fd` (named `path` in messages),
// which must still have `size` bytes; closes `fd`.
std::string ReadWhole(int fd, const struct stat& st, const std::string& path, uint64_t size) {
  if (static_cast<uint64_t>(st.st_size) != size) {
    close(fd);
    throw Error(ErrorCode::kBadInput, path, std::nullopt,
                "size: expected " + std::to_string(size) + " bytes (as listed), found " +
                    std::to_string(st.st_size) + ": the file changed while it was packed");
  }
  std::string bytes(static_cast<size_t>(size), '\0');
  uint64_t done = 0;
  while (done < size) {
    const ssize_t n = pread(fd, bytes.data() + done, size - done, static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = errno;
      close(fd);
      throw Error(n < 0 ? ErrorCode::kIo : ErrorCode::kBadInput, path, std::nullopt,
                  n < 0 ? std::string("cannot read: ") + std::strerror(err)
                        : "size: expected " + std::to_string(size) + " bytes, found " +
                              std::to_string(done) + ": the file shrank while it was packed");
    }
    done += static_cast<uint64_t>(n);
  }
  close(fd);
  return bytes;
}

// Attaches `l` (named `name` in the archive and below `top`) or records why
// not.
void Consider(const InputDir& top, const Listed& l, const std::string& name, Imported* out) {
  if (l.type == Listed::Type::kUnreadable) {
    out->skipped.push_back(Quote(name) + ": not attached: cannot stat: " + l.error);
    return;
  }
  if (l.type == Listed::Type::kOther) {
    out->skipped.push_back(Quote(name) + ": not attached: not a regular file");
    return;
  }
  const std::string why = AttachRefusal(l.name, l.size);
  if (!why.empty()) {
    out->skipped.push_back(Quote(name) + ": not attached: " + why);
    return;
  }
  // Opened below the directory, component by component (safe_open.h): a
  // symbolic link that leaves it is never read (unless --follow-symlinks).
  struct stat st;
  int fd = -1;
  try {
    fd = top.OpenFile(name, &st);
  } catch (const Error& e) {
    if (e.code() != ErrorCode::kBadInput) throw;
    out->skipped.push_back(Quote(name) +
                           ": not attached: a symbolic link that leaves the "
                           "directory, or not a regular file (" +
                           e.what() + ")");
    return;
  }
  out->metadata.push_back({"", std::string(format::kAttachedFilePrefix) + name,
                           Bytes{ReadWhole(fd, st, top.Path(name), l.size)}});
}

}  // namespace

std::string AttachRefusal(const std::string& name, uint64_t size) {
  if (name.empty() || name[0] == '.') return "a hidden file";
  if (!format::IsValidUtf8(name) || !format::IsAttachedFileName(name))
    return "its name is not UTF-8 (an archive's keys are)";
  if (EndsWith(name, ".safetensors.index.json"))
    return "the index of safetensors weights (its tensors are the archive's, when it is the "
           "weights' index)";
  for (const char* s : kWeightSuffixes) {
    if (EndsWith(name, s))
      return "a weights file (the archive holds the weights of model.safetensors or its index)";
  }
  const bool listed = std::any_of(std::begin(kAttachedSuffixes), std::end(kAttachedSuffixes),
                                  [&](const char* s) { return EndsWith(name, s); });
  if (!listed) {
    return "not a configuration or tokenizer file (attached are the files named *.json, *.txt, "
           "*.model, *.jinja and *.tiktoken)";
  }
  if (size > kMaxAttachedFileSize) {
    return std::to_string(size) + " bytes, over the " + std::to_string(kMaxAttachedFileSize) +
           " an attached file may have";
  }
  return "";
}

Imported ImportTransformers(const std::string& path, const ImportOptions& options) {
  std::string dir = path;
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  struct stat st;
  if (stat(dir.c_str(), &st) == 0 && !S_ISDIR(st.st_mode)) dir = DirOf(dir);  // DIR/config.json
  const std::string weights = TransformersWeights(dir);
  if (weights.empty()) {
    throw Error(
        ErrorCode::kBadInput, path, std::nullopt,
        "expected a directory that transformers' save_pretrained wrote, with config.json "
        "and model.safetensors or model.safetensors.index.json, found " +
            std::string(stat((dir + "/config.json").c_str(), &st) == 0 ? "no safetensors weights"
                                                                       : "no config.json"));
  }
  const std::string weights_path = dir + "/" + weights;
  // Every file is opened below the directory (safe_open.h): the weights, the
  // index (whose shards ImportSafetensorsIndex opens the same way) and the
  // attached files; a symbolic link that leaves it is refused (the weights)
  // or not attached (a configuration or tokenizer file).
  const InputDir top(dir, path, options.follow_symlinks);
  Imported out;
  if (weights == "model.safetensors") {
    struct stat wst;
    const int fd = top.OpenFile(weights, &wst);
    out = ImportSafetensorsMapped(
        MappedInput::Open(fd, static_cast<uint64_t>(wst.st_size), weights_path), options);
  } else {
    top.Stat(weights);  // throws for a link out of the directory
    out = ImportSafetensorsIndex(weights_path, options);
  }
  out.kind = InputKind::kTransformers;
  // The prefix is the attached files' (§4.7.1): a safetensors __metadata__
  // key with it would pass for one, or clash with one.
  std::vector<Imported::Meta> kept;
  for (auto& m : out.metadata) {
    if (m.key.rfind(format::kAttachedFilePrefix.data(), 0, format::kAttachedFilePrefix.size()) ==
        0) {
      out.skipped.push_back(weights + ": __metadata__ " + Quote(m.key) +
                            ": keys starting with \"file:\" name attached files in an archive");
    } else {
      kept.push_back(std::move(m));
    }
  }
  out.metadata = std::move(kept);
  const bool sharded = weights != "model.safetensors";
  for (const Listed& l : List(dir)) {
    if (l.name == weights || (sharded && IsShardName(l.name))) continue;
    if (!l.name.empty() && l.name[0] == '.') continue;  // .git, .cache (huggingface_hub)
    if (l.type == Listed::Type::kDirectory) {
      if (l.name != kChatTemplatesDir) {
        out.skipped.push_back(Quote(l.name + "/") +
                              ": not read (attached are the files at the top of the "
                              "directory and in additional_chat_templates/)");
        continue;
      }
      const std::string sub = dir + "/" + l.name;
      for (const Listed& t : List(sub)) {
        if (!t.name.empty() && t.name[0] == '.') continue;
        if (t.type == Listed::Type::kDirectory) {
          out.skipped.push_back(Quote(l.name + "/" + t.name + "/") + ": not read");
          continue;
        }
        Consider(top, t, l.name + "/" + t.name, &out);
      }
      continue;
    }
    Consider(top, l, l.name, &out);
  }
  return out;
}

}  // namespace tsar::importer
