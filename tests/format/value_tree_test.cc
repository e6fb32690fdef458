// The value tree of format 1.1 (spec §4.10): tsar::Value through IndexBuilder
// and back through the decoder, what the builder refuses, and the rules the
// decoder applies to hand-made tables (R80-R93).
#include "format/value_tree.h"

#include <gtest/gtest.h>

#include "format/checksum.h"
#include "format/encode.h"
#include "format/endian.h"
#include "format/index.h"
#include "tests/format/test_util.h"

namespace tsar::format {
namespace {

using testing::ParseString;
using testing::ThrowsTsar;
using V = tsar::Value;

std::string Encode(IndexBuilder& b) {
  b.Plan();
  for (uint32_t i = 0; i < b.storage_count(); ++i) b.SetStorageChecksum(i, 0x2d06800538d394c2);
  const std::vector<uint8_t> head = b.EncodeHead();
  std::string out(b.file_size(), '\0');
  std::copy(head.begin(), head.end(), out.begin());
  return out;
}

// An entry "m" with tensors "a" and "b" (empty storages), and `root` as tree.
std::string WithTree(const V& root) {
  IndexBuilder b;
  b.AddEntry("m");
  for (const char* name : {"a", "b"}) {
    TensorSpec t;
    t.name = name;
    t.storage = b.AddStorage(0);
    t.sizes = {0};
    t.strides = {1};
    b.AddTensor(t);
  }
  b.SetValues(EncodeTree(
      root,
      [](const std::string& e, const std::string& n) -> uint32_t {
        return e != "m" ? kNone : n == "a" ? 0 : n == "b" ? 1 : kNone;
      },
      [](const std::string& e) { return e == "m" ? 0u : kNone; }));
  return Encode(b);
}

V Every() {
  V entry = V::Entry("m", true);
  entry.set_attributes(V::Dict({{V::Str("_metadata"), V::Dict({}, true)}}));
  std::string big(9, '\xff');
  big[8] = '\x80';  // -2^71 + 2^64 - 1... any negative 9-byte value
  return V::Dict({
      {V::Str("none"), V::None()},
      {V::Str("t"), V::Bool(true)},
      {V::Int(-7), V::Int(INT64_MIN)},
      {V::Str("big"), V::BigInt(big)},
      {V::Str("f"), V::Float(-0.0)},
      {V::Str("s"), V::Str("\xc3\xa9")},
      {V::Str("raw"), V::Bytes(std::string("\0\1", 2))},
      {V::Tuple({V::Int(1), V::Str("k")}), V::List({V::Tensor("m", "a"), V::List({})})},
      {V::Str("sd"), entry},
      {V::Str("obj"), V::Opaque("pkg.Cls", {"c", "d", "e"}, {V::Tensor("m", "b"), V::None()})},
  });
}

TEST(ValueTree, EveryKindRoundTripsThroughTheBuilderAndTheDecoder) {
  const std::string f = WithTree(Every());
  const Index idx = ParseString(f);
  EXPECT_EQ(idx.header().minor, 1);
  EXPECT_EQ(idx.header().flags, kFeatureValueTree);
  ASSERT_FALSE(idx.values().empty());
  const V back = DecodeTree(idx);
  EXPECT_TRUE(back == Every());
  EXPECT_EQ(back.find("obj")->segments(), (std::vector<std::string>{"c", "d", "e"}));
  EXPECT_EQ(back.find("sd")->attributes()->pairs().size(), 1u);
  // Pre-order: the root, then its first key, then its first value...
  EXPECT_EQ(idx.values()[0].kind, ValueKind::kDict);
  EXPECT_EQ(idx.links()[0], 1u);
  EXPECT_EQ(idx.values()[1].bytes, "none");
}

TEST(ValueTree, WithoutATreeTheArchiveIsFormat1_0ByteForByte) {
  IndexBuilder b;
  b.AddEntry("m");
  const std::string f = Encode(b);
  EXPECT_EQ(LoadU16(reinterpret_cast<const uint8_t*>(f.data()) + kOffMinor), 0);
  EXPECT_EQ(LoadU32(reinterpret_cast<const uint8_t*>(f.data()) + kOffFlags), 0u);
  EXPECT_TRUE(ParseString(f).values().empty());
}

TEST(ValueTree, TheBuilderRefusesTreesTheDecoderWould) {
  EXPECT_TRUE(ThrowsTsar([] { WithTree(V::Tensor("m", "zz")); }, ErrorCode::kInvalidArgument));
  EXPECT_TRUE(ThrowsTsar([] { WithTree(V::Entry("other")); }, ErrorCode::kInvalidArgument));
  EXPECT_TRUE(ThrowsTsar([] { WithTree(V::Opaque("x", {"a"}, {V::None()})); },
                         ErrorCode::kInvalidArgument));
  EXPECT_TRUE(ThrowsTsar([] { WithTree(V::Opaque("", {"a"}, {})); }, ErrorCode::kInvalidArgument));
  EXPECT_TRUE(ThrowsTsar([] { WithTree(V::Str("\xff")); }, ErrorCode::kInvalidArgument));
  EXPECT_TRUE(ThrowsTsar([] { WithTree(V::BigInt(std::string(9, '\0'))); },
                         ErrorCode::kInvalidArgument));  // not the shortest form
  EXPECT_TRUE(ThrowsTsar(
      [] {
        WithTree(V::Dict({{V::List({}), V::None()}}));
      },
      ErrorCode::kInvalidArgument));  // an unhashable key
  V attr = V::Dict({});
  attr.set_attributes(V::List({}));
  EXPECT_TRUE(ThrowsTsar([&] { WithTree(attr); }, ErrorCode::kInvalidArgument));
  V deep = V::None();
  for (int i = 0; i < 100; ++i) deep = V::List({deep});
  WithTree(deep);  // 100 levels below the root: allowed
  deep = V::List({deep});
  EXPECT_TRUE(ThrowsTsar([&] { WithTree(deep); }, ErrorCode::kInvalidArgument));
  try {
    WithTree(V::Tensor("m", "zz"));
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "value tree: tensor \"m/zz\": not in the archive");
  }
}

// The value table of an encoded archive, to patch.
uint64_t ValuesAt(const std::string& f) {
  const auto* p = reinterpret_cast<const uint8_t*>(f.data());
  uint64_t blob = kHeaderSize + kIndexHeaderSize;
  const uint64_t sizes[6] = {kEntryRecordSize,  kStorageRecordSize,  kTensorRecordSize,
                             kSparseRecordSize, kMetadataRecordSize, kDimSize};
  for (int t = 0; t < 6; ++t) blob += LoadU32(p + kHeaderSize + 4 * t) * sizes[t];
  return (blob + LoadU64(p + kHeaderSize + 24) + 7) & ~uint64_t{7};
}

void Patch(std::string& f, uint64_t off, uint64_t v, int width) {
  auto* p = reinterpret_cast<uint8_t*>(f.data());
  if (width == 1) p[off] = static_cast<uint8_t>(v);
  if (width == 4) StoreU32(p + off, static_cast<uint32_t>(v));
  if (width == 8) StoreU64(p + off, v);
  const uint64_t end = LoadU64(p + kOffIndexOffset) + LoadU64(p + kOffIndexSize);
  StoreU64(p + kOffIndexXxh3, IndexChecksum(p, end));
}

TEST(ValueTree, TheDecoderChecksEveryRecordField) {
  // Root: list [tensor a, int 5, str "s"]: values 0-3, links 1, 2, 3.
  const std::string good = WithTree(V::List({V::Tensor("m", "a"), V::Int(5), V::Str("s")}));
  const uint64_t v0 = ValuesAt(good);
  const uint64_t links = v0 + 4 * kValueRecordSize;
  struct Case {
    uint64_t off;
    uint64_t value;
    int width;
    ErrorCode code;
    uint64_t at;
  } cases[] = {
      {kHeaderSize + 32, 0, 4, ErrorCode::kInvalidValue, kHeaderSize + 32},     // R80
      {kHeaderSize + 44, 1, 1, ErrorCode::kReservedNonZero, kHeaderSize + 44},  // R17
      {v0 + 32 + 2, 1, 1, ErrorCode::kReservedNonZero, v0 + 32 + 2},            // R83
      {v0 + 32 + 1, 1, 1, ErrorCode::kInvalidValue, v0 + 32 + 1},               // R84
      {v0 + 8, 1, 4, ErrorCode::kInvalidValue, v0 + 8},                         // R85
      {v0 + 4, 9, 4, ErrorCode::kOutOfBounds, v0 + 4},                          // R86
      {v0 + 32 + 16, 2, 8, ErrorCode::kOutOfBounds, v0 + 32 + 16},              // R87: tensor
      {v0 + 64 + 24, 1, 8, ErrorCode::kInvalidValue, v0 + 64 + 24},             // R87
      {v0 + 96 + 16, 1 << 20, 8, ErrorCode::kOutOfBounds, v0 + 96 + 16},        // R87: blob
      {links + 4, 9, 4, ErrorCode::kOutOfBounds, links + 4},                    // R89
      {v0 + 32 * 2, uint64_t(ValueKind::kList), 1, ErrorCode::kInvalidValue, v0 + 64 + 16},
  };
  for (const Case& c : cases) {
    std::string f = good;
    Patch(f, c.off, c.value, c.width);
    EXPECT_TRUE(ThrowsTsar([&] { ParseString(f); }, c.code, c.at)) << "patch at " << c.off;
  }
}

}  // namespace
}  // namespace tsar::format
