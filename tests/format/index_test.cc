// Encoder -> decoder round trips, layout rules (§4.4), determinism (§4.9),
// builder misuse, and decoder rules that need constructed inputs (§6).
#include <gtest/gtest.h>

#include <cstring>

#include "format/checksum.h"
#include "format/encode.h"
#include "format/endian.h"
#include "format/index.h"
#include "tests/format/test_util.h"

namespace tsar::format {
namespace {

using testing::ParseString;
using testing::ThrowsTsar;

TensorSpec Spec(const std::string& name, uint32_t storage, DType dt, std::vector<int64_t> sizes,
                std::vector<int64_t> strides, uint64_t offset = 0) {
  TensorSpec t;
  t.name = name;
  t.storage = storage;
  t.dtype = dt;
  t.sizes = std::move(sizes);
  t.strides = std::move(strides);
  t.storage_offset = offset;
  return t;
}

// Encodes a builder into a whole file whose storages hold zero bytes.
std::string Encode(IndexBuilder& b) {
  b.Plan();
  std::string out(b.file_size(), '\0');
  std::vector<uint8_t> zeros;
  for (uint32_t i = 0; i < b.storage_count(); ++i) {
    zeros.assign(b.storage_nbytes(i), 0);
    b.SetStorageChecksum(i, Xxh3(zeros.data(), zeros.size()));
  }
  const auto head = b.EncodeHead();
  std::memcpy(out.data(), head.data(), head.size());
  return out;
}

// Offset of table t of an encoded file (0 entries, 1 storages, 2 tensors,
// 3 sparse, 4 metadata, 5 dims, 6 blob), from the counts of §4.2.
uint64_t TableStart(const std::string& f, int t) {
  static const uint64_t kSizes[6] = {kEntryRecordSize,    kStorageRecordSize, kTensorRecordSize,
                                     kSparseRecordSize,   kMetadataRecordSize, kDimSize};
  const auto* p = reinterpret_cast<const uint8_t*>(f.data());
  uint64_t pos = kHeaderSize + kIndexHeaderSize;
  for (int i = 0; i < t; ++i) pos += LoadU32(p + kHeaderSize + 4 * i) * kSizes[i];
  return pos;
}
void Put64(std::string& f, uint64_t off, uint64_t v) {
  StoreU64(reinterpret_cast<uint8_t*>(f.data()) + off, v);
}
// Recomputes index_xxh3 so that a mutation reaches the rules behind R15.
void Refix(std::string& f) {
  auto* p = reinterpret_cast<uint8_t*>(f.data());
  StoreU64(p + kOffIndexXxh3, IndexChecksum(p, kHeaderSize + LoadU64(p + kOffIndexSize)));
}
// The error a parse of `f` throws; fails the test if it parses.
Error ParseError(const std::string& f) {
  try {
    ParseString(f, "v.tsar");
  } catch (const Error& e) {
    return e;
  }
  ADD_FAILURE() << "parsed";
  return Error(ErrorCode::kIo, "", std::nullopt, "parsed");
}

TEST(IndexRoundTrip, KeepsEveryTensorField) {
  IndexBuilder b;
  b.AddEntry("model");
  const uint32_t s = b.AddStorage(4096 * 4);
  TensorSpec w = Spec("layer.0.weight", s, DType::kFloat32, {64, 32}, {1, 64}, 8);
  w.role = Role::kParameter;
  w.requires_grad = true;
  w.device_type = DeviceType::kCuda;
  w.device_index = 3;
  b.AddTensor(w);
  b.AddTensor(Spec("scalar", s, DType::kInt64, {}, {}, 2047));
  b.AddEntry("ema");
  b.AddTensor(Spec("layer.0.weight", s, DType::kBFloat16, {0}, {1}));
  const std::string f = Encode(b);
  const Index idx = ParseString(f);

  ASSERT_EQ(idx.entries().size(), 2u);
  EXPECT_EQ(idx.entries()[1].name, "ema");
  EXPECT_EQ(idx.entries()[1].first_tensor, 2u);
  ASSERT_EQ(idx.tensors().size(), 3u);
  const TensorRecord& t = idx.tensors()[0];
  EXPECT_EQ(t.name, "layer.0.weight");
  EXPECT_EQ(t.dtype, DType::kFloat32);
  EXPECT_EQ(t.role, Role::kParameter);
  EXPECT_TRUE(t.requires_grad);
  EXPECT_EQ(t.device_type, DeviceType::kCuda);
  EXPECT_EQ(t.device_index, 3);
  EXPECT_EQ(t.storage_offset, 8u);
  EXPECT_EQ(t.numel, 64u * 32u);
  ASSERT_EQ(t.ndim, 2u);
  EXPECT_EQ(idx.sizes(t)[0], 64);
  EXPECT_EQ(idx.strides(t)[1], 64);
  EXPECT_EQ(idx.tensors()[1].ndim, 0u);
  EXPECT_EQ(idx.tensors()[1].numel, 1u);
  EXPECT_EQ(idx.tensors()[2].entry, 1u);
  EXPECT_EQ(idx.tensors()[2].numel, 0u);
  EXPECT_EQ(idx.storages()[0].nbytes, 4096u * 4);
}

TEST(IndexRoundTrip, KeepsMetadataOfEveryTypeSortedByEntryAndKey) {
  IndexBuilder b;
  b.AddEntry("model");
  MetadataSpec m;
  m.key = "z";
  m.type = MetaType::kString;
  m.bytes = "last";
  b.AddMetadata(m);
  m.key = "a";
  m.type = MetaType::kFloat;
  m.float_value = -0.5;
  b.AddMetadata(m);
  m.entry = 0;
  m.key = "step";
  m.type = MetaType::kInt;
  m.int_value = INT64_MIN;
  b.AddMetadata(m);
  m.entry = kNone;
  m.key = "raw";
  m.type = MetaType::kBytes;
  m.bytes = std::string("\0\1\2", 3);
  b.AddMetadata(m);
  const Index idx = ParseString(Encode(b));
  ASSERT_EQ(idx.metadata().size(), 4u);
  EXPECT_EQ(idx.metadata()[0].key, "step");
  EXPECT_EQ(idx.metadata()[0].int_value, INT64_MIN);
  EXPECT_EQ(idx.metadata()[1].key, "a");
  EXPECT_EQ(idx.metadata()[1].float_value, -0.5);
  EXPECT_EQ(idx.metadata()[2].key, "raw");
  EXPECT_EQ(idx.metadata()[2].bytes, std::string("\0\1\2", 3));
  EXPECT_EQ(idx.metadata()[3].bytes, "last");
}

TEST(IndexRoundTrip, MetadataOrderDoesNotChangeTheBytes) {
  auto build = [](bool reverse) {
    IndexBuilder b;
    std::vector<std::string> keys = {"alpha", "beta", "gamma"};
    if (reverse) std::reverse(keys.begin(), keys.end());
    for (const auto& k : keys) {
      MetadataSpec m;
      m.key = k;
      m.int_value = static_cast<int64_t>(k.size());
      b.AddMetadata(m);
    }
    return Encode(b);
  };
  EXPECT_EQ(build(false), build(true));
}

TEST(IndexLayout, SmallStoragesPackOn64AndLargeOnesOnAlignment) {
  IndexBuilder b(4096);
  b.AddEntry("m");
  b.AddStorage(100);
  b.AddStorage(5000);
  b.AddStorage(256);
  b.Plan();
  EXPECT_EQ(b.storage_offset(0) % 64, 0u);
  EXPECT_EQ(b.storage_offset(1) % 4096, 0u);
  EXPECT_EQ(b.storage_offset(2), b.storage_offset(1) + 5056);  // 5000 rounded up to 64
  EXPECT_EQ(b.file_size(), b.storage_offset(2) + 256);
}

TEST(IndexLayout, ManySmallTensorsCostNoPadding) {
  // 100,000 tensors of 256 bytes: 25.6 MB of data, no page per tensor.
  IndexBuilder b;
  b.AddEntry("m");
  for (int i = 0; i < 100000; ++i) {
    const uint32_t s = b.AddStorage(256);
    b.AddTensor(Spec("t" + std::to_string(i), s, DType::kFloat32, {64}, {1}));
  }
  b.Plan();
  EXPECT_EQ(b.file_size() - b.data_offset(), 100000u * 256u);
  EXPECT_EQ(ParseString(Encode(b)).tensors().size(), 100000u);
}

TEST(IndexLayout, EmptyArchiveIs128Bytes) {
  IndexBuilder b;
  const std::string f = Encode(b);
  EXPECT_EQ(f.size(), 128u);
  EXPECT_EQ(ParseString(f).tensors().size(), 0u);
}

TEST(IndexBuilder, RejectsMisuseNamingTheTensor) {
  IndexBuilder b;
  EXPECT_TRUE(ThrowsTsar([&] { b.AddTensor(Spec("x", 0, DType::kFloat32, {1}, {1})); },
                         ErrorCode::kInvalidArgument));
  b.AddEntry("m");
  const uint32_t s = b.AddStorage(16);
  try {
    b.AddTensor(Spec("too.big", s, DType::kFloat32, {5}, {1}));
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_STREQ(e.what(),
                 "tensor \"too.big\": extent: expected at most storage nbytes 16, found 20");
  }
  EXPECT_TRUE(ThrowsTsar([&] { b.AddTensor(Spec("", s, DType::kFloat32, {1}, {1})); },
                         ErrorCode::kInvalidArgument));
  EXPECT_TRUE(ThrowsTsar([&] { b.AddTensor(Spec("neg", s, DType::kFloat32, {-1}, {1})); },
                         ErrorCode::kInvalidArgument));
  EXPECT_TRUE(ThrowsTsar(
      [&] { b.AddTensor(Spec("ovf", s, DType::kFloat32, {INT64_MAX, 3}, {INT64_MAX, 1})); },
      ErrorCode::kOverflow));
  EXPECT_TRUE(ThrowsTsar([&] { b.AddEntry("m"); }, ErrorCode::kDuplicateName));
  b.AddTensor(Spec("dup", s, DType::kFloat32, {1}, {1}));
  b.AddTensor(Spec("dup", s, DType::kFloat32, {1}, {1}));
  EXPECT_TRUE(ThrowsTsar([&] { b.Plan(); }, ErrorCode::kDuplicateName));
  EXPECT_TRUE(ThrowsTsar([] { IndexBuilder bad(100); }, ErrorCode::kInvalidArgument));
}

constexpr int64_t kI64Max = INT64_MAX;
constexpr int64_t k2p62 = int64_t{1} << 62;

TEST(IndexExtent, EmptyTensorsAreValidWhateverTheirOtherSizesAndStrides) {
  // R50 does not apply once a size is 0, not even to the dims before it.
  IndexBuilder b;
  b.AddEntry("m");
  const uint32_t s = b.AddStorage(8);
  b.AddTensor(Spec("product_passes_2^64", s, DType::kFloat32, {k2p62, 4, 0}, {1, 1, 1}));
  b.AddTensor(Spec("product_passes_2^63", s, DType::kFloat32,
                   {int64_t{1} << 40, int64_t{1} << 40, 0}, {0, 0, 0}));
  b.AddTensor(Spec("huge_strides", s, DType::kFloat32, {0, kI64Max}, {kI64Max, kI64Max}));
  b.AddTensor(Spec("at_the_end", s, DType::kFloat32, {3, 0}, {kI64Max, 1}, 2));
  const Index idx = ParseString(Encode(b));
  ASSERT_EQ(idx.tensors().size(), 4u);
  for (const TensorRecord& t : idx.tensors()) {
    EXPECT_EQ(t.numel, 0u) << t.name;
    EXPECT_EQ(t.nbytes_spanned, 0u) << t.name;
  }
}

TEST(IndexExtent, EmptyTensorsStillNeedSignedDimsAndAnOffsetInsideTheStorage) {
  IndexBuilder b;
  b.AddEntry("m");
  const uint32_t s = b.AddStorage(8);
  EXPECT_TRUE(ThrowsTsar([&] { b.AddTensor(Spec("neg", s, DType::kFloat32, {0, -1}, {1, 1})); },
                         ErrorCode::kInvalidArgument));
  EXPECT_TRUE(ThrowsTsar([&] { b.AddTensor(Spec("past", s, DType::kFloat32, {0}, {1}, 3)); },
                         ErrorCode::kInvalidArgument));
  b.AddTensor(Spec("e", s, DType::kFloat32, {0, 1}, {1, 1}));
  const std::string good = Encode(b);
  const uint64_t dims = TableStart(good, 5);
  const uint64_t t0 = TableStart(good, 2);

  std::string f = good;
  Put64(f, dims + 8, UINT64_MAX);  // size 1 = -1, after the size 0: still R48
  Refix(f);
  EXPECT_TRUE(ThrowsTsar([&] { ParseString(f); }, ErrorCode::kBadShape, dims + 8));
  f = good;
  Put64(f, dims + 16, UINT64_MAX);  // stride 0 = -1: R49
  Refix(f);
  EXPECT_TRUE(ThrowsTsar([&] { ParseString(f); }, ErrorCode::kBadShape, dims + 16));
  f = good;
  Put64(f, t0 + 24, 3);  // storage_offset 3: 12 bytes > 8 (R53)
  Refix(f);
  EXPECT_TRUE(ThrowsTsar([&] { ParseString(f); }, ErrorCode::kOutOfBounds, t0 + 24));
  f = good;
  Put64(f, t0 + 24, uint64_t{1} << 62);  // storage_offset * 4 overflows (R51)
  Refix(f);
  EXPECT_TRUE(ThrowsTsar([&] { ParseString(f); }, ErrorCode::kOverflow, t0 + 24));
}

TEST(IndexExtent, OverflowIsReportedAtTheOffendingSizeOrStride) {
  IndexBuilder b;
  b.AddEntry("m");
  b.AddTensor(Spec("v", b.AddStorage(8), DType::kFloat32, {2, 1, 1}, {1, 0, 0}));
  const std::string good = Encode(b);
  const uint64_t dims = TableStart(good, 5);  // sizes at dims + 0, 8, 16; strides at 24, 32, 40

  std::string f = good;
  Put64(f, dims + 8, uint64_t{1} << 61);
  Put64(f, dims + 16, 4);  // numel 2 * 2^61 * 4 = 2^64: passes 2^63 - 1 at size 2
  Refix(f);
  Error e = ParseError(f);
  EXPECT_EQ(e.code(), ErrorCode::kOverflow);
  EXPECT_EQ(e.offset(), dims + 16);
  EXPECT_STREQ(e.what(),
               "v.tsar: offset 240 (0xf0): tensor #0 \"v\" size 2: expected at most 1 (an "
               "element count of at most 2^63-1), found 4");

  f = good;
  Put64(f, dims + 8, 4);
  Put64(f, dims + 32, static_cast<uint64_t>(kI64Max));  // last 1 + 3 * (2^63 - 1) > 2^64 - 1
  Refix(f);
  e = ParseError(f);
  EXPECT_EQ(e.code(), ErrorCode::kOverflow);
  EXPECT_EQ(e.offset(), dims + 32);
  EXPECT_STREQ(e.what(),
               "v.tsar: offset 256 (0x100): tensor #0 \"v\" stride 1: expected at most "
               "6148914691236517204 (a last element offset below 2^64), found 9223372036854775807");

  f = good;  // the same view with a size 0 after it is empty, hence valid
  Put64(f, dims + 8, 4);
  Put64(f, dims + 32, static_cast<uint64_t>(kI64Max));
  Put64(f, dims + 16, 0);
  Refix(f);
  EXPECT_EQ(ParseString(f).tensors()[0].numel, 0u);
}

TEST(IndexDecode, ErrorMessageFollowsTheGrammar) {
  IndexBuilder b;
  b.AddEntry("model");
  b.AddTensor(Spec("enc.w", b.AddStorage(8), DType::kFloat32, {2}, {1}));
  std::string f = Encode(b);
  f[1] = 'X';
  try {
    ParseString(f, "w.tsar");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(),
                 "w.tsar: offset 0 (0x0): magic: expected 89 54 53 41 52 0d 0a 1a, found 89 58 "
                 "53 41 52 0d 0a 1a");
    EXPECT_EQ(e.path(), "w.tsar");
  }
}

TEST(IndexDecode, AcceptsAHigherMinorWithALongerHeader) {
  // A v1.1 writer may grow the header; a v1.0 reader skips what it does not know.
  IndexBuilder b;
  b.AddEntry("model");
  b.AddTensor(Spec("w", b.AddStorage(8), DType::kFloat32, {2}, {1}));
  const std::string v10 = Encode(b);
  const uint64_t index_size = LoadU64(reinterpret_cast<const uint8_t*>(v10.data()) + kOffIndexSize);
  std::string f = v10.substr(0, 64) + std::string(64, '\x5a') + v10.substr(64, index_size);
  uint64_t data_offset;
  AlignUp(128 + index_size, 64, &data_offset);
  f.resize(data_offset, '\0');
  const uint64_t storage_off = data_offset;
  f += v10.substr(v10.size() - 8);
  auto* p = reinterpret_cast<uint8_t*>(f.data());
  StoreU16(p + kOffMinor, 1);
  StoreU32(p + kOffHeaderSize, 128);
  StoreU64(p + kOffIndexOffset, 128);
  StoreU64(p + kOffDataOffset, data_offset);
  StoreU64(p + kOffFileSize, f.size());
  // Storage record offset moves with the data.
  const uint64_t storages = 128 + kIndexHeaderSize + kEntryRecordSize;
  StoreU64(p + storages, storage_off);
  StoreU64(p + kOffIndexXxh3, IndexChecksum(p, 128 + index_size));
  const Index idx = ParseString(f);
  EXPECT_EQ(idx.header().minor, 1);
  EXPECT_EQ(idx.tensors()[0].name, "w");
}

TEST(IndexDecode, RejectsAFutureMajorVersionByNumber) {
  IndexBuilder b;
  std::string f = Encode(b);
  StoreU16(reinterpret_cast<uint8_t*>(f.data()) + kOffMajor, 2);
  try {
    ParseString(f, "x.tsar");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnsupportedVersion);
    EXPECT_NE(std::string(e.what()).find("expected major 1, found 2"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace tsar::format
