// Tests of writer/pickle: torch.save fixtures made by make_pickle_fixtures.py
// (directory in $TSAR_PICKLE_FIXTURES) plus hand-written hostile pickles.
#include "writer/pickle.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "tsar/error.h"

namespace tsar::pickle {
namespace {

using Bytes = std::vector<uint8_t>;
using Kind = Value::Kind;
using namespace std::string_literals;

Bytes ToBytes(const std::string& s) { return Bytes(s.begin(), s.end()); }

Result ParseBytes(const Bytes& b) { return Parse(b.data(), b.size(), "test.pkl"); }

// Runs Parse and returns the tsar::Error it must throw.
Error ParseError(const Bytes& b) {
  try {
    ParseBytes(b);
  } catch (const Error& e) {
    return e;
  }
  ADD_FAILURE() << "Parse did not throw";
  return Error(ErrorCode::kIo, "", std::nullopt, "no error");
}

void ExpectError(const Bytes& b, ErrorCode code, std::optional<uint64_t> offset,
                 const std::string& substring) {
  Error e = ParseError(b);
  EXPECT_EQ(e.code(), code) << e.what();
  if (offset) {
    EXPECT_EQ(e.offset(), offset) << e.what();
  }
  EXPECT_NE(std::string(e.what()).find(substring), std::string::npos) << e.what();
}

// Parse must either succeed or throw tsar::Error; anything else fails the test.
void ParseOrError(const Bytes& b) {
  try {
    ParseBytes(b);
  } catch (const Error&) {
  } catch (const std::exception& e) {
    ADD_FAILURE() << "non-tsar exception: " << e.what();
  }
}

std::string FixtureDir() {
  const char* dir = std::getenv("TSAR_PICKLE_FIXTURES");
  return dir ? dir : "";
}

Bytes ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in) << "cannot open " << path;
  return Bytes(std::istreambuf_iterator<char>(in), {});
}

#define TSAR_REQUIRE_FIXTURES()                                                      \
  if (FixtureDir().empty()) {                                                        \
    GTEST_SKIP() << "TSAR_PICKLE_FIXTURES is not set (run make_pickle_fixtures.py)"; \
  }

Bytes Fixture(const std::string& name) { return ReadFile(FixtureDir() + "/" + name + ".data.pkl"); }

// Tensors in pickling order (depth first, dict insertion order) with dotted paths.
void Flatten(const Value& v, const std::string& prefix,
             std::vector<std::pair<std::string, const Value*>>* out) {
  const auto join = [&](const std::string& k) { return prefix.empty() ? k : prefix + "." + k; };
  if (v.kind == Kind::kTensor) out->emplace_back(prefix, &v);
  for (size_t k = 0; k < v.items.size(); ++k) {
    Flatten(v.items[k], join(v.kind == Kind::kDict ? v.keys[k] : std::to_string(k)), out);
  }
}

std::map<std::string, const TensorRef*> TensorsByPath(const Result& r) {
  std::vector<std::pair<std::string, const Value*>> flat;
  Flatten(r.root, "", &flat);
  std::map<std::string, const TensorRef*> out;
  for (auto& [path, v] : flat) out[path] = &v->tensor;
  return out;
}

class FixtureTest : public testing::TestWithParam<const char*> {};

// Every tensor fact Python computed from the real tensors matches the parse.
TEST_P(FixtureTest, MatchesExpectedJson) {
  TSAR_REQUIRE_FIXTURES();
  const std::string name = GetParam();
  Result r = ParseBytes(Fixture(name));
  Bytes json_bytes = ReadFile(FixtureDir() + "/" + name + ".expected.json");
  nlohmann::json expected = nlohmann::json::parse(json_bytes.begin(), json_bytes.end());

  std::vector<std::pair<std::string, const Value*>> flat;
  Flatten(r.root, "", &flat);
  const auto& tensors = expected.at("tensors");
  ASSERT_EQ(flat.size(), tensors.size());
  std::map<std::string, uint32_t> storage_of_key;
  for (size_t n = 0; n < flat.size(); ++n) {
    const nlohmann::json& e = tensors[n];
    const TensorRef& t = flat[n].second->tensor;
    SCOPED_TRACE(e.at("path").get<std::string>());
    EXPECT_EQ(flat[n].first, e.at("path").get<std::string>());
    ASSERT_LT(t.storage, r.storages.size());
    const StorageRef& s = r.storages[t.storage];
    EXPECT_EQ(s.dtype, e.at("dtype").get<std::string>());
    EXPECT_EQ(s.key, e.at("storage_key").get<std::string>());
    EXPECT_EQ(s.numel, e.at("storage_numel").get<uint64_t>());
    EXPECT_EQ(s.location, e.at("location").get<std::string>());
    EXPECT_EQ(t.sizes, e.at("sizes").get<std::vector<int64_t>>());
    EXPECT_EQ(t.strides, e.at("strides").get<std::vector<int64_t>>());
    EXPECT_EQ(t.storage_offset, e.at("storage_offset").get<uint64_t>());
    EXPECT_EQ(t.requires_grad, e.at("requires_grad").get<bool>());
    EXPECT_EQ(t.is_parameter, e.at("is_parameter").get<bool>());
    // Same key <=> same StorageRef index (storages are deduplicated by key).
    auto [it, inserted] = storage_of_key.emplace(s.key, t.storage);
    EXPECT_EQ(it->second, t.storage);
  }
  EXPECT_EQ(storage_of_key.size(), r.storages.size());
}

INSTANTIATE_TEST_SUITE_P(Pickle, FixtureTest,
                         testing::Values("resnet_sd", "tied", "plain_one", "nested", "dtypes",
                                         "params", "proto4"));

TEST(PickleFixtures, TiedAndViewTensorsShareOneStorage) {
  TSAR_REQUIRE_FIXTURES();
  Result r = ParseBytes(Fixture("tied"));
  auto t = TensorsByPath(r);
  ASSERT_EQ(t.size(), 5u);
  EXPECT_EQ(t["head.weight"]->storage, t["emb.weight"]->storage);
  EXPECT_EQ(t["part"]->storage, t["full"]->storage);
  EXPECT_EQ(t["tr"]->storage, t["full"]->storage);
  EXPECT_NE(t["full"]->storage, t["emb.weight"]->storage);
  EXPECT_EQ(r.storages.size(), 2u);
  EXPECT_EQ(t["part"]->storage_offset, 4u);
  EXPECT_EQ(t["tr"]->strides, (std::vector<int64_t>{1, 4}));
}

TEST(PickleFixtures, ResnetStateDictKeepsMetadata) {
  TSAR_REQUIRE_FIXTURES();
  Result r = ParseBytes(Fixture("resnet_sd"));
  ASSERT_EQ(r.root.kind, Kind::kDict);
  const Value* meta = r.root.Attribute("_metadata");
  ASSERT_NE(meta, nullptr);
  ASSERT_EQ(meta->kind, Kind::kDict);
  ASSERT_NE(meta->Find(""), nullptr);
  const Value* bn = meta->Find("bn1");      // torchvision's resnet18; BatchNorm is version 2
  if (bn == nullptr) bn = meta->Find("1");  // the nn.Sequential stand-in
  ASSERT_NE(bn, nullptr);
  const Value* version = bn->Find("version");
  ASSERT_NE(version, nullptr);
  EXPECT_EQ(version->kind, Kind::kInt);
  EXPECT_EQ(version->i, 2);
  EXPECT_EQ(r.root.keys.size(), TensorsByPath(r).size());
}

TEST(PickleFixtures, NestedCheckpointScalars) {
  TSAR_REQUIRE_FIXTURES();
  Result r = ParseBytes(Fixture("nested"));
  ASSERT_EQ(r.root.kind, Kind::kDict);
  EXPECT_EQ(r.root.keys, (std::vector<std::string>{"model", "ema", "step", "lr", "name", "flag"}));
  const Value* step = r.root.Find("step");
  const Value* lr = r.root.Find("lr");
  const Value* name = r.root.Find("name");
  const Value* flag = r.root.Find("flag");
  ASSERT_TRUE(step && lr && name && flag);
  EXPECT_EQ(step->kind, Kind::kInt);
  EXPECT_EQ(step->i, 10);
  EXPECT_EQ(lr->kind, Kind::kFloat);
  EXPECT_EQ(lr->f, 0.5);
  EXPECT_EQ(name->kind, Kind::kString);
  EXPECT_EQ(name->str, "run1");
  EXPECT_EQ(flag->kind, Kind::kBool);
  EXPECT_TRUE(flag->b);
  for (const char* sd : {"model", "ema"}) {
    ASSERT_NE(r.root.Find(sd), nullptr);
    EXPECT_NE(r.root.Find(sd)->Attribute("_metadata"), nullptr) << sd;
  }
}

TEST(PickleFixtures, EvilGlobalIsKeptAsAnOpaqueFragmentNeverResolved) {
  TSAR_REQUIRE_FIXTURES();
  const Bytes b = Fixture("evil");
  const Result r = Parse(b.data(), b.size(), "evil/data.pkl");
  // os.system("echo pwned") as the opcodes that would call it; never called.
  ASSERT_EQ(r.root.kind, Kind::kOpaque);
  EXPECT_TRUE(r.root.str == "posix.system" || r.root.str == "os.system") << r.root.str;
  ASSERT_EQ(r.root.segments.size(), 1u);
  EXPECT_EQ(r.root.segments[0].rfind("c" + r.root.str.substr(0, r.root.str.find('.')) + "\n", 0),
            0u);
  EXPECT_TRUE(r.root.items.empty());
}

TEST(PickleFixtures, EveryTruncationFails) {
  TSAR_REQUIRE_FIXTURES();
  for (const char* name : {"tied", "params", "dtypes", "proto4"}) {
    Bytes b = Fixture(name);
    ASSERT_FALSE(b.empty());
    for (size_t n = 0; n < b.size(); ++n) {
      Bytes cut(b.begin(), b.begin() + n);
      try {
        ParseBytes(cut);
        ADD_FAILURE() << name << " truncated to " << n << " bytes parsed";
      } catch (const Error& e) {
        EXPECT_EQ(e.code(), ErrorCode::kBadInput) << e.what();
      }
    }
  }
}

TEST(PickleFixtures, RandomCorruptionNeverCrashes) {
  TSAR_REQUIRE_FIXTURES();
  std::mt19937 rng(20240611);
  for (const char* name : {"resnet_sd", "tied", "nested", "dtypes", "params", "proto4"}) {
    const Bytes original = Fixture(name);
    ASSERT_FALSE(original.empty());
    for (int round = 0; round < 1500; ++round) {
      Bytes b = original;
      int flips = 1 + static_cast<int>(rng() % 4);
      for (int k = 0; k < flips; ++k) {
        size_t at = rng() % b.size();
        b[at] = (rng() % 2) ? static_cast<uint8_t>(rng()) : b[at] ^ (1u << (rng() % 8));
      }
      ParseOrError(b);
    }
    // Every single-bit flip of the small fixtures, too.
    if (original.size() <= 2048) {
      for (size_t at = 0; at < original.size(); ++at) {
        for (int bit = 0; bit < 8; ++bit) {
          Bytes b = original;
          b[at] ^= static_cast<uint8_t>(1u << bit);
          ParseOrError(b);
        }
      }
    }
  }
}

// ---- Hand-written pickles: no fixtures needed. ----

// A protocol-2 persistent id ('storage', torch.FloatStorage, key, 'cpu', numel).
std::string PersId(const std::string& type, const std::string& key, uint8_t numel) {
  return "((X\x07\x00\x00\x00storagec"
         "torch\n"s +
         type + "\nX"s + std::string(1, char(key.size())) + std::string(3, '\0') + key +
         "X\x03\x00\x00\x00"
         "cpuK"s +
         std::string(1, char(numel)) + "tQ"s;
}
// _rebuild_tensor_v2(storage, offset, (size,), (1,), False, OrderedDict()).
std::string Tensor1d(const std::string& type, const std::string& key, uint8_t numel, uint8_t offset,
                     uint8_t size) {
  return "ctorch._utils\n_rebuild_tensor_v2\n"s + PersId(type, key, numel) + "K"s +
         std::string(1, char(offset)) + "K"s + std::string(1, char(size)) + "\x85K\x01\x85\x89"s +
         "ccollections\nOrderedDict\n)Rt"s + "R"s;
}
Bytes Proto2(const std::string& body) { return ToBytes("\x80\x02"s + body + "."s); }

TEST(PickleHandmade, MinimalTensorDict) {
  Result r =
      ParseBytes(Proto2("}X\x01\x00\x00\x00w"s + Tensor1d("HalfStorage"s, "7"s, 10, 2, 8) + "s"s));
  ASSERT_EQ(r.root.kind, Kind::kDict);
  ASSERT_EQ(r.root.keys, std::vector<std::string>{"w"s});
  const TensorRef& t = r.root.items[0].tensor;
  EXPECT_EQ(t.sizes, std::vector<int64_t>{8});
  EXPECT_EQ(t.storage_offset, 2u);
  ASSERT_EQ(r.storages.size(), 1u);
  EXPECT_EQ(r.storages[0].dtype, "float16"s);
  EXPECT_EQ(r.storages[0].key, "7"s);
}

TEST(PickleHandmade, TensorPastStorageEndIsRejected) {
  ExpectError(Proto2(Tensor1d("FloatStorage"s, "0"s, 10, 3, 8)), ErrorCode::kBadInput, std::nullopt,
              "found element 10"s);
}

TEST(PickleHandmade, SameKeyWithTwoDtypesIsRejected) {
  ExpectError(Proto2("("s + Tensor1d("FloatStorage"s, "0"s, 4, 0, 4) +
                     Tensor1d("LongStorage"s, "0"s, 4, 0, 4) + "t"s),
              ErrorCode::kBadInput, std::nullopt, "same dtype"s);
}

TEST(PickleHandmade, OtherGlobalsAreKeptByNameAndTheirCallsAsOpcodes) {
  auto opaque = [](const std::string& pkl) {
    const Bytes b = ToBytes(pkl);
    return Parse(b.data(), b.size(), "t/data.pkl").root;
  };
  Value v = opaque(
      "\x80\x02"
      "cbuiltins\neval\n."s);
  EXPECT_EQ(v.kind, Kind::kOpaque);
  EXPECT_EQ(v.str, "builtins.eval");
  EXPECT_EQ(v.segments, std::vector<std::string>{"cbuiltins\neval\n"s});
  // STACK_GLOBAL and a REDUCE: written back as GLOBAL, the args, REDUCE.
  v = opaque("\x80\x04\x8c\x02os\x8c\x06system\x93\x8c\x02hi\x85R."s);
  EXPECT_EQ(v.str, "os.system");
  EXPECT_EQ(v.segments, std::vector<std::string>{"cos\nsystem\n(X\x02\x00\x00\x00hitR"s});
  // A global with a newline in its name could not be written back as GLOBAL.
  ExpectError(ToBytes("\x80\x04\x8c\x03o\ns\x8c\x01x\x93."s), ErrorCode::kBadInput, 10,
              "without newlines"s);
  // Interpreted names still cannot be called for anything they are not.
  ExpectError(Proto2("ctorch\nFloatStorage\n)R"s), ErrorCode::kBadInput, 23, "cannot be called"s);
  // A persistent id whose type is a global tsar does not interpret (found by
  // UBSan: the type's allow-list index, -1, was used).
  ExpectError(ToBytes("\x80\x02(X\x07\x00\x00\x00"
                      "storage"
                      "cos\nsystem\nX\x01\x00\x00\x00"
                      "aX\x03\x00\x00\x00"
                      "cpuK\x01tQ."s),
              ErrorCode::kBadInput, 43, "expected a torch storage class"s);
  // A storage outside a tensor (a quantized tensor's rebuild) is not supported.
  ExpectError(ToBytes("\x80\x02"
                      "ctorch._utils\n_rebuild_qtensor\n(X\x07\x00\x00\x00"
                      "storage"
                      "ctorch\nFloatStorage\nX\x01\x00\x00\x00"
                      "aX\x03\x00\x00\x00"
                      "cpuK\x01tQ\x85R."s),
              ErrorCode::kUnsupported, std::nullopt, "a storage used outside a plain tensor"s);
}

TEST(PickleHandmade, UnknownOpcodeNamesItsOffset) {
  ExpectError(ToBytes("\x80\x02}\xff."s), ErrorCode::kBadInput, 3, "unknown opcode 0xff"s);
  ExpectError(ToBytes("\x80\x02}I1\n."s), ErrorCode::kBadInput, 3, "unknown opcode 0x49"s);
}

TEST(PickleHandmade, HostileLengthsAndIndices) {
  ExpectError(ToBytes("\x80\x02X\xff\xff\xff\xff"
                      "abc."s),
              ErrorCode::kBadInput, 2, "truncated"s);
  ExpectError(ToBytes("\x80\x02\x8e\xff\xff\xff\xff\xff\xff\xff\xff."s), ErrorCode::kBadInput, 2,
              "truncated"s);
  ExpectError(ToBytes("\x80\x02j\xff\xff\xff\x7f."s), ErrorCode::kBadInput, 2, "never stored"s);
  {  // 2^64 is a bigint, kept as its shortest two's complement; -1 in 9 bytes an int.
    Bytes b = ToBytes("\x80\x02\x8a\x0a\x00\x00\x00\x00\x00\x00\x00\x00\x01\x00."s);
    Result r = Parse(b.data(), b.size(), "t");
    EXPECT_EQ(r.root.kind, Kind::kBigInt);
    EXPECT_EQ(r.root.str, "\x00\x00\x00\x00\x00\x00\x00\x00\x01"s);
    b = ToBytes("\x80\x02\x8a\x09\xff\xff\xff\xff\xff\xff\xff\xff\xff."s);
    r = Parse(b.data(), b.size(), "t");
    EXPECT_EQ(r.root.kind, Kind::kInt);
    EXPECT_EQ(r.root.i, -1);
  }
  ExpectError(ToBytes("\x80\x02X\x02\x00\x00\x00\xc3(."s), ErrorCode::kBadInput, 2, "UTF-8"s);
  ExpectError(ToBytes("\x80\x02"
                      "a."s),
              ErrorCode::kBadInput, 2, "underflow"s);
  ExpectError(ToBytes("\x80\x02(N."s), ErrorCode::kBadInput, 4, "no open MARK"s);
  ExpectError(ToBytes("\x80\x02N.N"s), ErrorCode::kBadInput, 3, "end of data"s);
  ExpectError(ToBytes(""s), ErrorCode::kBadInput, 0, "no STOP"s);
  ExpectError(ToBytes("\x80\x02}]X\x00\x00\x00\x00s."s), ErrorCode::kBadInput, 9, "dict key"s);
}

TEST(PickleHandmade, MemoKeysAnywhereInU32AndMemoizeCountsKeys) {
  // A key far ahead (LONG_BINPUT 4000000000), one that the dense part later
  // grows past (5000), an overwrite (key 1 twice), then MEMOIZE, whose key is
  // len(memo): four distinct keys so far, so it stores under 4.
  Result r =
      ParseBytes(Proto2("K\x0a"
                        "r\x00\x28\x6b\xee"
                        "0"  // memo[4000000000] = 10
                        "K\x0b"
                        "r\x88\x13\x00\x00"
                        "0"  // memo[5000] = 11
                        "K\x0c"
                        "q\x01"
                        "0"  // memo[1] = 12
                        "K\x0d"
                        "q\x01"
                        "0"  // memo[1] = 13
                        "K\x0e"
                        "q\x00"
                        "0"  // memo[0] = 14
                        "K\x0f"
                        "\x94"
                        "0"  // MEMOIZE: memo[4] = 15
                        "(j\x00\x28\x6b\xee"
                        "j\x88\x13\x00\x00"
                        "h\x01"
                        "h\x00"
                        "h\x04"
                        "l"s));
  ASSERT_EQ(r.root.kind, Kind::kList);
  std::vector<int64_t> got;
  for (const auto& v : r.root.items) got.push_back(v.i);
  EXPECT_EQ(got, (std::vector<int64_t>{10, 11, 13, 14, 15}));
  // Dense keys past 5000 now cover it: the sparse entry stays readable.
  std::string body;
  for (int k = 0; k < 6000; ++k) {
    body += "K\x01r"s;
    for (int b = 0; b < 4; ++b) body += char((k >> (8 * b)) & 0xff);
    body += "0"s;
  }
  r =
      ParseBytes(Proto2("K\x07r\x88\x13\x00\x00"
                        "0"s +
                        body + "j\x88\x13\x00\x00"s));
  EXPECT_EQ(r.root.i, 1);  // overwritten by the dense run
  ExpectError(Proto2("K\x01r\x00\x00\x00\x80"
                     "0j\x01\x00\x00\x80"s),
              ErrorCode::kBadInput, std::nullopt, "memo key 2147483649 was never stored"s);
}

TEST(PickleHandmade, CyclesAndSharingBlowUpAreBounded) {
  // l = []; l.append(l)
  ExpectError(ToBytes("\x80\x02]q\x00h\x00"
                      "a."s),
              ErrorCode::kBadInput, std::nullopt, "cycle"s);
  // t0 = (); t(k+1) = (tk, tk) for 60 levels: 2^60 nodes once copied into a tree.
  std::string body = ")q\x00"s;
  for (int k = 0; k < 60; ++k) {
    body += "0h"s + std::string(1, char(k)) + "h"s + std::string(1, char(k)) + "\x86q"s +
            std::string(1, char(k + 1));
  }
  ExpectError(Proto2(body), ErrorCode::kBadInput, std::nullopt, "shared too often"s);
  // 100000 nested lists exceed the depth cap without recursing in the VM.
  std::string deep;
  for (int k = 0; k < 100000; ++k) deep += "]"s;
  for (int k = 0; k < 99999; ++k) deep += "a"s;
  ExpectError(Proto2(deep), ErrorCode::kBadInput, std::nullopt, "levels"s);
}

TEST(PickleHandmade, ProtocolTwoBytesIntKeysAndOverwrites) {
  // {5: b'\x00\xff', 'a': 1, 'a': 2, 'e': bytes(), 'h': b'hi'}: protocol 2 spells
  // bytes as _codecs.encode(u, 'latin1') and the empty one as __builtin__.bytes().
  Result r = ParseBytes(
      Proto2("}(K\x05"
             "c_codecs\nencode\nX\x03\x00\x00\x00\x00\xc3\xbfX\x06\x00\x00\x00latin1\x86R"
             "X\x01\x00\x00\x00"
             "aK\x01X\x01\x00\x00\x00"
             "aK\x02"
             "X\x01\x00\x00\x00"
             "ec__builtin__\nbytes\n)R"
             "X\x01\x00\x00\x00"
             "hC\x02hiu"s));
  ASSERT_EQ(r.root.kind, Kind::kDict);
  ASSERT_EQ(r.root.keys, (std::vector<std::string>{"5"s, "a"s, "e"s, "h"s}));
  EXPECT_EQ(r.root.items[0].kind, Kind::kBytes);
  EXPECT_EQ(r.root.items[0].str, "\x00\xff"s);
  EXPECT_EQ(r.root.items[1].i, 2);  // the last value, at the first position
  EXPECT_EQ(r.root.items[2].kind, Kind::kBytes);
  EXPECT_EQ(r.root.items[2].str, ""s);
  EXPECT_EQ(r.root.items[3].str, "hi"s);
}

}  // namespace
}  // namespace tsar::pickle
