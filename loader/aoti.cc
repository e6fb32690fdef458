// tsar::load_aoti (include/tsar/aoti.h): an AOTInductor program stored in an
// archive (spec §4.7.2), its constants bound to the archive's tensors.
#include "tsar/aoti.h"

#include <ATen/ops/empty.h>
#include <c10/core/ScalarType.h>
#include <c10/util/StringUtil.h>
#include <sys/utsname.h>
#include <torch/version.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <tuple>
#include <unordered_map>

#include "tsar/error.h"
#include "writer/json_util.h"
#include "writer/zip_reader.h"

#if TSAR_HAVE_AOTI
#include <torch/csrc/inductor/aoti_package/model_package_loader.h>
#endif

namespace tsar {
namespace {

constexpr const char* kStampPrefix = "program:";
constexpr const char* kFormat = "tsar-program/1";
constexpr uint64_t kMemberLimit = uint64_t{1} << 30;

using Json = nlohmann::ordered_json;

[[noreturn]] void Fail(ErrorCode code, const std::string& where, const std::string& message) {
  throw Error(code, where, std::nullopt, message);
}

// torch.export's serialized ScalarType (torch/_export/serde/schema.py).
std::optional<c10::ScalarType> ExportDtype(int64_t code) {
  using S = c10::ScalarType;
  static const std::map<int64_t, S> table = {
      {1, S::Byte},          {2, S::Char},           {3, S::Short},         {4, S::Int},
      {5, S::Long},          {6, S::Half},           {7, S::Float},         {8, S::Double},
      {9, S::ComplexHalf},   {10, S::ComplexFloat},  {11, S::ComplexDouble}, {12, S::Bool},
      {13, S::BFloat16},     {28, S::UInt16},        {29, S::Float8_e4m3fn}, {30, S::Float8_e5m2},
      {31, S::Float8_e4m3fnuz}, {32, S::Float8_e5m2fnuz}, {34, S::UInt32},   {35, S::UInt64}};
  const auto it = table.find(code);
  if (it == table.end()) return std::nullopt;
  return it->second;
}

struct Payload {
  std::string fqn, path_name;
  c10::ScalarType dtype = c10::ScalarType::Undefined;
  std::vector<int64_t> shape, stride;
  int64_t offset = 0;
};

std::vector<int64_t> Ints(const Json& values, const std::string& where, const char* what) {
  std::vector<int64_t> out;
  if (!values.is_array()) Fail(ErrorCode::kBadInput, where, std::string(what) + ": expected a list");
  for (const auto& v : values) {
    const Json* n = v.is_object() && v.contains("as_int") ? &v["as_int"] : nullptr;
    if (n == nullptr || !n->is_number_integer() || n->get<int64_t>() < 0)
      Fail(ErrorCode::kBadInput, where, std::string(what) + ": expected concrete sizes");
    out.push_back(n->get<int64_t>());
  }
  return out;
}

// A payload config (data/weights/model_weights_config.json and the
// constants'): pickled entries are refused, as tsar never runs a pickle.
std::vector<Payload> Payloads(const std::string& text, const std::string& where) {
  const auto parsed = json::ParseOrdered(text);
  if (!parsed || !parsed->is_object() || !parsed->contains("config") ||
      !(*parsed)["config"].is_object())
    Fail(ErrorCode::kBadInput, where, "payload config: expected {\"config\": {...}}");
  std::vector<Payload> out;
  for (const auto& [fqn, meta] : (*parsed)["config"].items()) {
    const std::string w = where + ": '" + fqn + "'";
    if (!meta.is_object() || !meta.contains("path_name") || !meta["path_name"].is_string())
      Fail(ErrorCode::kBadInput, w, "payload entry without a path_name");
    if ((meta.contains("use_pickle") && meta["use_pickle"] == true) ||
        !meta.contains("tensor_meta") || !meta["tensor_meta"].is_object())
      Fail(ErrorCode::kUnsupported, w, "stored as a pickle: tsar binds plain tensors only");
    const Json& tm = meta["tensor_meta"];
    Payload p;
    p.fqn = fqn;
    p.path_name = meta["path_name"].get<std::string>();
    const auto dtype = tm.contains("dtype") && tm["dtype"].is_number_integer()
                           ? ExportDtype(tm["dtype"].get<int64_t>())
                           : std::nullopt;
    if (!dtype) Fail(ErrorCode::kBadInput, w, "dtype code unknown to tsar");
    p.dtype = *dtype;
    p.shape = Ints(tm.value("sizes", Json()), w, "sizes");
    p.stride = Ints(tm.value("strides", Json()), w, "strides");
    if (p.shape.size() != p.stride.size()) Fail(ErrorCode::kBadInput, w, "sizes and strides differ in length");
    p.offset = Ints(Json::array({tm.value("storage_offset", Json())}), w, "storage_offset")[0];
    out.push_back(std::move(p));
  }
  return out;
}

std::set<std::string> CpuFlags() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("flags", 0) != 0) continue;
    std::istringstream words(line.substr(line.find(':') + 1));
    std::set<std::string> out;
    for (std::string w; words >> w;) out.insert(w);
    return out;
  }
  return {};
}

// The machine and CPU ISA the package was compiled for (AOTI_CPU_ISA words).
void CheckMachine(const Json& stamp, const std::string& where) {
  utsname u{};
  uname(&u);
  const std::string platform = stamp.value("platform", ""), machine = stamp.value("machine", "");
  if (!platform.empty() && platform != "linux")
    Fail(ErrorCode::kUnsupported, where, "compiled for " + platform + ", this is linux");
  if (!machine.empty() && machine != u.machine)
    Fail(ErrorCode::kUnsupported, where, "compiled for " + machine + ", this is " + u.machine);
  if (stamp.value("device", "cpu") != "cpu")
    Fail(ErrorCode::kUnsupported, where,
         "compiled for " + stamp.value("device", "") + ": tsar binds CPU AOTInductor programs");
  if (std::string(u.machine) != "x86_64") return;
  static const std::map<std::string, std::vector<std::string>> isa = {
      {"AVX2", {"avx2", "fma"}},
      {"AVX512", {"avx512f", "avx512dq", "avx512vl", "avx512bw"}},
      {"AVX512_VNNI", {"avx512_vnni"}}, {"AVX512_BF16", {"avx512_bf16"}},
      {"AVX512_FP16", {"avx512_fp16"}}, {"AMX_TILE", {"amx_tile"}},
      {"AMX_BF16", {"amx_bf16"}},       {"AMX_INT8", {"amx_int8"}}};
  const auto flags = CpuFlags();
  if (flags.empty()) return;
  std::istringstream words(stamp.value("cpu_isa", ""));
  std::string missing;
  for (std::string w; words >> w;) {
    const auto it = isa.find(w);
    if (it == isa.end()) continue;
    for (const auto& f : it->second)
      if (!flags.count(f)) {
        missing += (missing.empty() ? "" : ", ") + w;
        break;
      }
  }
  if (!missing.empty())
    Fail(ErrorCode::kUnsupported, where,
         "compiled for the CPU ISA '" + stamp.value("cpu_isa", "") + "'; this CPU lacks " +
             missing + ": compile it again on (or for) this machine");
}

std::pair<int, int> Release(const std::string& version) {
  int major = -1, minor = -1;
  if (std::sscanf(version.c_str(), "%d.%d", &major, &minor) != 2) return {-1, -1};
  return {major, minor};
}

void CheckTorch(const Json& stamp, TorchMatch match, const std::string& where) {
  if (match == TorchMatch::kAny) return;
  const std::string made = stamp.value("torch_version", "");
  const std::string here = std::to_string(TORCH_VERSION_MAJOR) + "." +
                           std::to_string(TORCH_VERSION_MINOR) + "." +
                           std::to_string(TORCH_VERSION_PATCH);
  const bool ok = match == TorchMatch::kRelease
                      ? Release(made) == std::make_pair(TORCH_VERSION_MAJOR, TORCH_VERSION_MINOR)
                      : made.substr(0, made.find('+')) == here;
  if (!ok)
    Fail(ErrorCode::kUnsupported, where,
         "compiled with torch " + made + ", this LibTorch is " + here +
             (match == TorchMatch::kRelease ? " (the same major.minor is needed; "
                                            : " (the same version is needed; ") +
             "TorchMatch::kAny tries anyway)");
}

#if TSAR_HAVE_AOTI
struct TempFile {
  std::string path;
  ~TempFile() {
    if (!path.empty()) ::unlink(path.c_str());
  }
};

std::string Write(const std::string& bytes, const std::string& where) {
  const char* dir = std::getenv("TMPDIR");
  std::string name = std::string(dir && *dir ? dir : "/tmp") + "/tsar-aoti-XXXXXX.pt2";
  const int fd = ::mkstemps(name.data(), 4);
  if (fd < 0) Fail(ErrorCode::kIo, where, "cannot make a temporary file in " + name + ": " + std::strerror(errno));
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n <= 0) {
      const int e = errno;
      ::close(fd);
      ::unlink(name.c_str());
      Fail(ErrorCode::kIo, where, "writing " + name + ": " + std::strerror(e));
    }
    done += static_cast<size_t>(n);
  }
  ::close(fd);
  return name;
}
#endif

}  // namespace

struct AotiProgram::State {
  std::string name;
  std::optional<Archive> archive;  // the mapping outlives the loader's use of it
#if TSAR_HAVE_AOTI
  std::unique_ptr<torch::inductor::AOTIModelPackageLoader> loader;
#endif
  std::unordered_map<std::string, at::Tensor> constants;  // kept alive: user-managed
  std::vector<std::string> bound;
  int64_t private_bytes = 0;
};

AotiProgram::AotiProgram(std::unique_ptr<State> state) : state_(std::move(state)) {}
AotiProgram::AotiProgram(AotiProgram&&) noexcept = default;
AotiProgram& AotiProgram::operator=(AotiProgram&&) noexcept = default;
AotiProgram::~AotiProgram() = default;
const std::string& AotiProgram::name() const { return state_->name; }
const std::vector<std::string>& AotiProgram::bound() const { return state_->bound; }
int64_t AotiProgram::private_constant_bytes() const { return state_->private_bytes; }

#if TSAR_HAVE_AOTI
std::vector<at::Tensor> AotiProgram::run(const std::vector<at::Tensor>& inputs) const {
  return state_->loader->run(inputs);
}
torch::inductor::AOTIModelPackageLoader& AotiProgram::loader() const { return *state_->loader; }
#else
std::vector<at::Tensor> AotiProgram::run(const std::vector<at::Tensor>&) const {
  Fail(ErrorCode::kUnsupported, state_->name, "built without AOTInductor");
}
torch::inductor::AOTIModelPackageLoader& AotiProgram::loader() const {
  Fail(ErrorCode::kUnsupported, state_->name, "built without AOTInductor");
}
#endif

std::vector<std::string> program_names(const ArchiveFile& archive) {
  std::vector<std::string> out;
  const std::string prefix = kStampPrefix;
  for (const auto& key : archive.metadata_keys())
    if (key.rfind(prefix, 0) == 0) out.push_back(key.substr(prefix.size()));
  return out;
}

AotiProgram load_aoti(const Archive& archive, const AotiOptions& options) {
  std::string where = archive.path();
  // Which program: the one named, or the only "aoti" one.
  std::string name = options.name;
  auto stamp_of = [&](const std::string& n) -> std::optional<Json> {
    const auto v = archive.metadata(kStampPrefix + n);
    if (!v || !std::holds_alternative<std::string>(*v)) return std::nullopt;
    return json::ParseOrdered(std::get<std::string>(*v));
  };
  const auto names = program_names(archive);
  if (name.empty()) {
    std::vector<std::string> aoti;
    for (const auto& n : names) {
      const auto s = stamp_of(n);
      if (s && s->is_object() && s->value("kind", "") == "aoti") aoti.push_back(n);
    }
    if (aoti.size() != 1) {
      std::string list;
      for (const auto& n : (aoti.empty() ? names : aoti)) list += (list.empty() ? "" : ", ") + n;
      Fail(aoti.empty() ? ErrorCode::kNotFound : ErrorCode::kInvalidArgument, where,
           std::to_string(aoti.size()) + " AOTInductor program(s) in the archive" +
               (aoti.empty() ? "; programs: " + (list.empty() ? std::string("none") : list)
                             : " (" + list + "): name one (AotiOptions::name)"));
    }
    name = aoti[0];
  }
  where += ": program '" + name + "'";
  const auto stamp = stamp_of(name);
  if (!stamp) {
    if (!archive.metadata(kStampPrefix + name)) Fail(ErrorCode::kNotFound, where, "not in the archive");
    Fail(ErrorCode::kBadInput, where, "stamp is not a JSON string");
  }
  if (!stamp->is_object() || stamp->value("format", "") != kFormat)
    Fail(ErrorCode::kUnsupported, where, std::string("stamp format: this tsar reads ") + kFormat);
  if (stamp->value("kind", "") != "aoti")
    Fail(ErrorCode::kInvalidArgument, where,
         "a '" + stamp->value("kind", "") + "' program, not an AOTInductor one (Python: tsar.load_program)");
  const std::string file = "programs/" + name + ".pt2";
  const std::string entry = stamp->value("entry", ""), model = stamp->value("model", "");
  // A model name as the writer's grammar has it (spec §4.7.2's NAME): it
  // names members of the package and LibTorch's folder for it.
  const bool model_ok =
      !model.empty() && model.size() <= 128 && model[0] != '.' && model[0] != '-' &&
      model.find_first_not_of("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-") ==
          std::string::npos;
  if (stamp->value("file", "") != file || entry.empty() || !model_ok)
    Fail(ErrorCode::kBadInput, where, "stamp: file, entry or model malformed");
  CheckTorch(*stamp, options.torch_match, where);
  CheckMachine(*stamp, where);

  const auto data = archive.metadata("file:" + file);
  if (!data || !std::holds_alternative<Bytes>(*data))
    Fail(ErrorCode::kBadInput, where, "stamp without its file '" + file + "'");
  const std::string& package = std::get<Bytes>(*data).data;
  zip::Reader zip(reinterpret_cast<const uint8_t*>(package.data()), package.size(), where + ": " + file);
  auto read = [&](const std::string& rel) -> std::optional<std::string> {
    const zip::Record* r = zip.Find(zip.prefix() + rel);
    if (r == nullptr) return std::nullopt;
    return zip.Read(*r, kMemberLimit);
  };
  if (!zip.Find(zip.prefix() + "tsar_aoti.json"))
    Fail(ErrorCode::kBadInput, where, "no tsar_aoti.json: not a package tsar.compile_aoti wrote");
  const auto weights_text = read("data/weights/" + model + "_weights_config.json");
  if (!weights_text) Fail(ErrorCode::kBadInput, where, "no data/weights/" + model + "_weights_config.json");
  const auto weights = Payloads(*weights_text, where);

  // The weights, from the archive (tied names: the same bytes and view as a
  // name the entry has, bound to it), checked before any code is loaded.
  std::unordered_map<std::string, at::Tensor> given;
  std::vector<std::string> problems;
  std::map<std::tuple<std::string, int, std::vector<int64_t>, std::vector<int64_t>, int64_t>, std::string> present;
  std::set<std::string> keys;
  for (const auto& k : archive.names(entry)) keys.insert(k);
  for (const auto& p : weights)
    if (keys.count(p.fqn))
      present.emplace(std::make_tuple(p.path_name, static_cast<int>(p.dtype), p.shape, p.stride, p.offset), p.fqn);
  std::vector<std::pair<std::string, std::string>> tied;
  for (const auto& p : weights) {
    if (!keys.count(p.fqn)) {
      const auto same = present.find(std::make_tuple(p.path_name, static_cast<int>(p.dtype), p.shape, p.stride, p.offset));
      if (same != present.end()) tied.emplace_back(p.fqn, same->second);
      else problems.push_back(p.fqn + ": not in entry '" + entry + "'");
      continue;
    }
    at::Tensor t = archive.tensor(p.fqn, entry);
    if (t.scalar_type() != p.dtype)
      problems.push_back(p.fqn + ": dtype " + std::string(c10::toString(p.dtype)) + " expected, found " +
                         c10::toString(t.scalar_type()));
    else if (t.sizes().vec() != p.shape)
      problems.push_back(p.fqn + ": shape " + c10::str(c10::IntArrayRef(p.shape)) + " expected, found " + c10::str(t.sizes()));
    else
      given[p.fqn] = t;
  }
  if (!problems.empty()) {
    std::string list;
    for (size_t i = 0; i < problems.size() && i < 20; ++i) list += (i ? "; " : "") + problems[i];
    Fail(ErrorCode::kBindMismatch, where,
         std::to_string(problems.size()) + " weight(s) do not match entry '" + entry + "': " + list);
  }
  for (const auto& [fqn, same] : tied) given[fqn] = given[same];

  auto state = std::make_unique<AotiProgram::State>();
  state->name = name;
  state->archive = archive;
  // The program's own constants: small, private copies.
  if (const auto text = read("data/constants/" + model + "_constants_config.json")) {
    for (const auto& p : Payloads(*text, where)) {
      const std::string w = where + ": constant '" + p.fqn + "'";
      if (p.path_name.find('/') != std::string::npos) Fail(ErrorCode::kBadInput, w, "bad payload name");
      const auto raw = read("data/constants/" + p.path_name);
      if (!raw) Fail(ErrorCode::kBadInput, w, "payload '" + p.path_name + "' missing");
      const int64_t size = static_cast<int64_t>(c10::elementSize(p.dtype));
      if (raw->size() % size) Fail(ErrorCode::kBadInput, w, "not a whole number of elements");
      const int64_t n = static_cast<int64_t>(raw->size()) / size;
      bool empty = false;
      int64_t last = p.offset;
      for (size_t d = 0; d < p.shape.size(); ++d) {
        if (p.shape[d] == 0) empty = true;
        else last += (p.shape[d] - 1) * p.stride[d];
      }
      if (!empty && last >= n) Fail(ErrorCode::kBadInput, w, "shape and strides reach past the payload");
      at::Tensor flat = at::empty({n}, at::TensorOptions().dtype(p.dtype));
      if (n) std::memcpy(flat.data_ptr(), raw->data(), raw->size());
      given[p.fqn] = flat.as_strided(p.shape, p.stride, p.offset);
      state->private_bytes += static_cast<int64_t>(raw->size());
    }
  }

#if TSAR_HAVE_AOTI
  TempFile temp{Write(package, where)};
  try {
    state->loader = std::make_unique<torch::inductor::AOTIModelPackageLoader>(temp.path, model);
  } catch (const c10::Error& e) {
    Fail(ErrorCode::kBadInput, where, std::string("LibTorch cannot load the package: ") + e.what_without_backtrace());
  }
  std::string missing;
  for (const auto& fqn : state->loader->get_constant_fqns()) {
    const auto it = given.find(fqn);
    if (it == given.end()) {
      missing += (missing.empty() ? "" : ", ") + fqn;
      continue;
    }
    state->constants.emplace(fqn, it->second);
    if (weights.end() != std::find_if(weights.begin(), weights.end(), [&](const Payload& p) { return p.fqn == fqn; }))
      state->bound.push_back(fqn);
  }
  if (!missing.empty())
    Fail(ErrorCode::kBindMismatch, where,
         "the compiled code needs constants that neither the archive nor the program holds: " + missing);
  state->loader->load_constants(state->constants, /*use_inactive=*/false,
                                /*check_full_update=*/true, /*user_managed=*/true);
#else
  Fail(ErrorCode::kUnsupported, where,
       "this tsar was built against a LibTorch without AOTInductor's package loader with "
       "user-managed constants (torch 2.8 or newer has it)");
#endif
  return AotiProgram(std::move(state));
}

}  // namespace tsar
