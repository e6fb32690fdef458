// Input reader for transformers' save_pretrained directories
// (writer/import_transformers.h): the weights through the safetensors
// importer, the other files attached under the rule of spec §4.7.1.
#include "writer/import_transformers.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <variant>
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
  enum class Type { kRegular, kDirectory, kOther, kLeaves, kUnreadable } type;
  uint64_t size = 0;
  std::string what;  // kOther: what it is; kLeaves, kUnreadable: why
};

// The names in directory `sub` below `top` ("" for `top` itself), sorted
// bytewise, with what they reach: symbolic links are followed as the Hugging
// Face cache's snapshots need, but only inside `top` (InputDir::Stat; with
// --follow-symlinks, everywhere). `sub` must be a directory Stat found inside.
std::vector<Listed> List(const InputDir& top, const std::string& sub) {
  const std::string shown = sub.empty() ? top.dir() : top.Path(sub);
  int fd = -1;
  DIR* d = nullptr;
  struct stat st;
  if (!sub.empty()) {
    // Opened as the walk found it: a directory swapped for a link to another
    // since then is not listed.
    const InputDir::Found f = top.Stat(sub);
    fd = open(shown.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0 && (fstat(fd, &st) != 0 || st.st_dev != f.st.st_dev || st.st_ino != f.st.st_ino ||
                    f.kind != InputDir::Found::Kind::kDirectory)) {
      close(fd);
      throw Error(ErrorCode::kBadInput, shown, std::nullopt,
                  "changed while being read (another directory took its name)");
    }
  } else {
    fd = open(shown.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  }
  if (fd >= 0) d = fdopendir(fd);
  if (d == nullptr) {
    const int err = errno;
    if (fd >= 0) close(fd);
    throw Error(err == ENOENT ? ErrorCode::kNotFound : ErrorCode::kIo, shown, std::nullopt,
                std::string("cannot read the directory: ") + std::strerror(err));
  }
  std::vector<Listed> out;
  while (const dirent* e = readdir(d)) {
    Listed l;
    l.name = e->d_name;
    if (l.name == "." || l.name == "..") continue;
    try {
      const InputDir::Found f = top.Stat(sub.empty() ? l.name : sub + "/" + l.name);
      switch (f.kind) {
        case InputDir::Found::Kind::kRegular:
          l.type = Listed::Type::kRegular;
          l.size = static_cast<uint64_t>(f.st.st_size);
          break;
        case InputDir::Found::Kind::kDirectory:
          l.type = Listed::Type::kDirectory;
          break;
        case InputDir::Found::Kind::kOther:
          l.type = Listed::Type::kOther;
          l.what = f.Describe();
          break;
        case InputDir::Found::Kind::kAbsent:  // gone since readdir, or a dangling link
          l.type = Listed::Type::kUnreadable;
          l.what = f.Describe();
          break;
      }
    } catch (const Error& err) {
      // A link that leaves (or a loop of links): kBadInput; stat failing: kIo.
      l.type =
          err.code() == ErrorCode::kBadInput ? Listed::Type::kLeaves : Listed::Type::kUnreadable;
      l.what = err.what();
    }
    out.push_back(std::move(l));
  }
  closedir(d);
  std::sort(out.begin(), out.end(),
            [](const Listed& a, const Listed& b) { return a.name < b.name; });
  return out;
}

// The whole of the regular file open at `fd` (named `path` in messages),
// which must still have `size` bytes; closes `fd`. The one copy of its bytes
// `tsar pack` makes: it is moved, never copied, into the archive's head.
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

// What the attached files of one directory have taken so far.
struct Attaching {
  const InputDir& top;
  uint64_t total = 0;  // bytes, at most kMaxAttachedTotal
  Imported* out;
};

// Reads `name` (open at `fd`, `st` its fstat) as attached file "file:<name>"
// of `a.out`, within kMaxAttachedTotal.
void Attach(Attaching& a, const std::string& name, int fd, const struct stat& st) {
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  if (size > kMaxAttachedTotal - a.total) {
    close(fd);
    throw Error(ErrorCode::kBadInput, a.top.Path(name), std::nullopt,
                "size: " + std::to_string(size) + " bytes would bring the files attached to " +
                    std::to_string(a.total + size) + " bytes, over the " +
                    std::to_string(kMaxAttachedTotal) +
                    " (256 MiB) tsar pack attaches from one directory in all; move the files "
                    "the model does not need out of it, or pack its weights file alone");
  }
  a.total += size;
  a.out->metadata.push_back({"", std::string(format::kAttachedFilePrefix) + name,
                             Bytes{ReadWhole(fd, st, a.top.Path(name), size)}});
}

// Attaches `l` (named `name` in the archive and below `top`) or records why
// not.
void Consider(Attaching& a, const Listed& l, const std::string& name) {
  std::vector<std::string>& skipped = a.out->skipped;
  switch (l.type) {
    case Listed::Type::kUnreadable:
      skipped.push_back(Quote(name) + ": not attached: " + l.what);
      return;
    case Listed::Type::kLeaves:
      skipped.push_back(Quote(name) +
                        ": not attached: a symbolic link that leaves the directory (" + l.what +
                        ")");
      return;
    case Listed::Type::kOther:
      skipped.push_back(Quote(name) + ": not attached: not a regular file (" + l.what + ")");
      return;
    default:
      break;
  }
  const std::string why = AttachRefusal(l.name, l.size);
  if (!why.empty()) {
    skipped.push_back(Quote(name) + ": not attached: " + why);
    return;
  }
  // Opened below the directory, component by component (safe_open.h): a
  // symbolic link that leaves it is never read (unless --follow-symlinks).
  struct stat st;
  int fd = -1;
  try {
    fd = a.top.OpenFile(name, &st);
  } catch (const Error& e) {
    if (e.code() != ErrorCode::kBadInput) throw;
    skipped.push_back(Quote(name) +
                      ": not attached: a symbolic link that leaves the "
                      "directory, or not a regular file (" +
                      e.what() + ")");
    return;
  }
  if (static_cast<uint64_t>(st.st_size) != l.size) {
    close(fd);
    throw Error(ErrorCode::kBadInput, a.top.Path(name), std::nullopt,
                "size: expected " + std::to_string(l.size) + " bytes (as listed), found " +
                    std::to_string(st.st_size) + ": the file changed while it was packed");
  }
  Attach(a, name, fd, st);
}

// config.json, which tsar.transformers.load_model builds the model from:
// attached, or kBadInput naming it and saying why not.
void AttachConfig(Attaching& a) {
  const std::string name = "config.json";
  const std::string path = a.top.Path(name);
  const auto refuse = [&](const std::string& found) {
    return Error(ErrorCode::kBadInput, path, std::nullopt,
                 "expected the model's configuration (tsar.transformers.load_model builds the "
                 "model from it): a regular file inside the directory of at most " +
                     std::to_string(kMaxAttachedFileSize) + " bytes holding a JSON object, found " +
                     found);
  };
  InputDir::Found f;
  try {
    f = a.top.Stat(name);
  } catch (const Error& e) {
    if (e.code() != ErrorCode::kBadInput) throw;
    throw refuse("a symbolic link that leaves it (" + std::string(e.what()) + ")");
  }
  if (f.kind != InputDir::Found::Kind::kRegular) throw refuse(f.Describe());
  struct stat st;
  const int fd = a.top.OpenFile(name, &st);
  if (static_cast<uint64_t>(st.st_size) > kMaxAttachedFileSize) {
    close(fd);
    throw refuse(std::to_string(st.st_size) + " bytes");
  }
  Attach(a, name, fd, st);
  const auto& text = std::get<Bytes>(a.out->metadata.back().value).data;
  if (const std::string why = ConfigRefusal(text); !why.empty()) throw refuse(why);
}

// Checks a JSON text as Python's json.loads would take it, without building a
// tree: records the root's type and refuses nesting past kMaxConfigDepth
// (nlohmann's parser is not recursive, so a deep text costs nothing first).
class ConfigSax : public nlohmann::json_sax<nlohmann::json> {
 public:
  using json = nlohmann::json;
  std::string error;      // "" while the text is fine
  const char* root = "";  // "an object", "an array", "a string", ...

  bool null() override { return Value("null"); }
  bool boolean(bool) override { return Value("a boolean"); }
  bool number_integer(json::number_integer_t) override { return Value("a number"); }
  bool number_unsigned(json::number_unsigned_t) override { return Value("a number"); }
  bool number_float(json::number_float_t, const json::string_t&) override {
    return Value("a number");
  }
  bool string(json::string_t&) override { return Value("a string"); }
  bool binary(json::binary_t&) override { return Value("binary"); }
  bool start_object(std::size_t) override { return Open("an object"); }
  bool key(json::string_t&) override { return true; }
  bool end_object() override { return --depth_, true; }
  bool start_array(std::size_t) override { return Open("an array"); }
  bool end_array() override { return --depth_, true; }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) override {
    error = std::string("text that is not JSON (") + e.what() + ")";
    return false;
  }

 private:
  bool Value(const char* what) {
    if (!*root) root = what;
    return true;
  }
  bool Open(const char* what) {
    Value(what);
    if (++depth_ <= kMaxConfigDepth) return true;
    error = "JSON nested deeper than " + std::to_string(kMaxConfigDepth) + " levels";
    return false;
  }
  int depth_ = 0;
};

}  // namespace

std::string ConfigRefusal(std::string_view text) {
  if (text.size() >= 3 && text.compare(0, 3, "\xEF\xBB\xBF") == 0)
    return "a UTF-8 byte order mark before the JSON (Python's json.loads refuses one)";
  if (const size_t nul = text.find('\0'); nul != std::string_view::npos)
    return "a NUL byte at offset " + std::to_string(nul) + " (not JSON)";
  if (!format::IsValidUtf8(text)) return "bytes that are not UTF-8 (JSON text is)";
  ConfigSax sax;
  const bool ok = nlohmann::json::sax_parse(text, &sax);
  if (!sax.error.empty()) return sax.error;
  if (!ok) return "text that is not JSON";
  if (std::string_view(sax.root) != "an object") return std::string(sax.root) + ", not an object";
  return "";
}

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
            std::string(lstat((dir + "/config.json").c_str(), &st) == 0 ? "no safetensors weights"
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
  Attaching attaching{top, 0, &out};
  AttachConfig(attaching);
  for (const Listed& l : List(top, "")) {
    if (l.name == weights || (sharded && IsShardName(l.name))) continue;
    if (l.name == "config.json") continue;              // attached first
    if (!l.name.empty() && l.name[0] == '.') continue;  // .git, .cache (huggingface_hub)
    if (l.type == Listed::Type::kDirectory) {
      if (l.name != kChatTemplatesDir) {
        out.skipped.push_back(Quote(l.name + "/") +
                              ": not read (attached are the files at the top of the "
                              "directory and in additional_chat_templates/)");
        continue;
      }
      for (const Listed& t : List(top, l.name)) {
        if (!t.name.empty() && t.name[0] == '.') continue;
        if (t.type == Listed::Type::kDirectory) {
          out.skipped.push_back(Quote(l.name + "/" + t.name + "/") + ": not read");
          continue;
        }
        Consider(attaching, t, l.name + "/" + t.name);
      }
      continue;
    }
    if (l.type == Listed::Type::kLeaves && l.name == kChatTemplatesDir) {
      // Never listed: the names of what it leads to are not the directory's.
      out.skipped.push_back(Quote(l.name + "/") +
                            ": not read: a symbolic link that leaves the directory (" + l.what +
                            ")");
      continue;
    }
    Consider(attaching, l, l.name);
  }
  return out;
}

}  // namespace tsar::importer
