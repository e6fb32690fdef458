// Input reader for the directory that TensorDict's memmap() writes
// (tensordict on PyPI): a meta.json per level, naming each key's dtype and
// shape, and one raw, contiguous KEY.memmap file per tensor beside it; nested
// TensorDicts are sub-directories with their own meta.json. Tensors become
// one entry whose names join the nested keys with '.', as a state_dict does.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "format/reader.h"
#include "tsar/dtype.h"
#include "tsar/error.h"
#include "writer/importer.h"
#include "writer/safe_open.h"
#include "writer/strict_json.h"

namespace tsar::importer {
namespace {

using Json = nlohmann::json;
using format::Quote;

// A meta.json is small (a few hundred bytes a key); this bounds the read.
constexpr uint64_t kMaxMetaSize = 256ull << 20;
// TensorDict nests a sub-directory per nested TensorDict; deeper than this is
// not a model.
constexpr int kMaxNesting = 32;
// Tensor files smaller than this are read into memory, larger ones mapped: a
// mixture-of-experts checkpoint of 100,000 small tensors must not need
// 100,000 mappings (Linux allows 65,530 by default).
constexpr uint64_t kMapThreshold = 64 << 10;
// The memmap layout versions this reader knows (meta.json "_format_version";
// absent in the oldest ones).
constexpr int64_t kMaxFormatVersion = 1;

[[noreturn]] void Fail(const std::string& path, const std::string& message) {
  throw Error(ErrorCode::kBadInput, path, std::nullopt, message);
}

// TensorDict's file name for a key (tensordict/_utils_key_json.py,
// _encode_key_for_filesystem): characters that are unsafe in a path become
// %XX; "" is "%", "." and ".." are "%2E" repeated.
std::string EncodeKey(const std::string& key) {
  if (key.empty()) return "%";
  if (key == "." || key == "..") return key == "." ? "%2E" : "%2E%2E";
  static const std::string kUnsafe = "/<>:\"|?*\\ %";
  std::string out;
  for (const char c : key) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 32 || u == 127 || kUnsafe.find(c) != std::string::npos) {
      static const char kHex[] = "0123456789ABCDEF";
      out += '%';
      out += kHex[u >> 4];
      out += kHex[u & 15];
    } else {
      out += c;
    }
  }
  return out;
}

// `rel` below a level's directory `dir` (relative to the input directory).
std::string Below(const std::string& dir, const std::string& rel) {
  return dir.empty() ? rel : dir + "/" + rel;
}

// What TensorDict wrote for a key: where (relative to the input directory)
// and what is there.
struct ChildFile {
  std::string rel;
  InputDir::Found found;
  bool Is(bool directory) const {
    return found.kind ==
           (directory ? InputDir::Found::Kind::kDirectory : InputDir::Found::Kind::kRegular);
  }
};

// The file or directory TensorDict wrote for `key` in level `dir`: the
// encoded name, or the raw key as TensorDict before 0.11 wrote it (only a
// key that stays inside `dir`). The first of them of the kind wanted; else
// the first that exists, of another kind; else the encoded name, absent.
ChildFile Child(const InputDir& root, const std::string& dir, const std::string& key,
                const std::string& suffix, bool directory) {
  ChildFile encoded{Below(dir, EncodeKey(key) + suffix), {}};
  encoded.found = root.Stat(encoded.rel);
  if (encoded.Is(directory)) return encoded;
  const bool legacy_safe = !key.empty() && key != "." && key != ".." &&
                           key.find('/') == std::string::npos &&
                           key.find('\0') == std::string::npos && EncodeKey(key) != key;
  if (legacy_safe) {
    ChildFile legacy{Below(dir, key + suffix), {}};
    legacy.found = root.Stat(legacy.rel);
    if (legacy.Is(directory)) return legacy;
    if (encoded.found.kind == InputDir::Found::Kind::kAbsent &&
        legacy.found.kind != InputDir::Found::Kind::kAbsent) {
      return legacy;
    }
  }
  return encoded;
}

struct Reader {
  const ImportOptions& options;
  const InputDir& root;
  Imported out;
  Imported::Entry entry;

  // The bytes of a tensor file: mapped when large, read when small.
  std::shared_ptr<const writer::Storage> Bytes(const std::string& rel, uint64_t nbytes) {
    const std::string file = root.Path(rel);
    struct stat st;
    const int fd = root.OpenFile(rel, &st);
    const auto size = static_cast<uint64_t>(st.st_size);
    if (nbytes >= kMapThreshold) {
      const auto input = MappedInput::Open(fd, size, file);  // closes fd
      if (input->size() < nbytes) Short(file, nbytes, input->size());
      if (input->size() > nbytes) Longer(file, nbytes, input->size());
      return MappedInput::Storage(input, 0, nbytes);
    }
    if (size < nbytes) {
      close(fd);
      Short(file, nbytes, size);
    }
    if (size > nbytes) Longer(file, nbytes, size);
    std::vector<uint8_t> bytes(nbytes);
    uint64_t done = 0;
    while (done < nbytes) {
      const ssize_t n = pread(fd, bytes.data() + done, nbytes - done, static_cast<off_t>(done));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        const int err = errno;
        close(fd);
        if (n == 0) {
          throw Error(ErrorCode::kBadInput, file, done,
                      "changed while being read: it ended after " + std::to_string(done) +
                          " of the " + std::to_string(nbytes) + " bytes it had when opened");
        }
        throw Error(ErrorCode::kIo, file, done, std::string("cannot read: ") + std::strerror(err));
      }
      done += static_cast<uint64_t>(n);
    }
    close(fd);
    return writer::Storage::Owning(std::move(bytes));
  }

  [[noreturn]] void Short(const std::string& file, uint64_t want, uint64_t found) {
    Fail(file, "expected at least " + std::to_string(want) +
                   " bytes (the shape and dtype meta.json gives), found " + std::to_string(found));
  }
  // TensorDict reads the first bytes of a longer file (memmap_like can grow
  // one); so does this reader, and says so.
  void Longer(const std::string& file, uint64_t want, uint64_t found) {
    out.skipped.push_back(file + ": " + std::to_string(found - want) +
                          " bytes after the tensor's " + std::to_string(want) + " are not used");
  }

  void Tensor(const std::string& dir, const std::string& meta_path, const std::string& key,
              const std::string& name, const Json& info) {
    const std::string where = "key " + Quote(name) + ": ";
    if (info.contains("is_nested") && info["is_nested"].is_boolean() &&
        info["is_nested"].get<bool>()) {
      throw Error(ErrorCode::kUnsupported, meta_path, std::nullopt,
                  where +
                      "a nested (jagged) tensor has no fixed shape; a tsar archive holds strided "
                      "tensors (convert it with .to_padded_tensor() first)");
    }
    const Json& dtype_json = info["dtype"];
    if (!dtype_json.is_string()) {
      Fail(meta_path, where + "dtype: expected a string such as \"torch.float32\", found " +
                          Describe(dtype_json));
    }
    const std::string& dtype_name = dtype_json.get_ref<const std::string&>();
    const std::optional<DType> dtype = DTypeFromName(dtype_name);
    if (!dtype) {
      Fail(meta_path, where + "dtype: expected a torch dtype tsar stores (spec §5.1), found " +
                          Quote(dtype_name));
    }
    const Json& shape_json = info["shape"];
    if (!shape_json.is_array()) {
      Fail(meta_path, where + "shape: expected an array of sizes, found " + Describe(shape_json));
    }
    std::vector<int64_t> sizes;
    uint64_t numel = 1;
    bool overflow = false;
    for (size_t i = 0; i < shape_json.size(); ++i) {
      const std::optional<uint64_t> d = AsU64(shape_json[i]);
      if (!d || *d > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        Fail(meta_path, where + "shape[" + std::to_string(i) +
                            "]: expected a non-negative integer, found " +
                            Describe(shape_json[i]));
      }
      sizes.push_back(static_cast<int64_t>(*d));
      overflow = overflow || !format::CheckedMul(numel, *d, &numel);
    }
    uint64_t nbytes = 0;
    const bool empty = std::find(sizes.begin(), sizes.end(), 0) != sizes.end();
    if (empty) {
      numel = 0;
    } else if (overflow || !format::CheckedMul(numel, ElementSize(*dtype), &nbytes)) {
      Fail(meta_path, where + "shape: expected at most 2^64 - 1 bytes, found more");
    }
    // Contiguous strides, as TensorDict's MemoryMappedTensor has them.
    std::vector<int64_t> strides(sizes.size(), 1);
    uint64_t stride = 1;
    for (size_t i = sizes.size(); i-- > 0;) {
      strides[i] = static_cast<int64_t>(stride);
      if (!format::CheckedMul(stride, std::max<uint64_t>(sizes[i], 1), &stride) ||
          stride > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        Fail(meta_path, where + "shape: expected strides that fit in 64 bits");
      }
    }
    const ChildFile file = Child(root, dir, key, ".memmap", false);
    std::shared_ptr<const writer::Storage> storage;
    if (file.found.kind == InputDir::Found::Kind::kAbsent && nbytes == 0) {
      // torch.from_file makes no file for a tensor without elements.
      storage = writer::Storage::Owning({});
    } else if (!file.Is(false)) {
      Fail(meta_path, where + "expected its bytes in a regular file " + Quote(root.Path(file.rel)) +
                          ", found " + file.found.Describe());
    } else {
      storage = Bytes(file.rel, nbytes);
    }
    entry.tensors.push_back(
        {name, MakeView(storage, *dtype, sizes, strides, 0, "tensor " + Quote(name), meta_path)});
  }

  // A NonTensorData leaf: its value, when metadata can hold it.
  void NonTensor(const std::string& meta_path, const std::string& name, const Json& meta) {
    const Json& data = meta.contains("data") ? meta["data"] : Json();
    if (data.is_string()) {
      out.metadata.push_back({entry.name, name, data.get<std::string>()});
    } else if (data.is_number_integer() &&
               (!data.is_number_unsigned() ||
                data.get<uint64_t>() <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))) {
      out.metadata.push_back({entry.name, name, data.get<int64_t>()});
    } else if (data.is_number_float()) {
      out.metadata.push_back({entry.name, name, data.get<double>()});
    } else if (options.strict) {
      Fail(meta_path, "key " + Quote(name) + ": non-tensor data " + Describe(data) +
                          " is not a string or a number, which archive metadata holds "
                          "(--strict refuses to skip it)");
    } else {
      out.skipped.push_back("non-tensor data " + Quote(name) + " (" + Describe(data) +
                            "): not a string or a number; left out");
    }
  }

  // One level: `dir`/meta.json (`dir` relative to the input directory, "" for
  // the top), its tensors and its nested levels, in order.
  void Level(const std::string& dir, const std::string& prefix, int depth) {
    const std::string meta_rel = Below(dir, "meta.json");
    const std::string meta_path = root.Path(meta_rel);
    if (depth > kMaxNesting) {
      Fail(meta_path, "expected TensorDicts nested at most " + std::to_string(kMaxNesting) +
                          " levels deep, found deeper nesting");
    }
    const Json meta = ReadMeta(meta_rel);
    if (meta.contains("_is_non_tensor") && meta["_is_non_tensor"].is_boolean() &&
        meta["_is_non_tensor"].get<bool>()) {
      order_.pop_back();
      if (prefix.empty()) {
        Fail(meta_path, "expected a TensorDict of tensors, found a single NonTensorData");
      }
      NonTensor(meta_path, prefix.substr(0, prefix.size() - 1), meta);
      return;
    }
    if (meta.contains("_format_version")) {
      const std::optional<uint64_t> v = AsU64(meta["_format_version"]);
      if (!v || *v > static_cast<uint64_t>(kMaxFormatVersion)) {
        throw Error(ErrorCode::kUnsupported, meta_path, std::nullopt,
                    "_format_version: expected a TensorDict memmap layout of version 0 to " +
                        std::to_string(kMaxFormatVersion) + ", found " +
                        Describe(meta["_format_version"]));
      }
    }
    for (const std::string& key : order_.back().root) {
      const Json& info = meta[key];
      if (!info.is_object()) continue;  // the level's own fields: shape, device, _type...
      const std::string name = prefix + key;
      if (info.contains("type")) {  // a nested TensorDict, tensorclass or NonTensorData
        const ChildFile sub = Child(root, dir, key, "", true);
        if (!sub.Is(true)) {
          Fail(meta_path, "key " + Quote(name) + ": expected its directory " +
                              Quote(root.Path(sub.rel)) + ", found " + sub.found.Describe());
        }
        Level(sub.rel, name + ".", depth + 1);
        continue;
      }
      if (!info.contains("dtype") || !info.contains("shape")) {
        Fail(meta_path, "key " + Quote(name) +
                            ": expected a tensor (dtype and shape) or a nested level (type), "
                            "found " +
                            Describe(info));
      }
      Tensor(dir, meta_path, key, name, info);
    }
    order_.pop_back();
  }

  Json ReadMeta(const std::string& meta_rel) {
    const std::string meta_path = root.Path(meta_rel);
    struct stat st;
    const int fd = root.OpenFile(meta_rel, &st);
    const auto size = static_cast<uint64_t>(st.st_size);
    if (size > kMaxMetaSize) {
      close(fd);
      Fail(meta_path, "expected at most " + std::to_string(kMaxMetaSize) + " bytes, found " +
                          std::to_string(size));
    }
    std::string text(size, '\0');
    uint64_t done = 0;
    while (done < size) {
      const ssize_t n = pread(fd, text.data() + done, size - done, static_cast<off_t>(done));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      done += static_cast<uint64_t>(n);
    }
    close(fd);
    text.resize(done);
    order_.emplace_back();
    Json meta = ParseStrictJson(text, meta_path, 0, "meta.json", "key", &order_.back());
    if (!meta.is_object()) {
      Fail(meta_path, "expected a JSON object (TensorDict's meta.json), found " + Describe(meta));
    }
    return meta;
  }

  std::vector<KeyOrder> order_;  // one per open level
};

}  // namespace

Imported ImportTensorDict(const std::string& path, const ImportOptions& options) {
  std::string dir = path;
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  struct stat st;
  if (const size_t slash = dir.rfind('/');
      stat(dir.c_str(), &st) == 0 && !S_ISDIR(st.st_mode) &&
      dir.substr(slash == std::string::npos ? 0 : slash + 1) == "meta.json") {
    dir = slash == std::string::npos ? "." : dir.substr(0, std::max<size_t>(slash, 1));
  }
  // Every file below `dir` is opened through it: no symbolic link leaves it.
  const InputDir root(dir, path, options.follow_symlinks);
  if (const InputDir::Found meta = root.Stat("meta.json");
      meta.kind == InputDir::Found::Kind::kAbsent) {
    Fail(path, "expected a directory written by TensorDict's memmap() (with a meta.json), found " +
                   (meta.link.empty() ? std::string("no meta.json in it")
                                      : "meta.json " + meta.Describe()));
  }
  Reader r{options, root, {}, {}, {}};
  r.out.kind = InputKind::kTensorDict;
  r.entry.name = options.default_entry;
  r.Level("", "", 0);
  r.out.entries.push_back(std::move(r.entry));
  return std::move(r.out);
}

}  // namespace tsar::importer
