// Tests of tsar's C++ torchao table and of torchao's safetensors layout
// (writer/torchao_table.h, writer/torchao_safetensors.h): the texts of a
// group's description as Python writes them, its grammar, and `tsar pack` /
// `tsar export` of a transformers torchao checkpoint, on files written here
// (tests/python/test_torchao_transformers.py does it with torchao and
// transformers themselves). Without LibTorch.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "format/endian.h"
#include "tsar/archive_file.h"
#include "tsar/error.h"
#include "writer/exporter.h"
#include "writer/importer.h"
#include "writer/pack_files.h"
#include "writer/torchao_table.h"

namespace tsar::torchao {
namespace {

using OJ = nlohmann::ordered_json;

// A fresh directory, removed with its files at the end of the test.
class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/tsar_torchao_test_XXXXXX";
    path_ = mkdtemp(tmpl);
  }
  ~TempDir() { std::system(("rm -rf '" + path_ + "'").c_str()); }
  std::string operator/(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// A safetensors file: tensors (name, dtype code, shape, bytes) in this order,
// and __metadata__.
struct St {
  std::string name, dtype;
  std::vector<int64_t> shape;
  std::string bytes;
};
void WriteSafetensors(const std::string& path, const std::vector<St>& tensors,
                      const std::vector<std::pair<std::string, std::string>>& metadata) {
  OJ header = OJ::object();
  OJ meta = OJ::object();
  for (const auto& [k, v] : metadata) meta[k] = v;
  header["__metadata__"] = meta;
  uint64_t offset = 0;
  std::string data;
  for (const St& t : tensors) {
    header[t.name] = {{"dtype", t.dtype},
                      {"shape", t.shape},
                      {"data_offsets", {offset, offset + t.bytes.size()}}};
    offset += t.bytes.size();
    data += t.bytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  uint8_t len[8];
  format::StoreU64(len, text.size());
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(len), 8);
  out << text << data;
}

// The safetensors header of `path` (its __metadata__ included).
nlohmann::json Header(const std::string& path) {
  const std::string all = ReadAll(path);
  const uint64_t n = format::LoadU64(reinterpret_cast<const uint8_t*>(all.data()));
  return nlohmann::json::parse(all.substr(8, n));
}

std::string Bytes(size_t n, uint8_t seed) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>(seed + 7 * i);
  return s;
}

// An Int8Tensor weight of nn.Linear(8, 4) in a bfloat16 model, per row, as
// transformers' save_pretrained writes it (torchao's json.dumps).
constexpr const char* kInt8Meta =
    "{\"_type\": \"Int8Tensor\", \"_data\": {\"act_quant_kwargs\": null, \"reduce_range\": false, "
    "\"block_size\": [1, 8], \"dtype\": {\"_type\": \"torch.dtype\", \"_data\": \"bfloat16\"}}, "
    "\"_tensor_data_names\": [\"scale\", \"qdata\"]}";
constexpr const char* kInt8Description =
    "{\"attributes\":{\"act_quant_kwargs\":null,\"block_size\":[\"list\",[1,8]],\"dtype\":"
    "[\"dtype\",\"bfloat16\"],\"reduce_range\":false},\"class\":\"Int8Tensor\",\"library\":"
    "\"torchao\",\"members\":[\"qdata\",\"scale\"],\"version\":\"unknown\"}";

void WriteLinear(const std::string& path, const std::string& weight_meta = kInt8Meta) {
  WriteSafetensors(path,
                   {{"0._weight_qdata", "I8", {4, 8}, Bytes(32, 1)},
                    {"0._weight_scale", "F32", {4, 1}, Bytes(16, 2)},
                    {"0.bias", "BF16", {4}, Bytes(8, 3)}},
                   {{"format", "pt"},
                    {"tensor_names", "[\"0.weight\", \"0.bias\"]"},
                    {"0.weight", weight_meta},
                    {"0.bias", "{\"_type\": \"Tensor\"}"}});
}

TEST(TorchaoTable, FloatHexIsPythonsFloatHex) {
  const std::pair<double, const char*> cases[] = {
      {3.0, "0x1.8000000000000p+1"},
      {-0.0, "-0x0.0p+0"},
      {0.0, "0x0.0p+0"},
      {5e-324, "0x0.0000000000001p-1022"},
      {1.0, "0x1.0000000000000p+0"},
      {0.1, "0x1.999999999999ap-4"},
      {1.7976931348623157e308, "0x1.fffffffffffffp+1023"},
      {2.2250738585072014e-308, "0x1.0000000000000p-1022"},
      {-2.5e-310, "-0x0.02e055c9a3f6cp-1022"},
      {std::numeric_limits<double>::infinity(), "inf"},
      {-std::numeric_limits<double>::infinity(), "-inf"},
  };
  for (const auto& [x, text] : cases) {
    EXPECT_EQ(FloatHex(x), text);
    const auto back = ParseFloatHex(text);
    ASSERT_TRUE(back) << text;
    EXPECT_EQ(std::memcmp(&*back, &x, 8), 0) << text;
  }
  EXPECT_EQ(FloatHex(std::nan("")), "nan");
  EXPECT_TRUE(std::isnan(*ParseFloatHex("nan")));
  for (const char* bad : {"0X1.0p+0", "0x1.0p1", "0x2.0p+0", "0x1.p+0", "0x1.0P+0", "1.0",
                          "0x1.Ap+0", "-nan", " nan", "0x1.0p+", "0x1.fffffffffffffp+1024", ""}) {
    EXPECT_FALSE(ParseFloatHex(bad)) << bad;
  }
  EXPECT_EQ(*ParseFloatHex("0x1.0p-99999"), 0.0);  // rounds to 0, as float.fromhex
}

TEST(TorchaoTable, DumpIsPythonsJsonDumpsSorted) {
  nlohmann::json j = {{"b", 1},
                      {"a", "\x01\n\"\\\x7f\t\xe2\x80\xa8"},
                      {"\xc3\xa9", {true, nullptr}},
                      {"z", {{"y", -5}, {"x", "\xe6\x97\xa5\xe6\x9c\xac"}}}};
  EXPECT_EQ(Dump(j),
            "{\"a\":\"\\u0001\\n\\\"\\\\\x7f\\t\xe2\x80\xa8\",\"b\":1,\"z\":{\"x\":"
            "\"\xe6\x97\xa5\xe6\x9c\xac\",\"y\":-5},\"\xc3\xa9\":[true,null]}");
  try {
    Dump({{"f", 1.5}});
    FAIL() << "a float was written";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
  }
}

TEST(TorchaoTable, TheTableIsPythons) {
  // The rows python/tsar/_torchao.py has (test_torchao_groups.py checks those
  // against torchao).
  EXPECT_EQ(ClassNames(),
            "Float8Tensor, Int4PlainInt32Tensor, Int4PreshuffledTensor, Int4Tensor, "
            "Int4TilePackedTo4dTensor, Int8Tensor, IntxUnpackedToInt8Tensor");
  EXPECT_EQ(EnumNames(),
            "IntxUnpackedToInt8TensorActivationQuantization, KernelPreference, MappingType");
  EXPECT_EQ(RecordNames(),
            "Float8MMConfig, PerAxis, PerBlock, PerGroup, PerRow, PerTensor, PerToken, "
            "QuantizeTensorToFloat8Kwargs, QuantizeTensorToInt8Kwargs");
  const Class* c = FindClass("Int8Tensor");
  ASSERT_NE(c, nullptr);
  EXPECT_TRUE(c->TakesTensor("zero_point") && c->TakesAttribute("reduce_range"));
  EXPECT_FALSE(c->TakesTensor("shape") || c->TakesAttribute("qdata"));
  EXPECT_EQ(c->Default("reduce_range"), nlohmann::json(false));
  EXPECT_EQ(FindClass("Float8Tensor")->Default("kernel_preference"),
            nlohmann::json::parse("[\"enum\",\"KernelPreference\",\"AUTO\"]"));
  EXPECT_FALSE(c->Default("block_size"));  // required: no default
  // Every optional attribute has the value the class's __init__ stores
  // without it, a typed value.
  for (const Class& k : Classes()) {
    for (const std::string_view a : k.optional_attributes) {
      const auto v = k.Default(a);
      ASSERT_TRUE(v) << k.name << "." << a;
      EXPECT_NO_THROW(ParseDescription("w", "{\"class\":\"C\",\"library\":\"torchao\","
                                            "\"members\":[],\"version\":\"v\",\"attributes\":{\"a\":" +
                                                v->dump() + "}}"));
    }
  }
  EXPECT_EQ(FindClass("MXTensor"), nullptr);
  EXPECT_EQ(DTypeOfName("bfloat16"), DType::kBFloat16);
  EXPECT_FALSE(DTypeOfName("int4"));
  EXPECT_FALSE(DTypeOfName("float"));  // an alias, not str(dtype)
}

TEST(TorchaoTable, DescriptionsFollowTheGrammar) {
  const Description d = ParseDescription("0.weight", kInt8Description);
  EXPECT_EQ(d.cls, "Int8Tensor");
  EXPECT_EQ(d.members, (std::vector<std::string>{"qdata", "scale"}));
  EXPECT_EQ(DescriptionText(d), kInt8Description);
  const std::string head =
      "{\"class\":\"Int8Tensor\",\"library\":\"torchao\",\"members\":[\"qdata\"],"
      "\"version\":\"0.18.0\",\"attributes\":";
  std::string deep = "1";
  for (int i = 0; i < 33; ++i) deep = "[\"list\",[" + deep + "]]";
  const std::pair<std::string, const char*> bad[] = {
      {"{", "not JSON"},
      {"[]", "expected an object with exactly"},
      {head + "{}, \"extra\": 1}", "expected an object with exactly"},
      {head + "{}, \"class\": \"X\"}", "twice"},
      {head + "{\"a\":1.5}}", "a number with a fraction"},
      {head + "{\"a\":[\"float\",\"1.5\"]}}", "float.hex"},
      {head + "{\"a\":[\"lst\",[]]}}", "tag \"lst\""},
      {head + "{\"a\":[\"enum\",\"MappingType\"]}}", "with 1 items"},
      {head + "{\"a\":[]}}", "an empty array"},
      {head + "{\"a\":{}}}", "found an object"},
      {head + "{\"a\":9223372036854775808}}", "outside int64"},
      {head + "{\"a\":[\"size\",[1,2.0]]}}", "tag \"size\""},
      {head + "{\"a\":" + deep + "}}", "nested more than 32"},
      {"{\"class\":\"I\",\"library\":\"torchao\",\"members\":[\"q\",\"q\"],\"version\":\"v\","
       "\"attributes\":{}}",
       "twice"},
      {"{\"class\":\"I\",\"library\":\"torchao\",\"members\":[\"\"],\"version\":\"v\","
       "\"attributes\":{}}",
       "non-empty"},
  };
  for (const auto& [text, why] : bad) {
    try {
      ParseDescription("0.weight", text);
      ADD_FAILURE() << "accepted " << text;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidValue) << text;
      EXPECT_NE(std::string(e.what()).find("group \"0.weight\""), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << e.what();
    }
  }
  std::string depth32 = "1";
  for (int i = 0; i < 32; ++i) depth32 = "[\"list\",[" + depth32 + "]]";
  EXPECT_NO_THROW(ParseDescription("w", head + "{\"a\":" + depth32 + "}}"));
}

TEST(TorchaoSafetensors, QuantizedWeightsBecomeGroups) {
  TempDir dir;
  const std::string path = dir / "model.safetensors";
  WriteLinear(path);
  const importer::Imported in = importer::Import(path);
  ASSERT_EQ(in.entries.size(), 1u);
  const auto& e = in.entries[0];
  ASSERT_EQ(e.groups.size(), 1u);
  const auto& g = e.groups[0];
  EXPECT_EQ(g.name, "0.weight");
  EXPECT_EQ(g.before, 0u);  // where qdata stood
  EXPECT_EQ(g.group.layout, format::SparseLayout::kGroup);
  EXPECT_EQ(g.group.description, kInt8Description);
  EXPECT_EQ(g.group.dtype, DType::kBFloat16);
  EXPECT_EQ(g.group.sizes, (std::vector<int64_t>{4, 8}));
  EXPECT_EQ(g.group.strides, (std::vector<int64_t>{8, 1}));
  ASSERT_EQ(g.group.components.size(), 2u);
  EXPECT_EQ(g.group.components[0].first, ".qdata");
  EXPECT_EQ(g.group.components[0].second.dtype, DType::kInt8);
  EXPECT_EQ(g.group.components[1].first, ".scale");
  EXPECT_EQ(g.group.components[1].second.sizes, (std::vector<int64_t>{4, 1}));
  ASSERT_EQ(e.tensors.size(), 1u);
  EXPECT_EQ(e.tensors[0].name, "0.bias");
  // torchao's own metadata is what the group says: only "format" stays.
  ASSERT_EQ(in.metadata.size(), 1u);
  EXPECT_EQ(in.metadata[0].key, "format");
}

TEST(TorchaoSafetensors, WhatTheTableDoesNotKnowIsRefusedOrKeptPlain) {
  const std::pair<std::string, const char*> cases[] = {
      {"{\"_type\": \"MXTensor\", \"_data\": {}, \"_tensor_data_names\": [\"qdata\"]}",
       "class \"MXTensor\" is not in tsar's table"},
      {"{\"_type\": \"Int8Tensor\", \"_data\": {\"block_size\": [1, 8], \"dtype\": {\"_type\": "
       "\"torch.dtype\", \"_data\": \"bfloat16\"}, \"act_quant_kwargs\": {\"_type\": \"Kwargs\", "
       "\"_data\": {}}}, \"_tensor_data_names\": [\"qdata\", \"scale\"]}",
       "\"Kwargs\" is not an enum or record"},
      {"{\"_type\": \"Int8Tensor\", \"_data\": {\"block_size\": [1, 8]}, "
       "\"_tensor_data_names\": [\"qdata\", \"scale\"]}",
       "lacks \"dtype\""},
      {"{\"_type\": \"Int8Tensor\", \"_data\": {\"block_size\": [1, 8], \"dtype\": null}, "
       "\"_tensor_data_names\": [\"qdata\", \"zero_point\", \"scale\"]}",
       "expected a tensor \"0._weight_zero_point\""},
      {"{\"_type\": \"Int8Tensor\", \"_data\": {}, \"_tensor_data_names\": [\"qdata\"]}",
       "lacks \"scale\""},
      {"not json", "not JSON"},
  };
  for (const auto& [meta, why] : cases) {
    TempDir dir;
    const std::string path = dir / "model.safetensors";
    WriteLinear(path, meta);
    importer::ImportOptions strict;
    strict.strict = true;
    try {
      importer::Import(path, strict);
      ADD_FAILURE() << "accepted " << meta;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kBadInput);
      const std::string what = e.what();
      EXPECT_NE(what.find(path), std::string::npos) << what;
      EXPECT_NE(what.find("tensor \"0.weight\""), std::string::npos) << what;
      EXPECT_NE(what.find(why), std::string::npos) << what;
    }
    const importer::Imported in = importer::Import(path);
    EXPECT_TRUE(in.entries[0].groups.empty());
    EXPECT_EQ(in.entries[0].tensors.size(), 3u);  // every piece, plain
    EXPECT_EQ(in.metadata.size(), 4u);            // kept
    ASSERT_EQ(in.skipped.size(), 1u);
    EXPECT_NE(in.skipped[0].find(why), std::string::npos) << in.skipped[0];
  }
}

TEST(TorchaoSafetensors, AnInnerTensorIsNoOtherTensor) {
  TempDir dir;
  const std::string path = dir / "model.safetensors";
  WriteSafetensors(path,
                   {{"0._weight_qdata", "I8", {4, 8}, Bytes(32, 1)},
                    {"0._weight_scale", "F32", {4, 1}, Bytes(16, 2)}},
                   {{"tensor_names", "[\"0.weight\", \"0._weight_scale\"]"},
                    {"0.weight", kInt8Meta},
                    {"0._weight_scale", "{\"_type\": \"Tensor\"}"}});
  importer::ImportOptions strict;
  strict.strict = true;
  try {
    importer::Import(path, strict);
    ADD_FAILURE() << "one tensor in two places";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("a plain tensor of \"tensor_names\" too"),
              std::string::npos)
        << e.what();
  }
  EXPECT_TRUE(importer::Import(path).entries[0].groups.empty());
}

TEST(TorchaoSafetensors, PlainFilesAndPlainTorchaoFilesAreUnchanged) {
  TempDir dir;
  const std::string path = dir / "model.safetensors";
  WriteSafetensors(path, {{"0.bias", "BF16", {4}, Bytes(8, 3)}},
                   {{"tensor_names", "[\"0.bias\"]"}, {"0.bias", "{\"_type\": \"Tensor\"}"}});
  const importer::Imported in = importer::Import(path);
  EXPECT_TRUE(in.entries[0].groups.empty());
  EXPECT_EQ(in.metadata.size(), 2u);
  EXPECT_TRUE(in.skipped.empty());
}

TEST(TorchaoSafetensors, PackAndExportGiveTorchaosLayoutBack) {
  TempDir dir;
  const std::string src = dir / "model.safetensors";
  WriteLinear(src);
  const std::string archive = dir / "m.tsar";
  PackFiles({{"", src}}, archive, {});
  const ArchiveFile a = ArchiveFile::open(archive);
  const std::vector<GroupInfo> groups = a.groups();
  ASSERT_EQ(groups.size(), 1u);
  EXPECT_EQ(groups[0].name, "0.weight");
  EXPECT_EQ(groups[0].members,
            (std::vector<std::string>{"0.weight.qdata", "0.weight.scale"}));
  EXPECT_EQ(groups[0].description, kInt8Description);
  EXPECT_EQ(a.names(), (std::vector<std::string>{"0.weight", "0.bias"}));

  const std::string out = dir / "out.safetensors";
  exporter::Export(a, out, exporter::Format::kSafetensors);
  nlohmann::json h = Header(out);
  const nlohmann::json meta = h["__metadata__"];
  // torchao's own text, in torchao's key order (the optional tensors first).
  EXPECT_EQ(meta["0.weight"],
            "{\"_type\": \"Int8Tensor\", \"_data\": {\"act_quant_kwargs\": null, "
            "\"reduce_range\": false, \"block_size\": [1, 8], \"dtype\": {\"_type\": "
            "\"torch.dtype\", \"_data\": \"bfloat16\"}}, \"_tensor_data_names\": [\"qdata\", "
            "\"scale\"]}");
  EXPECT_EQ(meta["0.bias"], "{\"_type\": \"Tensor\"}");
  EXPECT_EQ(meta["tensor_names"], "[\"0.weight\", \"0.bias\"]");
  EXPECT_EQ(meta["format"], "pt");
  EXPECT_EQ(h["0._weight_qdata"]["dtype"], "I8");
  EXPECT_EQ(h["0._weight_scale"]["shape"], nlohmann::json({4, 1}));
  EXPECT_EQ(h["0.bias"]["dtype"], "BF16");
  EXPECT_EQ(h.size(), 4u);
  // The bytes are the input's, each tensor's at its place.
  const std::string in_bytes = ReadAll(src), out_bytes = ReadAll(out);
  const nlohmann::json hin = Header(src);
  const uint64_t in_start = 8 + format::LoadU64(reinterpret_cast<const uint8_t*>(in_bytes.data()));
  const uint64_t out_start =
      8 + format::LoadU64(reinterpret_cast<const uint8_t*>(out_bytes.data()));
  for (const char* k : {"0._weight_qdata", "0._weight_scale", "0.bias"}) {
    const auto io = hin[k]["data_offsets"], oo = h[k]["data_offsets"];
    EXPECT_EQ(in_bytes.substr(in_start + io[0].get<uint64_t>(),
                              io[1].get<uint64_t>() - io[0].get<uint64_t>()),
              out_bytes.substr(out_start + oo[0].get<uint64_t>(),
                               oo[1].get<uint64_t>() - oo[0].get<uint64_t>()))
        << k;
  }
  // Packed again: the same group.
  const std::string again = dir / "again.tsar";
  PackFiles({{"", out}}, again, {});
  const auto back = ArchiveFile::open(again).groups();
  ASSERT_EQ(back.size(), 1u);
  EXPECT_EQ(back[0].description, kInt8Description);

  // HDF5 has no way to say it (.pt: tests/python/test_torchao_transformers.py).
  try {
    exporter::Export(a, dir / "out.h5", exporter::Format::kHdf5);
    ADD_FAILURE() << "exported groups";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported);
    EXPECT_NE(std::string(e.what()).find("\"0.weight\""), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(".safetensors"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace tsar::torchao
