// Tests of writer/pickle_torchao.cc: torchao's quantized tensors, in pickles
// written here as torch.save writes them (torchao 0.18, torch 2.15; see the
// grammar at the top of writer/pickle_torchao.cc), read as tensor groups
// through writer/torchao_table.h; what the table does not hold stays an
// opaque value, with the reason. tests/python/test_torchao_pack.py packs
// real torch.save files and compares with tsar.save.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "tsar/error.h"
#include "writer/pickle.h"

namespace tsar::pickle {
namespace {

using Kind = Value::Kind;
using namespace std::string_literals;

// Writes a protocol-2 pickle in order, into `out`. Each object named by a
// key is written once and memoized; later uses are BINGETs, as pickle does
// (so a second weight reuses the classes, dtypes, functions, layout, device,
// enum members and records of the first). With memo off, every use is
// written out.
struct Pk {
  using Body = std::function<void()>;
  bool memo = true;
  std::map<std::string, int> memo_index;
  std::string out;

  Pk& Raw(const std::string& bytes) {
    out += bytes;
    return *this;
  }
  // `body` (one object) the first time, BINGET of it afterwards.
  Pk& M(const std::string& key, const Body& body) {
    if (!memo) {
      body();
      return *this;
    }
    auto it = memo_index.find(key);
    if (it != memo_index.end()) return Raw("h"s + char(it->second));
    body();
    const int n = static_cast<int>(memo_index.size());
    memo_index[key] = n;
    return Raw("q"s + char(n));
  }
  Pk& G(const std::string& module, const std::string& name) {
    return M("G" + module + "." + name, [&] { Raw("c" + module + "\n" + name + "\n"); });
  }
  static std::string Str(const std::string& s) {
    std::string n(4, '\0');
    for (int b = 0; b < 4; ++b) n[b] = static_cast<char>((s.size() >> (8 * b)) & 0xff);
    return "X" + n + s;
  }
  Pk& S(const std::string& s) { return Raw(Str(s)); }
  Pk& Key(const std::string& s) {
    return M("S" + s, [&] { S(s); });
  }
  static std::string Int(int64_t v) {
    if (v >= 0 && v < 256) return "K"s + char(v);
    std::string out = "J";
    for (int b = 0; b < 4; ++b)
      out += static_cast<char>((static_cast<uint32_t>(v) >> (8 * b)) & 0xff);
    return out;
  }
  Pk& I(int64_t v) { return Raw(Int(v)); }
  Pk& F(double v) {  // BINFLOAT, big-endian
    uint64_t bits;
    std::memcpy(&bits, &v, 8);
    std::string f = "G";
    for (int b = 7; b >= 0; --b) f += static_cast<char>((bits >> (8 * b)) & 0xff);
    return Raw(f);
  }
  Pk& Ints(const std::vector<int64_t>& v) {
    Raw("(");
    for (int64_t x : v) I(x);
    return Raw("t");
  }
  Pk& Hooks() { return G("collections", "OrderedDict").Raw(")R"); }
  // _rebuild_tensor_v2 over storage `key` of `storage_type` (numel elements).
  Pk& Tensor(const std::string& key, const std::string& storage_type, int64_t numel,
             const std::vector<int64_t>& sizes, const std::vector<int64_t>& strides) {
    G("torch._utils", "_rebuild_tensor_v2").Raw("((").Key("storage").G("torch", storage_type);
    S(key).Key("cpu").I(numel).Raw("tQ").I(0).Ints(sizes).Ints(strides).Raw("\x89").Hooks();
    return Raw("tR");
  }
  // _rebuild_tensor_v3 (an UntypedStorage of bytes, then the dtype).
  Pk& TensorV3(const std::string& key, int64_t nbytes, const std::string& dtype,
               const std::vector<int64_t>& sizes, const std::vector<int64_t>& strides) {
    G("torch._utils", "_rebuild_tensor_v3").Raw("((").Key("storage");
    G("torch.storage", "UntypedStorage").S(key).Key("cpu").I(nbytes).Raw("tQ").I(0);
    Ints(sizes).Ints(strides).Raw("\x89").Hooks().G("torch", dtype);
    return Raw("tR");
  }
  Pk& Enum(const std::string& builtins, const std::string& module, const std::string& cls,
           const std::string& member) {
    return M("E" + cls + "." + member,
             [&] { G(builtins, "getattr").G(module, cls).Key(member).Raw("\x86R"); });
  }
  // A torchao tensor: _rebuild_from_type_v2(_rebuild_wrapper_subclass, cls,
  // (cls, dtype, sizes, strides, 0, layout, device, False), state), where
  // `state` writes the key/value pairs of its __dict__.
  Pk& Wrapper(const std::string& module, const std::string& cls, const std::string& dtype,
              const std::vector<int64_t>& sizes, const std::vector<int64_t>& strides,
              const Body& state) {
    G("torch._tensor", "_rebuild_from_type_v2").Raw("(");
    G("torch._utils", "_rebuild_wrapper_subclass").G(module, cls).Raw("(");
    G(module, cls).G("torch", dtype).Ints(sizes).Ints(strides).I(0);
    M("layout", [&] { G("torch.serialization", "_get_layout").S("torch.strided").Raw("\x85R"); });
    M("device", [&] { G("torch", "device").S("cpu").Raw("\x85R"); });
    Raw("\x89t}(");
    state();
    return Raw("utR");
  }
  Pk& PerRow() {
    return M("PerRow", [&] {
      G("torchao.quantization.granularity", "PerRow").Raw(")\x81}").Key("dim").I(-1).Raw("sb");
    });
  }
  // An Int8Tensor of an nn.Linear(8, 4) quantized per row, storages
  // <prefix>0..2; with act_quant_kwargs (Int8DynamicActivationInt8WeightConfig)
  // or None (Int8WeightOnlyConfig).
  Pk& Int8(const std::string& prefix, const std::string& dtype, bool dynamic,
           const std::string& builtins = "__builtin__") {
    return Wrapper("torchao.quantization", "Int8Tensor", dtype, {4, 8}, {8, 1}, [&] {
      Key("qdata").Tensor(prefix + "0", "CharStorage", 32, {4, 8}, {8, 1});
      Key("scale").Tensor(prefix + "1", "FloatStorage", 4, {4, 1}, {1, 1});
      Key("block_size").Raw("](").I(1).I(8).Raw("e");
      Key("zero_point").Tensor(prefix + "2", "CharStorage", 4, {4, 1}, {1, 1});
      Key("act_quant_kwargs");
      if (dynamic) {
        G("torchao.quantization.quantize_.workflows.int8.int8_tensor", "QuantizeTensorToInt8Kwargs")
            .Raw(")\x81}(");
        Key("granularity").PerRow().Key("mapping_type");
        Enum(builtins, "torchao.quantization.quant_primitives", "MappingType", "SYMMETRIC");
        Key("reduce_range").Raw("\x89ub");
      } else {
        Raw("N");
      }
      Key("act_quant_scale").Raw("N").Key("act_quant_zero_point").Raw("N");
      Key("act_pre_scale").Raw("N").Key("reduce_range").Raw("\x89");
    });
  }
  // collections.OrderedDict() with the items `items` writes.
  Pk& StateDict(const Body& items) {
    G("collections", "OrderedDict").Raw(")R(");
    items();
    return Raw("u");
  }
};

Result ParseText(const std::string& body) {
  const std::string pkl = "\x80\x02"s + body + ".";
  return Parse(reinterpret_cast<const uint8_t*>(pkl.data()), pkl.size(), "t/data.pkl");
}

const std::string kInt8WeightOnly =
    R"({"attributes":{"act_quant_kwargs":null,"block_size":["list",[1,8]],"dtype":["dtype","bfloat16"],)"
    R"("reduce_range":false},"class":"Int8Tensor","library":"torchao",)"
    R"("members":["qdata","scale","zero_point"],"version":"unknown"})";

TEST(PickleTorchao, Int8TensorIsAGroupWithPythonsDescription) {
  Pk p;
  p.StateDict([&] {
    p.S("0.weight").Int8("w", "bfloat16", false);
    p.S("0.bias").Tensor("b", "BFloat16Storage", 4, {4}, {1});
  });
  Result r = ParseText(p.out);
  ASSERT_EQ(r.root.kind, Kind::kDict);
  const Value& w = r.root.items[0];
  ASSERT_EQ(w.kind, Kind::kOpaque);
  EXPECT_EQ(w.str, "torch._tensor._rebuild_from_type_v2");
  ASSERT_NE(w.group, nullptr) << w.not_group;
  EXPECT_EQ(w.not_group, "");
  const Group& g = *w.group;
  EXPECT_EQ(g.cls, "Int8Tensor");
  EXPECT_EQ(g.dtype, "bfloat16");
  EXPECT_EQ(g.sizes, (std::vector<int64_t>{4, 8}));
  EXPECT_EQ(g.strides, (std::vector<int64_t>{8, 1}));
  EXPECT_EQ(g.description, kInt8WeightOnly);
  // Members in the class's order (qdata, scale, then the optional
  // zero_point), each the opaque value's item that is its tensor.
  ASSERT_EQ(g.members.size(), 3u);
  const std::vector<std::string> names = {"qdata", "scale", "zero_point"};
  const std::vector<std::string> keys = {"w0", "w1", "w2"};
  for (size_t k = 0; k < 3; ++k) {
    EXPECT_EQ(g.members[k].first, names[k]);
    const Value& t = w.items.at(g.members[k].second);
    ASSERT_EQ(t.kind, Kind::kTensor);
    EXPECT_EQ(r.storages[t.tensor.storage].key, keys[k]);
  }
  EXPECT_EQ(w.items[g.members[1].second].tensor.sizes, (std::vector<int64_t>{4, 1}));
  EXPECT_EQ(r.root.items[1].kind, Kind::kTensor);
}

const std::string kInt8Dynamic =
    R"({"attributes":{"act_quant_kwargs":["record","QuantizeTensorToInt8Kwargs",)"
    R"({"granularity":["record","PerRow",{"dim":-1}],"mapping_type":["enum","MappingType",)"
    R"("SYMMETRIC"],"reduce_range":false}],"block_size":["list",[1,8]],)"
    R"("dtype":["dtype","float32"],"reduce_range":false},"class":"Int8Tensor",)"
    R"("library":"torchao","members":["qdata","scale","zero_point"],"version":"unknown"})";

TEST(PickleTorchao, MemoizedSecondWeightIsAGroupToo) {
  // The second weight BINGETs almost everything of the first: classes,
  // dtype, functions, layout, device, the enum member, the PerRow
  // instance, even dict keys.
  Pk p;
  p.StateDict([&] {
    p.S("0.weight").Int8("a", "float32", true);
    p.S("1.weight").Int8("b", "float32", true);
  });
  EXPECT_GT(p.out.size(), 0u);
  Result r = ParseText(p.out);
  ASSERT_EQ(r.root.items.size(), 2u);
  for (const Value& w : r.root.items) {
    ASSERT_NE(w.group, nullptr) << w.not_group;
    EXPECT_EQ(w.group->description, kInt8Dynamic);
  }
  const Value& second = r.root.items[1];
  EXPECT_EQ(r.storages[second.items[second.group->members[0].second].tensor.storage].key, "b0");
  // "builtins getattr" (the name of protocol 3 and later) is getattr too.
  Pk q;
  q.StateDict([&] { q.S("w").Int8("a", "float32", true, "builtins"); });
  r = ParseText(q.out);
  ASSERT_NE(r.root.items[0].group, nullptr) << r.root.items[0].not_group;
  EXPECT_EQ(r.root.items[0].group->description, kInt8Dynamic);
}

TEST(PickleTorchao, IntxWithInt4TargetAndParameterFlag) {
  // IntxWeightOnlyConfig(weight_dtype=torch.int4, granularity=PerGroup(32)):
  // target_dtype is the global torch.int4 (no tsar code: only a typed
  // value), block_size a tuple; a Parameter's __dict__ adds _is_param.
  Pk p;
  p.StateDict([&] {
    p.S("0.weight");
    p.Wrapper("torchao.quantization", "IntxUnpackedToInt8Tensor", "bfloat16", {4, 64}, {64, 1},
              [&] {
                p.Key("qdata").Tensor("0", "CharStorage", 256, {4, 64}, {64, 1});
                p.Key("scale").Tensor("1", "BFloat16Storage", 8, {4, 2}, {2, 1});
                p.Key("zero_point").Tensor("2", "CharStorage", 8, {4, 2}, {2, 1});
                p.Key("target_dtype").G("torch", "int4");
                p.Key("block_size").Raw("(").I(1).I(32).Raw("t");
                p.Key("activation_quantization").Raw("N").Key("_is_param").Raw("\x88");
              });
  });
  Result r = ParseText(p.out);
  const Value& w = r.root.items[0];
  ASSERT_NE(w.group, nullptr) << w.not_group;
  EXPECT_EQ(w.group->description,
            R"({"attributes":{"activation_quantization":null,"block_size":["tuple",[1,32]],)"
            R"("dtype":["dtype","bfloat16"],"target_dtype":["dtype","int4"]},)"
            R"("class":"IntxUnpackedToInt8Tensor","library":"torchao",)"
            R"("members":["qdata","scale","zero_point"],"version":"unknown"})");
}

TEST(PickleTorchao, Float8WithRecordsNamedTupleFloatAndEnum) {
  // A Float8Tensor over a _rebuild_tensor_v3 float8 tensor, whose
  // act_quant_kwargs hold a dataclass without fields (PerTensor: NEWOBJ, no
  // BUILD), a named tuple (Float8MMConfig: NEWOBJ of its fields), a float
  // (float.hex, exactly) and an enum member. Expected: what tsar/_torchao.py
  // encodes for the same objects.
  const std::string kp = "torchao.quantization.quantize_.common.kernel_preference";
  Pk p;
  p.StateDict([&] {
    p.S("w");
    p.Wrapper("torchao.quantization", "Float8Tensor", "float32", {4, 8}, {8, 1}, [&] {
      p.Key("qdata").TensorV3("0", 32, "float8_e4m3fn", {4, 8}, {8, 1});
      p.Key("scale").Tensor("1", "FloatStorage", 4, {4, 1}, {1, 1});
      p.Key("block_size").Raw("](").I(1).I(8).Raw("e");
      p.Key("mm_config").Raw("N").Key("act_quant_kwargs");
      p.G("torchao.quantization.quantize_.workflows.float8.float8_tensor",
          "QuantizeTensorToFloat8Kwargs")
          .Raw(")\x81}(");
      p.Key("float8_dtype").G("torch", "float8_e4m3fn");
      p.Key("granularity").G("torchao.quantization.granularity", "PerTensor").Raw(")\x81");
      p.Key("mm_config").G("torchao.float8.inference", "Float8MMConfig");
      p.Raw("\x89\x88\x89\x87\x81");
      p.Key("hp_value_lb").F(1e-12).Key("hp_value_ub").Raw("N");
      p.Key("kernel_preference").Enum("__builtin__", kp, "KernelPreference", "TORCH").Raw("ub");
      p.Key("kernel_preference").Enum("__builtin__", kp, "KernelPreference", "AUTO");
    });
  });
  Result r = ParseText(p.out);
  const Value& w = r.root.items[0];
  ASSERT_NE(w.group, nullptr) << w.not_group;
  EXPECT_EQ(w.group->dtype, "float32");
  EXPECT_EQ(w.group->description,
            R"({"attributes":{"act_quant_kwargs":["record","QuantizeTensorToFloat8Kwargs",)"
            R"({"float8_dtype":["dtype","float8_e4m3fn"],"granularity":["record","PerTensor",{}],)"
            R"("hp_value_lb":["float","0x1.19799812dea11p-40"],"hp_value_ub":null,)"
            R"("kernel_preference":["enum","KernelPreference","TORCH"],)"
            R"("mm_config":["record","Float8MMConfig",{"emulate":false,"pad_inner_dim":false,)"
            R"("use_fast_accum":true}]}],"block_size":["list",[1,8]],"dtype":["dtype","float32"],)"
            R"("kernel_preference":["enum","KernelPreference","AUTO"],"mm_config":null},)"
            R"("class":"Float8Tensor","library":"torchao","members":["qdata","scale"],)"
            R"("version":"unknown"})");
  EXPECT_EQ(r.storages[w.items[w.group->members[0].second].tensor.storage].dtype, "float8_e4m3fn");
}

// The first weight of a state_dict {"0.weight": Int8Tensor} (dynamic: with
// act_quant_kwargs), written without memo, with `from` replaced by `to`.
Value Int8With(const std::string& from, const std::string& to) {
  Pk p;
  p.memo = false;
  p.StateDict([&] { p.S("0.weight").Int8("w", "bfloat16", true); });
  const size_t at = p.out.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  if (at != std::string::npos) p.out.replace(at, from.size(), to);
  return ParseText(p.out).root.items.at(0);
}

TEST(PickleTorchao, WhatTheTableDoesNotHoldStaysOpaqueWithTheReason) {
  struct Case {
    std::string from, to, why;
  };
  const std::vector<Case> cases = {
      {"ctorchao.quantization\nInt8Tensor\n", "ctorchao.quantization\nInt9Tensor\n",
       "a torchao Int9Tensor: class torchao.quantization.Int9Tensor is not in tsar's table"},
      {"ctorchao.quantization\nInt8Tensor\n", "ctorchao.other\nInt8Tensor\n",
       "class torchao.other.Int8Tensor is not in tsar's table"},
      {"X\x0c\x00\x00\x00reduce_range\x89utR"s, "X\x03\x00\x00\x00zap\x89utR"s,
       "holds \"zap\", which tsar's table of Int8Tensor does not list"},
      {"torchao.quantization.quant_primitives\nMappingType", "torchao.elsewhere\nMappingType",
       "enum torchao.elsewhere.MappingType is not in tsar's torchao table"},
      {"c__builtin__\ngetattr\nctorchao.quantization.quant_primitives\nMappingType\n"
       "X\x09\x00\x00\x00SYMMETRIC\x86R"s,
       "ctorchao.quantization.quant_primitives\nMappingType\nK\x01\x85R"s,
       "enum MappingType pickled by value (Python before 3.11)"},
      {"torchao.quantization.granularity\nPerRow", "torchao.quantization.granularity\nPerRoe",
       "a torchao.quantization.granularity.PerRoe, which is not an enum or record"},
      {"X\x03\x00\x00\x00"
       "dimJ"s,
       "X\x03\x00\x00\x00"
       "dinJ"s,
       "field \"din\" is not one"},
      {"ctorch\nbfloat16\n", "ctorch\nint4\n",
       "outer dtype: expected a torch dtype tsar has a code"},
      {"X\x0d\x00\x00\x00torch.strided"s, "X\x0d\x00\x00\x00torch.sparse_"s, "layout"},
      {"](K\x01K\x08"
       "e",
       "](C\x01xK\x08"
       "e",
       "a bytes, which a tensor group cannot hold"},
      {"ctorch._utils\n_rebuild_wrapper_subclass\n", "ctorch._utils\n_rebuild_tensor_v2\n",
       "rebuilt by torch._utils._rebuild_tensor_v2"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.to);
    const Value w = Int8With(c.from, c.to);
    ASSERT_EQ(w.kind, Kind::kOpaque);
    EXPECT_EQ(w.group, nullptr);
    EXPECT_NE(w.not_group.find(c.why), std::string::npos) << w.not_group;
    EXPECT_EQ(w.items.size(), 3u);  // its tensors, as before
  }
  // An inner tensor that is None; a required one missing ("scale" renamed "scalf").
  {
    Pk p;
    p.memo = false;
    p.StateDict([&] { p.S("0.weight").Int8("w", "bfloat16", true); });
    const size_t at = p.out.find("X\x05\x00\x00\x00scalec"s);
    const size_t end = p.out.find(
        "X\x0a\x00\x00\x00"
        "block_size"s);
    ASSERT_TRUE(at != std::string::npos && end != std::string::npos);
    p.out.replace(at, end - at, "X\x05\x00\x00\x00scaleN"s);
    const Value w = ParseText(p.out).root.items.at(0);
    EXPECT_NE(w.not_group.find("inner tensor \"scale\": expected a plain tensor, found a None"),
              std::string::npos)
        << w.not_group;
  }
  EXPECT_NE(Int8With("X\x05\x00\x00\x00scalec"s, "X\x05\x00\x00\x00scalfc"s)
                .not_group.find("holds \"scalf\""),
            std::string::npos);
  // Another library's subclass is none of this business: opaque, no reason.
  const Value other = Int8With("ctorchao.quantization\nInt8Tensor\n", "cmylib\nQTensor\n");
  EXPECT_EQ(other.group, nullptr);
  EXPECT_EQ(other.not_group, "");
  // Values nested past 32 deep (spec §4.13.2): lists in lists; 32 is fine.
  for (int levels : {32, 33}) {
    std::string deep(levels, ']');
    deep += std::string(levels - 1, 'a');
    const Value w = Int8With(
        "](K\x01K\x08"
        "e",
        deep);
    if (levels == 32) {
      EXPECT_NE(w.group, nullptr) << w.not_group;
    } else {
      EXPECT_NE(w.not_group.find("nested more than 32 deep"), std::string::npos) << w.not_group;
    }
  }
}

TEST(PickleTorchao, SharedAttributesCannotBlowUp) {
  // block_size t30, where t(k+1) = (tk, tk): 2^30 values once written as
  // JSON. Reading shared values again is charged as Convert charges it.
  std::string tuples = ")q\x00"s;
  for (int k = 0; k < 30; ++k) {
    tuples += "0h"s + std::string(1, char(k)) + "h"s + std::string(1, char(k)) + "\x86q"s +
              std::string(1, char(k + 1));
  }
  Pk p;
  p.memo = false;
  p.StateDict([&] { p.S("w").Int8("w", "bfloat16", false); });
  const size_t at = p.out.find(
      "](K\x01K\x08"
      "e");
  ASSERT_NE(at, std::string::npos);
  p.out.replace(at, 7, "h\x1e");
  try {
    ParseText(tuples + "0" + p.out);
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("shared too often"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace tsar::pickle
