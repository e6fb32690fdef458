// P5: opening an archive of 100,000 tensors (header + index validated, lookup
// ready) against reading the same index from a safetensors-style JSON header
// with nlohmann-json (parse, validate each entry, build a name lookup); and
// open + every tensor (Archive::state_dict) against that header + mmap + a
// from_blob view per tensor into the same torch::OrderedDict, which is what
// the safetensors library does for `{k: f.get_tensor(k) for k in f.keys()}`.
#include <ATen/ops/from_blob.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <unordered_map>

#include "bench/benchmarks.h"
#include "bench/models.h"
#include "tsar/archive.h"

namespace tsar::bench {
namespace {

struct JsonTensor {
  int dtype_size;
  c10::ScalarType type;
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
  static const std::unordered_map<std::string, std::pair<int, c10::ScalarType>> kDtypes = {
      {"F32", {4, at::kFloat}},  {"F16", {2, at::kHalf}}, {"BF16", {2, at::kBFloat16}},
      {"F64", {8, at::kDouble}}, {"I64", {8, at::kLong}}, {"I32", {4, at::kInt}},
      {"I8", {1, at::kChar}},    {"U8", {1, at::kByte}},  {"BOOL", {1, at::kBool}}};
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
    JsonTensor t{dt->second.first, dt->second.second, v.at("shape").get<std::vector<int64_t>>(),
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

// The header read as above, the file mapped, and a view per tensor: the
// safetensors library's open + get_tensor of every name. The mapping is
// unmapped when the last view goes (each view's deleter holds it).
torch::OrderedDict<std::string, at::Tensor> SafetensorsViews(const std::string& path) {
  const JsonIndex index = ReadSafetensorsIndex(path);
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  const size_t size = FileSize(path);
  void* base = mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
  close(fd);
  if (base == MAP_FAILED) Die("cannot map " + path);
  auto mapping = std::shared_ptr<void>(base, [size](void* p) { munmap(p, size); });
  const char* data = static_cast<const char*>(base) + 8 + index.header_size;
  std::vector<std::pair<const std::string*, size_t>> order;  // file order, as keys() gives
  order.reserve(index.by_name.size());
  for (const auto& [name, i] : index.by_name) order.emplace_back(&name, i);
  std::sort(order.begin(), order.end(), [&](const auto& a, const auto& b) {
    return index.tensors[a.second].begin < index.tensors[b.second].begin;
  });
  torch::OrderedDict<std::string, at::Tensor> out;
  out.reserve(order.size());
  for (const auto& [name, i] : order) {
    const JsonTensor& t = index.tensors[i];
    out.insert(*name, at::from_blob(
                          const_cast<char*>(data + t.begin), t.shape, [mapping](void*) {},
                          at::TensorOptions().dtype(t.type)));
  }
  return out;
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
  const std::string every = "100000 tensors, open + every tensor";
  size_t made = 0;
  for (int r = 0; r < ctx.Runs(11); ++r) {
    {
      Stopwatch sw;
      const auto tensors = Archive::open(archive).state_dict();
      ctx.rec->Add("P5", every, "tsar Archive::open + state_dict()", "ms", r, sw.Ms());
      made = tensors.size();
    }
    Stopwatch sw;
    const auto views = SafetensorsViews(json);
    ctx.rec->Add("P5", every, "JSON header + from_blob views", "ms", r, sw.Ms());
    if (views.size() != made)
      Die("P5: " + std::to_string(views.size()) + " views, " + std::to_string(made) + " tensors");
  }
}

}  // namespace tsar::bench
