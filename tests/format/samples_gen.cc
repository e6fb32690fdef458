// Builds every file of samples/ from scratch with format/encode.h and
// hand-made mutations. tests/format/samples_test.cc checks the committed files
// are byte-identical to this output; tsar_gen_samples writes them.
#include "tests/format/samples_gen.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>

#include "format/checksum.h"
#include "format/encode.h"
#include "format/endian.h"
#include "format/index.h"
#include "format/spec.h"
#include "format/tensor_parallel.h"
#include "format/value_tree.h"
#include "tests/format/samples_draft.h"
#include "tests/format/samples_gen.h"
#include "tests/format/samples_invalid.h"
#include "tsar/archive_file.h"
#include "tsar/error.h"

namespace tsar::testing {
namespace {

using namespace samples;  // Draft, the helpers (and their using-declarations), the invalid catalogue

// valid/tensor_parallel (format 1.4, §4.12): an archive laid out for 2
// ranks, alignment 128. "q.weight" [4, 3] is split along dim 0 and "o.weight"
// [3, 4] along dim 1: slices of 24 bytes, 64 apart. "emb.weight" [4, 32] and
// its tied "head.weight" share one storage split along dim 0: slices of 256
// bytes, back to back, so the storage is the tensor in C order. "norm" is
// stored whole.
Draft TensorParallel() {
  Draft d(128);
  d.tp_world = 2;
  d.b.SetTensorParallel(2);
  d.Entry("model");
  auto sharded = [&d](const std::string& name, std::vector<int64_t> sizes, uint32_t dim,
                      uint8_t seed) {
    uint64_t numel = 1;
    for (int64_t x : sizes) numel *= static_cast<uint64_t>(x);
    const std::string c_order = Pattern(numel * 4, seed);
    format::ShardLayout l;
    format::ComputeShardLayout(sizes.data(), static_cast<uint32_t>(sizes.size()), dim, 4, 2, 128,
                               &l);
    std::string blocked(l.nbytes, '\0');
    format::GatherBlocked(l, reinterpret_cast<const uint8_t*>(c_order.data()), 0, l.nbytes,
                          reinterpret_cast<uint8_t*>(blocked.data()));
    const uint32_t s = d.Storage(blocked);
    TensorSpec t =
        T(name, s, DType::kFloat32, sizes, format::ShardStrides(sizes), 0, Role::kParameter);
    t.shard_dim = dim;
    d.Tensor(t);
    return t;
  };
  sharded("q.weight", {4, 3}, 0, 1);
  sharded("o.weight", {3, 4}, 1, 2);
  TensorSpec head = sharded("emb.weight", {4, 32}, 0, 3);
  head.name = "head.weight";
  d.Tensor(head);
  d.Tensor(T("norm", d.Storage(Floats({1.0f, 0.5f, 0.25f})), DType::kFloat32, {3}, {1}, 0,
             Role::kParameter));
  return d;
}

// valid/shared: views of one storage, a tied weight, 0-d and empty tensors.
Draft Shared() {
  Draft d;
  d.Entry("model");
  const uint32_t full = d.Storage(Floats({0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}));
  const uint32_t emb = d.Storage(Floats({0.5f, -0.5f, 1.5f, -1.5f, 2.5f, -2.5f}));
  const uint32_t scalar = d.Storage(Floats({42.0f}));
  const uint32_t none = d.Storage(std::string());
  d.Tensor(T("full", full, DType::kFloat32, {16}, {1}, 0, Role::kBuffer));
  d.Tensor(T("part", full, DType::kFloat32, {2, 4}, {4, 1}, 4, Role::kBuffer));
  d.Tensor(T("tr", full, DType::kFloat32, {4, 3}, {1, 4}, 0, Role::kBuffer));
  d.Tensor(T("emb.weight", emb, DType::kFloat32, {3, 2}, {2, 1}, 0, Role::kParameter));
  d.Tensor(T("head.weight", emb, DType::kFloat32, {3, 2}, {2, 1}, 0, Role::kParameter));
  d.Tensor(T("scalar", scalar, DType::kFloat32, {}, {}, 0, Role::kBuffer));
  d.Tensor(T("empty", none, DType::kFloat32, {0, 3}, {3, 1}, 0, Role::kBuffer));
  return d;
}

// valid/dtypes: one 2-element tensor of every dtype code of format 1.0 (1-18);
// valid/dtypes_1_3: the same for the codes format 1.3 added (19-22), a minor 3 archive.
Draft DtypesOf(uint16_t first, uint16_t last) {
  Draft d;
  d.Entry("zoo");
  for (DType dt : kAllDTypes) {
    const auto code = static_cast<uint16_t>(dt);
    if (code < first || code > last) continue;
    const uint32_t s = d.Storage(Pattern(2 * ElementSize(dt), static_cast<uint8_t>(dt)));
    d.Tensor(T(std::string(DTypeName(dt)), s, dt, {2}, {1}));
  }
  return d;
}
Draft Dtypes() { return DtypesOf(1, format::kLastDTypeCodeOfMinor2); }
Draft Dtypes13() { return DtypesOf(format::kFirstMinor3DTypeCode, format::kLastDTypeCode); }

// valid/entries_meta: two entries, metadata of every type at both scopes,
// requires_grad and a device hint.
Draft EntriesMeta() {
  Draft d;
  d.Entry("model");
  const uint32_t s = d.Storage(Floats({1, 2, 3, 4}));
  TensorSpec w = T("w", s, DType::kFloat32, {2, 2}, {2, 1}, 0, Role::kParameter);
  w.requires_grad = true;
  w.device_type = DeviceType::kCuda;
  w.device_index = 1;
  d.Tensor(w);
  d.Entry("ema");
  const uint32_t s2 = d.Storage(Floats({1.5f, 2.5f, 3.5f, 4.5f}));
  d.Tensor(T("w", s2, DType::kFloat32, {2, 2}, {2, 1}, 0, Role::kParameter));
  auto meta = [&](uint32_t entry, std::string key, MetaType type, int64_t i, double x,
                  std::string bytes, nlohmann::ordered_json value) {
    MetadataSpec m;
    m.entry = entry;
    m.key = key;
    m.type = type;
    m.int_value = i;
    m.float_value = x;
    m.bytes = bytes;
    d.Meta(m);
    static const char* const kTypes[] = {"", "string", "int", "float", "bytes"};
    d.meta.push_back({entry,
                      key,
                      {{"entry", entry == format::kNone ? nlohmann::ordered_json(nullptr)
                                                        : nlohmann::ordered_json(entry)},
                       {"key", key},
                       {"type", kTypes[static_cast<int>(type)]},
                       {"value", value}}});
  };
  meta(format::kNone, "step", MetaType::kInt, -10, 0, "", -10);
  meta(format::kNone, "lr", MetaType::kFloat, 0, 0.25, "", 0.25);
  meta(format::kNone, "arch", MetaType::kString, 0, 0, "tiny\xc3\xa9", "tiny\xc3\xa9");
  meta(format::kNone, "blob", MetaType::kBytes, 0, 0, std::string("\x00\xff\x10", 3), "00ff10");
  meta(1, "decay", MetaType::kFloat, 0, 0.999, "", 0.999);
  return d;
}

// valid/attached_files: attached files (§4.7.1) beside records that are not
// files: a name the grammar refuses, a string record, a per-entry record.
Draft AttachedFiles() {
  Draft d;
  d.Entry("model");
  d.Tensor(T("w", d.Storage(Floats({1, 2})), DType::kFloat32, {2}, {1}));
  auto meta = [&](uint32_t entry, std::string key, MetaType type, std::string value) {
    MetadataSpec m;
    m.entry = entry;
    m.key = key;
    m.type = type;
    m.bytes = value;
    d.Meta(m);
    std::string hex;
    for (const unsigned char c : value) {
      static const char kHex[] = "0123456789abcdef";
      hex += kHex[c >> 4];
      hex += kHex[c & 15];
    }
    d.meta.push_back({entry,
                      key,
                      {{"entry", entry == format::kNone ? nlohmann::ordered_json(nullptr)
                                                        : nlohmann::ordered_json(entry)},
                       {"key", key},
                       {"type", type == MetaType::kBytes ? "bytes" : "string"},
                       {"value", type == MetaType::kBytes ? hex : value}}});
    return hex;
  };
  d.files = nlohmann::ordered_json::object();
  d.files["config.json"] = meta(format::kNone, "file:config.json", MetaType::kBytes, "{}\n");
  d.files["t/v.txt"] = meta(format::kNone, "file:t/v.txt", MetaType::kBytes, "");
  meta(format::kNone, "file:../up", MetaType::kBytes, "x");   // ".." refused: metadata
  meta(format::kNone, "file:s.txt", MetaType::kString, "s");  // not bytes: metadata
  meta(0, "file:e.txt", MetaType::kBytes, "e");               // per entry: metadata
  return d;
}

// valid/aligned: alignment 128, so a 128-byte storage takes the large-storage
// rule of §4.4 and a 64-byte one the small rule, in a file under 4 KiB.
Draft Aligned() {
  Draft d(128);
  d.Entry("model");
  const uint32_t small = d.Storage(Pattern(8, 1));
  const uint32_t big = d.Storage(Pattern(128, 2));
  const uint32_t small2 = d.Storage(Pattern(64, 3));
  d.Tensor(T("a", small, DType::kInt64, {1}, {1}));
  d.Tensor(T("b", big, DType::kFloat64, {4, 4}, {4, 1}));
  d.Tensor(T("c", small2, DType::kUInt8, {64}, {1}));
  return d;
}

// valid/empty_views: views with a size of 0 reach no byte, so they are valid
// whatever their strides (§4.5, E3), as long as each size and stride is at
// most 2^63-1, their non-zero sizes multiply to at most 2^63-1 (R78) and
// storage_offset * element size is within the storage. "huge" sits on the R78
// limit: 7 * (2^63-1)/7 = 2^63-1, with the 0 between the two factors.
Draft EmptyViews() {
  Draft d;
  d.Entry("model");
  const uint32_t s = d.Storage(Floats({1.0f, 2.0f}));
  constexpr int64_t kMax = INT64_MAX;
  d.Tensor(T("at_end", s, DType::kFloat32, {0}, {1}, 2));
  d.Tensor(T("huge", s, DType::kFloat32, {7, 0, kMax / 7}, {kMax, kMax, kMax}));
  d.Tensor(T("wide", s, DType::kInt64, {0, 3}, {kMax, 1}, 1));
  return d;
}

// valid/sparse: a COO and a CSR sparse tensor (§4.6) next to a dense one,
// so that readers meet sparse records and rules R54-R65. Each component is a
// dense tensor of role 3 on its own storage.
Draft SparseTensors() {
  Draft d;
  d.Entry("model");
  auto component = [&d](const std::string& name, DType dtype, std::string bytes,
                        std::vector<int64_t> sizes, std::vector<int64_t> strides, uint32_t sparse) {
    TensorSpec t = T(name, d.Storage(std::move(bytes)), dtype, std::move(sizes), std::move(strides),
                     0, Role::kSparseComponent);
    t.sparse = sparse;
    d.Tensor(std::move(t));
  };
  auto ints = [](std::initializer_list<int64_t> v, size_t width) {
    std::string s(v.size() * width, '\0');
    size_t i = 0;
    for (int64_t x : v) {
      auto* p = reinterpret_cast<uint8_t*>(s.data()) + width * i++;
      if (width == 8) {
        format::StoreU64(p, static_cast<uint64_t>(x));
      } else {
        format::StoreU32(p, static_cast<uint32_t>(x));
      }
    }
    return s;
  };
  d.Tensor(
      T("bias", d.Storage(Floats({0.5f, -0.5f})), DType::kFloat32, {2}, {1}, 0, Role::kParameter));
  // adj = sparse_coo_tensor([[0, 2], [1, 0]], [1.0, 2.0], (3, 3)), coalesced.
  format::SparseSpec coo;
  coo.name = "adj";
  coo.layout = format::SparseLayout::kCoo;
  coo.coalesced = true;
  coo.sizes = {3, 3};
  coo.first_component = 1;
  const uint32_t adj = d.Sparse(coo);
  component("adj.indices", DType::kInt64, ints({0, 2, 1, 0}, 8), {2, 2}, {2, 1}, adj);
  component("adj.values", DType::kFloat32, Floats({1.0f, 2.0f}), {2}, {1}, adj);
  // m = sparse_csr_tensor([0, 1, 2], [1, 0], [3.0, 4.0], (2, 2)).
  format::SparseSpec csr;
  csr.name = "m";
  csr.layout = format::SparseLayout::kCsr;
  csr.sizes = {2, 2};
  csr.first_component = 3;
  const uint32_t m = d.Sparse(csr);
  component("m.crow_indices", DType::kInt32, ints({0, 1, 2}, 4), {3}, {1}, m);
  component("m.col_indices", DType::kInt32, ints({1, 0}, 4), {2}, {1}, m);
  component("m.values", DType::kFloat32, Floats({3.0f, 4.0f}), {2}, {1}, m);
  return d;
}

// valid/groups (format 1.5, §4.13): a torchao Int8Tensor weight of a
// bfloat16 nn.Linear(8, 4) as a tensor group: "0.weight" of outer dtype
// bfloat16, sizes [4, 8], strides [8, 1], made of "0.weight.qdata" (int8
// [4, 8]) and "0.weight.scale" (float32 [4, 1]), described by the string
// metadata record "group:0.weight" of its entry; "0.bias" beside it.
Draft Groups() {
  Draft d;
  d.Entry("model");
  format::SparseSpec g;
  g.name = "0.weight";
  g.layout = format::SparseLayout::kGroup;
  g.dtype = DType::kBFloat16;
  g.sizes = {4, 8};
  g.strides = {8, 1};
  g.first_component = 0;
  g.component_count = 2;
  const uint32_t w = d.Sparse(g);
  TensorSpec q = T("0.weight.qdata", d.Storage(Pattern(32, 7)), DType::kInt8, {4, 8}, {8, 1}, 0,
                   Role::kSparseComponent);
  q.sparse = w;
  d.Tensor(q);
  TensorSpec sc = T("0.weight.scale", d.Storage(Floats({0.5f, 0.25f, 0.125f, 1.0f})),
                    DType::kFloat32, {4, 1}, {1, 1}, 0, Role::kSparseComponent);
  sc.sparse = w;
  d.Tensor(sc);
  d.Tensor(T("0.bias", d.Storage(Pattern(8, 9)), DType::kBFloat16, {4}, {1}, 0, Role::kParameter));
  const std::string description =
      R"({"attributes":{"block_size":["list",[1,8]],"dtype":["dtype","bfloat16"]},)"
      R"("class":"Int8Tensor","library":"torchao","members":["qdata","scale"],)"
      R"("version":"0.18.0"})";
  MetadataSpec m;
  m.entry = 0;
  m.key = "group:0.weight";
  m.type = MetaType::kString;
  m.bytes = description;
  d.Meta(m);
  d.meta.push_back({0, m.key, {{"entry", 0}, {"key", m.key}, {"type", "string"},
                               {"value", description}}});
  return d;
}

// valid/value_tree (format 1.1): what a training checkpoint holds, as a value
// tree (§4.10) with one value of every kind: a state_dict entry with
// attributes, a loose tensor, numbers of each kind, a bigint, strings, bytes,
// a list of a tuple, an int key, and an opaque argparse.Namespace whose pickle
// fragment has the parameter "model/w" in its one hole.
Draft ValueTree() {
  Draft d;
  d.Entry("model");
  d.Tensor(T("w", d.Storage(Floats({1.0f, 2.0f})), DType::kFloat32, {2}, {1}, 0, Role::kParameter));
  d.Entry("tensors");
  std::string step(8, '\0');
  step[0] = 5;
  d.Tensor(T("step", d.Storage(step), DType::kInt64, {}, {}, 0, Role::kTensor));
  using V = Value;
  V model = V::Entry("model", /*ordered=*/true);
  model.set_attributes(V::Dict(
      {{V::Str("_metadata"), V::Dict({{V::Str(""), V::Dict({{V::Str("version"), V::Int(1)}})}},
                                     /*ordered=*/true)}}));
  std::string big(9, '\0');  // 2^64
  big[8] = 1;
  const std::string ns_head = std::string("cargparse\nNamespace\n)\x81}(X\x01\x00\x00\x00w", 30);
  d.Tree(V::Dict({
      {V::Str("model"), model},
      {V::Str("step"), V::Tensor("tensors", "step")},
      {V::Str("epoch"), V::Int(3)},
      {V::Str("lr"), V::Float(0.25)},
      {V::Str("flag"), V::Bool(true)},
      {V::Str("none"), V::None()},
      {V::Str("big"), V::BigInt(big)},
      {V::Str("name"), V::Str("run\xc3\xa9")},
      {V::Str("raw"), V::Bytes(std::string("\x00\xff", 2))},
      {V::Str("groups"), V::List({V::Tuple({V::Int(1), V::Str("a")})})},
      {V::Int(7), V::Str("int key")},
      {V::Str("args"), V::Opaque("argparse.Namespace", {ns_head, "ub"}, {V::Tensor("model", "w")})},
      {V::Str("tail"), V::List({V::Str("x"), V::Str("y")})},
  }));
  return d;
}

// valid/layer: a layer over valid/shared.tsar (recorded as `path`): a new
// "full", the embedding (tied) and the scalar from the base.
Draft LayerOver(const std::string& shared, const std::string& path) {
  Draft d;
  d.Layer(shared, path);
  d.Entry("model");
  const uint32_t full =
      d.Storage(Floats({16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31}));
  const uint32_t emb = d.BaseStorage(1, Floats({0.5f, -0.5f, 1.5f, -1.5f, 2.5f, -2.5f}));
  const uint32_t scalar = d.BaseStorage(2, Floats({42.0f}));
  d.Tensor(T("full", full, DType::kFloat32, {16}, {1}, 0, Role::kBuffer));
  d.Tensor(T("emb.weight", emb, DType::kFloat32, {3, 2}, {2, 1}, 0, Role::kParameter));
  d.Tensor(T("head.weight", emb, DType::kFloat32, {3, 2}, {2, 1}, 0, Role::kParameter));
  d.Tensor(T("scalar", scalar, DType::kFloat32, {}, {}, 0, Role::kBuffer));
  return d;
}

std::string Tsv(std::string s) {
  for (char& c : s) {
    if (c == '\t' || c == '\n') c = ' ';
  }
  return s;
}

// The manifest of samples/layers/ (§8): each file opened, with its bases,
// from a scratch copy of samples/ whose working directory is layers/, so that
// messages name files as a reader in samples/layers/ sees them.
std::string LayersManifest(const std::vector<SampleFile>& files,
                           const std::vector<std::pair<std::string, std::string>>& layers) {
  char dir[] = "/tmp/tsar-samples-XXXXXX";
  if (mkdtemp(dir) == nullptr) throw std::runtime_error("mkdtemp failed");
  const std::string root = dir;
  for (const char* sub : {"/valid", "/layers"}) mkdir((root + sub).c_str(), 0755);
  for (const auto& f : files) {
    std::ofstream(root + "/" + f.path, std::ios::binary) << f.bytes;
  }
  const int cwd = open(".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (cwd < 0 || chdir((root + "/layers").c_str()) != 0) throw std::runtime_error("chdir failed");
  std::string manifest = "file\tcode\toffset\tmessage\tdescription\n";
  std::string failure;
  for (const auto& [file, what] : layers) {
    try {
      (void)ArchiveFile::open(file);
      failure = file + ": opened, but it was built to fail";
    } catch (const Error& e) {
      manifest += file + "\t" + ErrorCodeName(e.code()) + "\t" +
                  (e.offset() ? std::to_string(*e.offset()) : "") + "\t" + Tsv(e.what()) + "\t" +
                  Tsv(what) + "\n";
    }
  }
  if (fchdir(cwd) != 0) failure = "cannot return to the working directory";
  close(cwd);
  std::filesystem::remove_all(root);
  if (!failure.empty()) throw std::logic_error(failure);
  return manifest;
}

}  // namespace

std::vector<SampleFile> GenerateSamples() {
  std::vector<SampleFile> out;
  std::string minimal, shared, meta, sparse, aligned, empty_views, tree, tp, groups;
  struct Named {
    const char* name;
    Draft (*make)();
  };
  const Named valid[] = {{"empty", [] { return Draft(); }},
                         {"minimal", Minimal},
                         {"shared", Shared},
                         {"dtypes", Dtypes},
                         {"dtypes_1_3", Dtypes13},
                         {"entries_meta", EntriesMeta},
                         {"attached_files", AttachedFiles},
                         {"aligned", Aligned},
                         {"empty_views", EmptyViews},
                         {"sparse", SparseTensors},
                         {"value_tree", ValueTree},
                         {"tensor_parallel", TensorParallel},
                         {"groups", Groups}};
  for (const Named& n : valid) {
    Draft d = n.make();
    const std::string bytes = d.Bytes();
    out.push_back({std::string("valid/") + n.name + ".tsar", bytes});
    out.push_back({std::string("valid/") + n.name + ".expected.json", d.Expected(bytes)});
    if (std::string(n.name) == "minimal") minimal = bytes;
    if (std::string(n.name) == "shared") shared = bytes;
    if (std::string(n.name) == "entries_meta") meta = bytes;
    if (std::string(n.name) == "sparse") sparse = bytes;
    if (std::string(n.name) == "aligned") aligned = bytes;
    if (std::string(n.name) == "empty_views") empty_views = bytes;
    if (std::string(n.name) == "value_tree") tree = bytes;
    if (std::string(n.name) == "tensor_parallel") tp = bytes;
    if (std::string(n.name) == "groups") groups = bytes;
  }
  std::string layer;
  {
    Draft d = LayerOver(shared, "shared.tsar");
    layer = d.Bytes();
    out.push_back({"valid/layer.tsar", layer});
    out.push_back({"valid/layer.expected.json", d.Expected(layer)});
  }
  std::string manifest = "file\tcode\toffset\tmessage\tdescription\n";
  for (const Invalid& inv :
       InvalidCatalogue(minimal, shared, meta, sparse, aligned, empty_views, tree, layer, tp,
                        groups)) {
    const std::string bytes = inv.make();
    const std::string file = std::string(inv.name) + ".tsar";
    try {
      format::Index::ParseBytes(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), file);
      throw std::logic_error(file + ": parsed, but it was built to fail");
    } catch (const Error& e) {
      const uint64_t want = inv.offset(bytes);
      if (e.code() != inv.code || e.offset().value_or(UINT64_MAX) != want) {
        throw std::logic_error(file + ": expected " + ErrorCodeName(inv.code) + " at " +
                               std::to_string(want) + ", got " + e.what());
      }
      manifest += file + "\t" + ErrorCodeName(e.code()) + "\t" + std::to_string(want) + "\t" +
                  Tsv(e.what()) + "\t" + Tsv(inv.what) + "\n";
    }
    out.push_back({"invalid/" + file, bytes});
  }
  out.push_back({"invalid/MANIFEST.tsv", manifest});

  // §4.11 resolution failures: valid alone, refused when opened with their bases.
  // The last three name the right base but lie about it in their layer
  // record or base storage table (refixed): B4, B5, B6.
  const auto lying = [&](const std::function<void(std::string&)>& edit) {
    std::string f = LayerOver(shared, "../valid/shared.tsar").Bytes();
    edit(f);
    Refix(f);
    return f;
  };
  const std::vector<std::pair<std::string, std::string>> layers = {
      {"wrong_base.tsar",
       "a layer over valid/shared.tsar whose base path names valid/minimal.tsar"},
      {"missing_base.tsar", "a layer whose base file does not exist"},
      {"cycle.tsar", "a layer whose base path names itself"},
      {"impostor_base.tsar",
       "a layer over valid/shared.tsar whose base path names other_shared.tsar, of the same "
       "size, whose tensor \"full\" is named \"fuLL\""},
      {"depth_wrong.tsar", "a layer over valid/shared.tsar (a plain archive) that says depth 2"},
      {"storage_count_wrong.tsar",
       "a layer over valid/shared.tsar (4 storages) that says its base has 5"},
      {"base_storage_differs.tsar",
       "a layer over valid/shared.tsar whose base storage #0 says 32 bytes, where the base's "
       "storage #1 has 24"}};
  const std::string bytes[] = {LayerOver(shared, "../valid/minimal.tsar").Bytes(),
                               LayerOver(shared, "missing.tsar").Bytes(),
                               LayerOver(shared, "cycle.tsar").Bytes(),
                               LayerOver(shared, "other_shared.tsar").Bytes(),
                               lying([](std::string& f) { Put32(f, LayerAt(f) + 28, 2); }),
                               lying([](std::string& f) { Put32(f, LayerAt(f) + 24, 5); }),
                               lying([](std::string& f) { Put64(f, BaseStoragesAt(f) + 8, 32); })};
  {
    std::string other = shared;  // same size, one name changed: a different index
    const size_t at = other.find("full");
    other.replace(at, 4, "fuLL");
    Refix(other);
    out.push_back({"layers/other_shared.tsar", other});
  }
  for (size_t i = 0; i < layers.size(); ++i) {
    out.push_back({"layers/" + layers[i].first, bytes[i]});
  }
  out.push_back({"layers/MANIFEST.tsv", LayersManifest(out, layers)});
  return out;
}

}  // namespace tsar::testing
