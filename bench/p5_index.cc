// P5: opening an archive of 100,000 tensors (header + index validated, lookup
// ready) against reading the same index from a safetensors-style JSON header
// with nlohmann-json (parse, validate each entry, build a name lookup).
#include <fcntl.h>
#include <unistd.h>

#include <nlohmann/json.hpp>
#include <unordered_map>

#include "bench/benchmarks.h"
#include "bench/models.h"
#include "tsar/archive.h"

namespace tsar::bench {
namespace {

struct JsonTensor {
  int dtype_size;
  std::vector<int64_t> shape;
  uint64_t begin, end;
};
struct JsonIndex {
  uint64_t header_size = 0;
  std::vector<JsonTensor> tensors;
  std::unordered_map<std::string, size_t> by_name;
};

// What a safetensors reader does before it hands out any tensor: the u64
// header size, the JSON header, every entry checked against the file. The
// JSON document is a temporary (freed here, as a reader frees it); the index
// it returns is the reader's equivalent of an open Archive.
JsonIndex ReadSafetensorsIndex(const std::string& path) {
  static const std::unordered_map<std::string, int> kDtypes = {{"F32", 4}, {"F16", 2}, {"BF16", 2},
                                                               {"F64", 8}, {"I64", 8}, {"I32", 4},
                                                               {"I8", 1},  {"U8", 1},  {"BOOL", 1}};
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) Die("cannot open " + path);
  const uint64_t file_size = FileSize(path);
  unsigned char le[8];
  if (pread(fd, le, 8, 0) != 8) Die("cannot read " + path);
  uint64_t n = 0;
  for (int b = 7; b >= 0; --b) n = (n << 8) | le[b];
  if (n > file_size - 8) Die(path + ": header size out of bounds");
  std::string text(static_cast<size_t>(n), '\0');
  if (pread(fd, text.data(), text.size(), 8) != static_cast<ssize_t>(n)) Die("cannot read " + path);
  close(fd);
  const uint64_t data_size = file_size - 8 - n;

  const nlohmann::json header = nlohmann::json::parse(text);
  JsonIndex index;
  index.header_size = n;
  auto& tensors = index.tensors;
  auto& by_name = index.by_name;
  tensors.reserve(header.size());
  by_name.reserve(header.size());
  for (const auto& [name, v] : header.items()) {
    if (name == "__metadata__") continue;
    const auto dt = kDtypes.find(v.at("dtype").get_ref<const std::string&>());
    if (dt == kDtypes.end()) Die(name + ": unknown dtype");
    JsonTensor t{dt->second, v.at("shape").get<std::vector<int64_t>>(),
                 v.at("data_offsets").at(0).get<uint64_t>(),
                 v.at("data_offsets").at(1).get<uint64_t>()};
    uint64_t bytes = static_cast<uint64_t>(t.dtype_size);
    for (int64_t d : t.shape) {
      if (d < 0 || __builtin_mul_overflow(bytes, static_cast<uint64_t>(d), &bytes))
        Die(name + ": bad shape");
    }
    if (t.begin > t.end || t.end > data_size || t.end - t.begin != bytes)
      Die(name + ": bad data_offsets");
    if (!by_name.emplace(name, tensors.size()).second) Die(name + ": duplicate");
    tensors.push_back(std::move(t));
  }
  return index;
}

}  // namespace

void RunP5Index(const Context& ctx) {
  const std::string kase = "100000 tensors";
  const std::string archive = ctx.Path("many.tsar");
  const std::string json = ctx.Path("many.safetensors");
  ctx.rec->Info("P5.tsar_tensors", std::to_string(Archive::open(archive).infos().size()));
  const JsonIndex check = ReadSafetensorsIndex(json);
  ctx.rec->Info("P5.json_tensors", std::to_string(check.tensors.size()));
  ctx.rec->Info("P5.json_header_bytes", std::to_string(check.header_size));
  ctx.rec->Info("P5.tsar_file_bytes", std::to_string(FileSize(archive)));
  for (int r = 0; r < ctx.Runs(21); ++r) {
    {
      Stopwatch sw;
      const Archive a = Archive::open(archive);
      ctx.rec->Add("P5", kase, "tsar Archive::open", "ms", r, sw.Ms());
    }
    Stopwatch sw;
    const JsonIndex index = ReadSafetensorsIndex(json);
    ctx.rec->Add("P5", kase, "JSON header (nlohmann-json)", "ms", r, sw.Ms());
  }
}

}  // namespace tsar::bench
