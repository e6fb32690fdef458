// Encoder -> decoder round trips, layout rules (§4.4), determinism (§4.9),
// builder misuse, and decoder rules that need constructed inputs (§6).
#include "format/index.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <functional>
#include <iterator>
#include <memory>
#include <random>

#include "format/checksum.h"
#include "format/encode.h"
#include "format/endian.h"
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
  static const uint64_t kSizes[6] = {kEntryRecordSize,  kStorageRecordSize,  kTensorRecordSize,
                                     kSparseRecordSize, kMetadataRecordSize, kDimSize};
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
      [&] {
        b.AddTensor(Spec("ovf", s, DType::kFloat32, {INT64_MAX, 3}, {INT64_MAX, 1}));
      },
      ErrorCode::kOverflow));
  EXPECT_TRUE(ThrowsTsar([&] { b.AddEntry("m"); }, ErrorCode::kDuplicateName));
  b.AddTensor(Spec("dup", s, DType::kFloat32, {1}, {1}));
  b.AddTensor(Spec("dup", s, DType::kFloat32, {1}, {1}));
  EXPECT_TRUE(ThrowsTsar([&] { b.Plan(); }, ErrorCode::kDuplicateName));
  EXPECT_TRUE(ThrowsTsar([] { IndexBuilder bad(100); }, ErrorCode::kInvalidArgument));
}

constexpr int64_t kI64Max = INT64_MAX;
constexpr int64_t k2p62 = int64_t{1} << 62;

TEST(IndexExtent, EmptyTensorsAreValidWhateverTheirStrides) {
  // R50 does not apply once a size is 0, not even to the dims before it; R78
  // only bounds the product of the non-zero sizes, here at or below 2^63-1.
  IndexBuilder b;
  b.AddEntry("m");
  const uint32_t s = b.AddStorage(8);
  b.AddTensor(
      Spec("product_2^62", s, DType::kFloat32, {int64_t{1} << 31, int64_t{1} << 31, 0}, {1, 1, 1}));
  b.AddTensor(Spec("product_2^63-1", s, DType::kFloat32, {7, 0, kI64Max / 7}, {0, 0, 0}));
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
  EXPECT_TRUE(ThrowsTsar(
      [&] {
        b.AddTensor(Spec("neg", s, DType::kFloat32, {0, -1}, {1, 1}));
      },
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

TEST(IndexExtent, EmptyTensorsNonZeroSizesMultiplyToAtMost2p63Minus1) {
  // R78: LibTorch multiplies the sizes in order with an overflow check, so it
  // refuses [2^62, 2^62, 0] although the tensor is empty.
  IndexBuilder b;
  b.AddEntry("m");
  b.AddTensor(Spec("e", b.AddStorage(8), DType::kFloat32, {2, 1, 0}, {1, 1, 1}));
  const std::string good = Encode(b);
  const uint64_t dims = TableStart(good, 5);  // sizes at dims + 0, 8, 16; strides at 24, 32, 40
  const uint64_t t0 = TableStart(good, 2);
  auto with_sizes = [&](uint64_t a, uint64_t b1, uint64_t c) {
    std::string f = good;
    Put64(f, dims, a);
    Put64(f, dims + 8, b1);
    Put64(f, dims + 16, c);
    Refix(f);
    return f;
  };

  Error e = ParseError(with_sizes(k2p62, k2p62, 0));
  EXPECT_EQ(e.code(), ErrorCode::kOverflow);
  EXPECT_EQ(e.offset(), dims + 8);  // the size that passes the limit, as R50
  EXPECT_STREQ(e.what(),
               "v.tsar: offset 232 (0xe8): tensor #0 \"e\" size 1: expected at most 1 (a "
               "product of non-zero sizes of at most 2^63-1), found 4611686018427387904");
  // A 0 before the factors does not hide them: reported at size 2.
  e = ParseError(with_sizes(k2p62, 0, 2));
  EXPECT_EQ(e.code(), ErrorCode::kOverflow);
  EXPECT_EQ(e.offset(), dims + 16);
  EXPECT_STREQ(e.what(),
               "v.tsar: offset 240 (0xf0): tensor #0 \"e\" size 2: expected at most 1 (a "
               "product of non-zero sizes of at most 2^63-1), found 2");
  EXPECT_TRUE(ThrowsTsar([&] { ParseString(with_sizes(0, 8, kI64Max / 7)); }, ErrorCode::kOverflow,
                         dims + 16));

  // At the limit, and below it, the tensor is valid.
  for (const std::string& f :
       {with_sizes(uint64_t{1} << 31, uint64_t{1} << 31, 0), with_sizes(7, 0, kI64Max / 7),
        with_sizes(kI64Max, 0, 1), with_sizes(0, 0, kI64Max), with_sizes(k2p62, 0, 1)}) {
    EXPECT_EQ(ParseString(f).tensors()[0].numel, 0u);
  }

  // Order: R48 and R49 come first, and R78 before R51.
  std::string f = with_sizes(k2p62, k2p62, 0);
  Put64(f, dims + 40, UINT64_MAX);  // stride 2 = -1
  Refix(f);
  EXPECT_TRUE(ThrowsTsar([&] { ParseString(f); }, ErrorCode::kBadShape, dims + 40));
  f = with_sizes(k2p62, k2p62, 0);
  Put64(f, t0 + 24, UINT64_MAX);  // storage_offset * 4 overflows too (R51)
  Refix(f);
  EXPECT_TRUE(ThrowsTsar([&] { ParseString(f); }, ErrorCode::kOverflow, dims + 8));

  // The encoder refuses what the decoder rejects, and accepts the limit.
  IndexBuilder c;
  c.AddEntry("m");
  const uint32_t s = c.AddStorage(8);
  try {
    c.AddTensor(Spec("big", s, DType::kFloat32, {k2p62, k2p62, 0}, {1, 1, 1}));
    ADD_FAILURE() << "no error";
  } catch (const Error& err) {
    EXPECT_EQ(err.code(), ErrorCode::kOverflow);
    EXPECT_STREQ(err.what(),
                 "tensor \"big\": size 1: expected at most 1 (a product of non-zero sizes of at "
                 "most 2^63-1), found 4611686018427387904");
  }
  c.AddTensor(Spec("limit", s, DType::kFloat32, {0, 7, kI64Max / 7}, {1, 1, 1}));
  EXPECT_EQ(ParseString(Encode(c)).tensors().size(), 1u);
}

TEST(IndexDecode, RequiresGradOnlyOnFloatingPointAndComplexDtypes) {
  // R77: every dtype of §5.1 with bit 0 of flags set; codes 7-15 and 19-22
  // are the floating-point and complex ones.
  for (DType dt : kAllDTypes) {
    IndexBuilder b;
    b.AddEntry("m");
    b.AddTensor(Spec("t", b.AddStorage(64), dt, {2}, {1}));
    std::string f = Encode(b);
    const uint64_t flags = TableStart(f, 2) + 15;
    f[flags] = 1;
    Refix(f);
    const auto code = static_cast<uint16_t>(dt);
    if ((code >= 7 && code <= 15) || (code >= 19 && code <= 22)) {
      EXPECT_TRUE(ParseString(f).tensors()[0].requires_grad) << DTypeName(dt);
    } else {
      EXPECT_TRUE(ThrowsTsar([&] { ParseString(f); }, ErrorCode::kInvalidValue, flags))
          << DTypeName(dt);
    }
  }

  IndexBuilder b;
  b.AddEntry("m");
  b.AddTensor(Spec("idx", b.AddStorage(64), DType::kInt64, {2}, {1}));
  const std::string good = Encode(b);
  const uint64_t t0 = TableStart(good, 2);
  std::string f = good;
  f[t0 + 15] = 1;
  Refix(f);
  Error e = ParseError(f);
  EXPECT_EQ(e.code(), ErrorCode::kInvalidValue);
  EXPECT_EQ(e.offset(), t0 + 15);
  EXPECT_STREQ(e.what(),
               "v.tsar: offset 191 (0xbf): tensor #0 \"idx\" requires_grad: expected 0 with dtype "
               "int64 (only floating-point and complex dtypes, codes 7-15 and 19-22, may require "
               "grad), found 1");
  // Order: R39 (reserved bits) before R77, and R77 before R40 (ndim).
  f = good;
  f[t0 + 15] = '\x81';
  Refix(f);
  EXPECT_TRUE(ThrowsTsar([&] { ParseString(f); }, ErrorCode::kReservedNonZero, t0 + 15));
  f = good;
  f[t0 + 15] = 1;
  Put64(f, t0 + 16, 65);  // ndim 65 (and dims_index 0: the u64 spans both)
  Refix(f);
  EXPECT_TRUE(ThrowsTsar([&] { ParseString(f); }, ErrorCode::kInvalidValue, t0 + 15));
}

TEST(IndexBuilder, RefusesRequiresGradOnIntegerAndBoolDtypes) {
  IndexBuilder b;
  b.AddEntry("m");
  const uint32_t s = b.AddStorage(64);
  for (DType dt : {DType::kInt64, DType::kBool, DType::kUInt8, DType::kUInt64}) {
    TensorSpec t = Spec(std::string(DTypeName(dt)), s, dt, {2}, {1});
    t.requires_grad = true;
    try {
      b.AddTensor(t);
      ADD_FAILURE() << DTypeName(dt) << ": no error";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
      EXPECT_EQ(std::string(e.what()),
                "tensor \"" + std::string(DTypeName(dt)) +
                    "\": requires_grad: expected a floating-point or complex dtype, found " +
                    std::string(DTypeName(dt)));
    }
  }
  for (DType dt : {DType::kFloat16, DType::kComplex64, DType::kFloat8E4M3FN, DType::kComplex32}) {
    TensorSpec t = Spec(std::string(DTypeName(dt)), s, dt, {2}, {1});
    t.requires_grad = true;
    b.AddTensor(t);
  }
  const Index idx = ParseString(Encode(b));
  ASSERT_EQ(idx.tensors().size(), 4u);  // refused calls left no trace
  for (const TensorRecord& t : idx.tensors()) EXPECT_TRUE(t.requires_grad) << t.name;
}

// Runs `f`, which must throw tsar::Error `code` whose message names `name`.
::testing::AssertionResult Refuses(const std::function<void()>& f, ErrorCode code,
                                   const std::string& name) {
  try {
    f();
  } catch (const Error& e) {
    if (e.code() != code) {
      return ::testing::AssertionFailure()
             << "code " << ErrorCodeName(e.code()) << ": " << e.what();
    }
    if (std::string(e.what()).find("\"" + name + "\"") == std::string::npos) {
      return ::testing::AssertionFailure()
             << "message does not name \"" << name << "\": " << e.what();
    }
    if (e.offset() || !e.path().empty()) {
      return ::testing::AssertionFailure() << "builder errors have no path or offset: " << e.what();
    }
    return ::testing::AssertionSuccess();
  }
  return ::testing::AssertionFailure() << "no tsar::Error thrown";
}

TEST(IndexBuilder, RefusesViewsTheDecoderRejects) {
  IndexBuilder b;
  b.AddEntry("m");
  const uint32_t s = b.AddStorage(64);
  // numel 3 * 2^62 > 2^63 - 1 although the extent is 0 (R50).
  EXPECT_TRUE(Refuses(
      [&] {
        b.AddTensor(Spec("numel", s, DType::kUInt8, {k2p62, 3}, {0, 0}));
      },
      ErrorCode::kOverflow, "numel"));
  // last = 3 * 6148914691236517205 = 2^64 - 1, so last + 1 wraps to 0 (R52).
  EXPECT_TRUE(
      Refuses([&] { b.AddTensor(Spec("wrap", s, DType::kUInt8, {4}, {6148914691236517205})); },
              ErrorCode::kOverflow, "wrap"));
  EXPECT_TRUE(
      Refuses([&] { b.AddTensor(Spec("offset", s, DType::kFloat64, {1}, {1}, uint64_t{1} << 61)); },
              ErrorCode::kOverflow, "offset"));
  EXPECT_TRUE(Refuses([&] { b.AddTensor(Spec("stride", s, DType::kUInt8, {1}, {-2})); },
                      ErrorCode::kInvalidArgument, "stride"));
  EXPECT_TRUE(Refuses(
      [&] {
        b.AddTensor(Spec("rank", s, DType::kUInt8, {1, 1}, {1}));
      },
      ErrorCode::kInvalidArgument, "rank"));
  EXPECT_TRUE(Refuses(
      [&] {
        b.AddTensor(Spec("ndim65", s, DType::kUInt8, std::vector<int64_t>(65, 1),
                         std::vector<int64_t>(65, 1)));
      },
      ErrorCode::kInvalidArgument, "ndim65"));
  // At the limits the arithmetic holds: last = 2^64 - 4 is merely too big
  // for the storage, and numel = 2^63 - 1 with stride 0 is accepted.
  EXPECT_TRUE(
      Refuses([&] { b.AddTensor(Spec("last", s, DType::kUInt8, {4}, {6148914691236517204})); },
              ErrorCode::kInvalidArgument, "last"));
  b.AddTensor(Spec("numel", s, DType::kUInt8, {kI64Max}, {0}));
  const Index idx = ParseString(Encode(b));
  EXPECT_EQ(idx.tensors()[0].numel, uint64_t{kI64Max});
}

TEST(IndexBuilder, RefusesFieldValuesOutsideTheirEnumerations) {
  IndexBuilder b;
  b.AddEntry("m");
  const uint32_t s = b.AddStorage(8);
  auto with = [&](const char* name, const std::function<void(TensorSpec&)>& edit) {
    return [&b, s, name, edit] {
      TensorSpec t = Spec(name, s, DType::kFloat32, {2}, {1});
      edit(t);
      b.AddTensor(t);
    };
  };
  EXPECT_TRUE(Refuses(with("dtype", [](TensorSpec& t) { t.dtype = static_cast<DType>(23); }),
                      ErrorCode::kInvalidArgument, "dtype"));
  EXPECT_TRUE(Refuses(with("dtype0", [](TensorSpec& t) { t.dtype = static_cast<DType>(0); }),
                      ErrorCode::kInvalidArgument, "dtype0"));
  EXPECT_TRUE(Refuses(with("role", [](TensorSpec& t) { t.role = static_cast<Role>(4); }),
                      ErrorCode::kInvalidArgument, "role"));
  EXPECT_TRUE(
      Refuses(with("device", [](TensorSpec& t) { t.device_type = static_cast<DeviceType>(3); }),
              ErrorCode::kInvalidArgument, "device"));
  // R46: a device ordinal only for CUDA.
  EXPECT_TRUE(Refuses(with("cpu:1",
                           [](TensorSpec& t) {
                             t.device_type = DeviceType::kCpu;
                             t.device_index = 1;
                           }),
                      ErrorCode::kInvalidArgument, "cpu:1"));
  EXPECT_TRUE(Refuses(with("unspecified:2", [](TensorSpec& t) { t.device_index = 2; }),
                      ErrorCode::kInvalidArgument, "unspecified:2"));
  // R42: role 3 if and only if a sparse record is named.
  EXPECT_TRUE(Refuses(with("role3", [](TensorSpec& t) { t.role = Role::kSparseComponent; }),
                      ErrorCode::kInvalidArgument, "role3"));
  EXPECT_TRUE(Refuses(with("sparse", [](TensorSpec& t) { t.sparse = 0; }),
                      ErrorCode::kInvalidArgument, "sparse"));
  EXPECT_TRUE(Refuses(with("\xff", [](TensorSpec&) {}), ErrorCode::kInvalidArgument, "\\xff"));
  EXPECT_TRUE(Refuses(with("", [](TensorSpec&) {}), ErrorCode::kInvalidArgument, ""));
  b.AddTensor(Spec("ok", s, DType::kFloat32, {2}, {1}));
  EXPECT_EQ(ParseString(Encode(b)).tensors().size(), 1u);  // refused calls left no trace
}

TEST(IndexBuilder, RefusesBadMetadata) {
  IndexBuilder b;
  b.AddEntry("m");
  MetadataSpec m;
  m.key = "k";
  m.type = static_cast<MetaType>(5);
  EXPECT_TRUE(Refuses([&] { b.AddMetadata(m); }, ErrorCode::kInvalidArgument, "k"));
  m.type = static_cast<MetaType>(0);
  EXPECT_TRUE(Refuses([&] { b.AddMetadata(m); }, ErrorCode::kInvalidArgument, "k"));
  m.type = MetaType::kString;
  m.entry = 1;
  EXPECT_TRUE(Refuses([&] { b.AddMetadata(m); }, ErrorCode::kInvalidArgument, "k"));
  m.entry = 0;
  m.bytes = "\xc0\x80";  // an overlong NUL
  EXPECT_TRUE(Refuses([&] { b.AddMetadata(m); }, ErrorCode::kInvalidArgument, "k"));
  m.bytes = "ok";
  b.AddMetadata(m);
  EXPECT_TRUE(Refuses([&] { b.AddMetadata(m); }, ErrorCode::kDuplicateName, "k"));
  m.entry = kNone;  // the same key at archive level is another scope
  b.AddMetadata(m);
  EXPECT_EQ(ParseString(Encode(b)).metadata().size(), 2u);
}

// A tensor group (format 1.5, spec §4.13) "g" of one int8 member "g.q",
// described (R112) unless `description` is empty; `type` is its record's.
IndexBuilder GroupBuilder(const std::string& description, MetaType type) {
  IndexBuilder b;
  b.AddEntry("m");
  SparseSpec g;
  g.name = "g";
  g.layout = SparseLayout::kGroup;
  g.dtype = DType::kBFloat16;
  g.sizes = {2, 4};
  g.strides = {4, 1};
  g.component_count = 1;
  const uint32_t s = b.AddSparse(g);
  TensorSpec q = Spec("g.q", b.AddStorage(8), DType::kInt8, {2, 4}, {4, 1});
  q.role = Role::kSparseComponent;
  q.sparse = s;
  b.AddTensor(q);
  if (!description.empty()) {
    MetadataSpec m;
    m.entry = 0;
    m.key = "group:g";
    m.type = type;
    m.bytes = description;
    b.AddMetadata(m);
  }
  return b;
}

TEST(IndexBuilder, RefusesAGroupWithoutItsDescription) {
  IndexBuilder none = GroupBuilder("", MetaType::kString);
  EXPECT_TRUE(Refuses([&] { none.Plan(); }, ErrorCode::kInvalidArgument, "group:g"));
  try {
    none.Plan();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("description: expected a string metadata record "
                                         "\"group:g\" in entry \"m\", found none"),
              std::string::npos)
        << e.what();
  }
  IndexBuilder bytes = GroupBuilder("{}", MetaType::kBytes);
  EXPECT_TRUE(Refuses([&] { bytes.Plan(); }, ErrorCode::kInvalidArgument, "group:g"));
  try {
    bytes.Plan();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("found another type"), std::string::npos) << e.what();
  }
  IndexBuilder good = GroupBuilder("{}", MetaType::kString);
  const Index idx = ParseString(Encode(good));
  ASSERT_EQ(idx.sparse().size(), 1u);
  EXPECT_TRUE(idx.IsGroup(0));
  EXPECT_EQ(idx.header().minor, 5);
  EXPECT_EQ(idx.GroupDescription(0), "{}");
}

// Entry "m" with a COO sparse tensor "sp" (indices [1, 2] int64, values [2]
// float32) and a dense "d" after it.
void AddCoo(IndexBuilder& b, uint32_t storage) {
  SparseSpec sp;
  sp.name = "sp";
  sp.layout = SparseLayout::kCoo;
  sp.coalesced = true;
  sp.sizes = {5};
  sp.first_component = 0;
  const uint32_t id = b.AddSparse(sp);
  TensorSpec indices = Spec("sp.indices", storage, DType::kInt64, {1, 2}, {2, 1});
  TensorSpec values = Spec("sp.values", storage, DType::kFloat32, {2}, {1}, 4);
  for (TensorSpec* t : {&indices, &values}) {
    t->role = Role::kSparseComponent;
    t->sparse = id;
    b.AddTensor(*t);
  }
}

TEST(IndexBuilder, WritesSparseRecordsTheDecoderAccepts) {
  IndexBuilder b;
  b.AddEntry("m");
  const uint32_t s = b.AddStorage(24);
  AddCoo(b, s);
  b.AddTensor(Spec("d", s, DType::kUInt8, {24}, {1}));
  b.AddEntry("csr");
  SparseSpec csr;
  csr.name = "x";
  csr.layout = SparseLayout::kCsr;
  csr.sizes = {2, 2};
  csr.first_component = 3;
  for (const char* n : {"x.crow", "x.col", "x.values"}) {
    TensorSpec t = Spec(n, s, DType::kInt32, {2}, {1});
    t.role = Role::kSparseComponent;
    t.sparse = 1;  // components may come before their record
    b.AddTensor(t);
  }
  EXPECT_EQ(b.AddSparse(csr), 1u);
  const Index idx = ParseString(Encode(b));
  ASSERT_EQ(idx.sparse().size(), 2u);
  EXPECT_EQ(idx.sparse()[0].name, "sp");
  EXPECT_TRUE(idx.sparse()[0].coalesced);
  EXPECT_EQ(idx.sparse()[0].component_count, 2u);
  EXPECT_EQ(idx.sparse()[1].entry, 1u);
  EXPECT_EQ(idx.sparse()[1].component_count, 3u);
  EXPECT_EQ(idx.tensors()[1].role, Role::kSparseComponent);
  EXPECT_EQ(idx.tensors()[1].sparse, 0u);
  EXPECT_EQ(idx.FindTensor(0, "sp"), kNone);  // a sparse name is not a tensor
}

TEST(IndexDecode, ManyEntriesWithSparseRecordsCostLinearTime) {
  // R66 buckets sparse records by entry; scanning all of them for every
  // entry took entry_count * sparse_count steps (about 10^9 here).
  IndexBuilder b;
  const uint32_t s = b.AddStorage(24);
  constexpr uint32_t kEntries = 30000;
  for (uint32_t e = 0; e < kEntries; ++e) {
    b.AddEntry("e" + std::to_string(e));
    SparseSpec sp;
    sp.name = "sp";
    sp.first_component = 2 * e;
    const uint32_t id = b.AddSparse(sp);
    for (const char* n : {"i", "v"}) {
      TensorSpec t = Spec(n, s, DType::kInt64, {1}, {1});
      t.role = Role::kSparseComponent;
      t.sparse = id;
      b.AddTensor(t);
    }
  }
  const Index idx = ParseString(Encode(b));
  EXPECT_EQ(idx.sparse().size(), kEntries);
  EXPECT_EQ(idx.FindTensor(kEntries - 1, "v"), 2 * kEntries - 1);
}

TEST(IndexBuilder, RefusesInconsistentSparseRecords) {
  const auto bad_sparse = [](const std::function<void(SparseSpec&)>& edit) {
    IndexBuilder b;
    b.AddEntry("m");
    SparseSpec sp;
    sp.name = "sp";
    sp.sizes = {3};
    edit(sp);
    return Refuses([&] { b.AddSparse(sp); }, ErrorCode::kInvalidArgument, "sp");
  };
  EXPECT_TRUE(bad_sparse([](SparseSpec& sp) { sp.layout = static_cast<SparseLayout>(0); }));
  EXPECT_TRUE(bad_sparse([](SparseSpec& sp) { sp.layout = static_cast<SparseLayout>(4); }));
  EXPECT_TRUE(bad_sparse([](SparseSpec& sp) { sp.sizes.assign(65, 1); }));
  EXPECT_TRUE(bad_sparse([](SparseSpec& sp) { sp.sizes = {2, -1}; }));
  {
    IndexBuilder b;
    SparseSpec sp;
    sp.name = "sp";
    EXPECT_TRUE(Refuses([&] { b.AddSparse(sp); }, ErrorCode::kInvalidArgument, "sp"));
    b.AddEntry("m");
    sp.name = "\xed\xa0\x80";  // a surrogate
    EXPECT_TRUE(ThrowsTsar([&] { b.AddSparse(sp); }, ErrorCode::kInvalidArgument));
  }

  // Whole-archive rules, checked by Plan(): each case starts from a valid COO.
  const auto bad_plan = [](const std::function<void(IndexBuilder&, uint32_t)>& edit, ErrorCode code,
                           const std::string& name) {
    IndexBuilder b;
    b.AddEntry("m");
    const uint32_t s = b.AddStorage(24);
    edit(b, s);
    return Refuses([&] { b.Plan(); }, code, name);
  };
  // R63: a COO record needs two components; "sp.values" is missing.
  EXPECT_TRUE(bad_plan(
      [](IndexBuilder& b, uint32_t s) {
        SparseSpec sp;
        sp.name = "sp";
        b.AddSparse(sp);
        TensorSpec t = Spec("sp.indices", s, DType::kInt64, {1, 2}, {2, 1});
        t.role = Role::kSparseComponent;
        t.sparse = 0;
        b.AddTensor(t);
      },
      ErrorCode::kInvalidArgument, "sp"));
  // R63: components in another entry.
  EXPECT_TRUE(bad_plan(
      [](IndexBuilder& b, uint32_t s) {
        AddCoo(b, s);
        b.AddEntry("other");
        SparseSpec sp;
        sp.name = "elsewhere";
        sp.first_component = 0;
        b.AddSparse(sp);
      },
      ErrorCode::kInvalidArgument, "elsewhere"));
  // R64: CSR needs 3 components, the third is a dense tensor.
  EXPECT_TRUE(bad_plan(
      [](IndexBuilder& b, uint32_t s) {
        SparseSpec sp;
        sp.name = "x";
        sp.layout = SparseLayout::kCsr;
        b.AddSparse(sp);
        for (const char* n : {"x.crow", "x.col"}) {
          TensorSpec t = Spec(n, s, DType::kInt32, {2}, {1});
          t.role = Role::kSparseComponent;
          t.sparse = 0;
          b.AddTensor(t);
        }
        b.AddTensor(Spec("dense", s, DType::kInt32, {2}, {1}));
      },
      ErrorCode::kInvalidArgument, "dense"));
  // R43: a component naming a sparse record that does not exist.
  EXPECT_TRUE(bad_plan(
      [](IndexBuilder& b, uint32_t s) {
        TensorSpec t = Spec("orphan", s, DType::kInt32, {2}, {1});
        t.role = Role::kSparseComponent;
        t.sparse = 7;
        b.AddTensor(t);
      },
      ErrorCode::kInvalidArgument, "orphan"));
  // R65: a third tensor claims a COO record that has only two components.
  EXPECT_TRUE(bad_plan(
      [](IndexBuilder& b, uint32_t s) {
        AddCoo(b, s);
        TensorSpec t = Spec("extra", s, DType::kInt32, {2}, {1});
        t.role = Role::kSparseComponent;
        t.sparse = 0;
        b.AddTensor(t);
      },
      ErrorCode::kInvalidArgument, "extra"));
  // R66: a sparse name equal to a tensor name of its entry.
  EXPECT_TRUE(bad_plan(
      [](IndexBuilder& b, uint32_t s) {
        AddCoo(b, s);
        b.AddTensor(Spec("sp", s, DType::kInt32, {2}, {1}));
      },
      ErrorCode::kDuplicateName, "sp"));
}

TEST(IndexBuilder, RefusesEveryAddAfterPlan) {
  IndexBuilder b;
  b.AddEntry("m");
  const uint32_t s = b.AddStorage(8);
  b.AddTensor(Spec("w", s, DType::kFloat32, {2}, {1}));
  b.Plan();
  const uint64_t data_offset = b.data_offset();
  EXPECT_TRUE(ThrowsTsar([&] { b.AddEntry("late"); }, ErrorCode::kInvalidArgument));
  EXPECT_TRUE(ThrowsTsar([&] { b.AddStorage(8); }, ErrorCode::kInvalidArgument));
  EXPECT_TRUE(ThrowsTsar([&] { b.AddTensor(Spec("late", s, DType::kFloat32, {2}, {1})); },
                         ErrorCode::kInvalidArgument));
  SparseSpec sp;
  sp.name = std::string(1000, 'x');  // would not fit in the planned blob
  EXPECT_TRUE(ThrowsTsar([&] { b.AddSparse(sp); }, ErrorCode::kInvalidArgument));
  MetadataSpec m;
  m.key = std::string(1000, 'k');
  m.type = MetaType::kBytes;
  m.bytes = std::string(4000, 'v');
  EXPECT_TRUE(ThrowsTsar([&] { b.AddMetadata(m); }, ErrorCode::kInvalidArgument));
  EXPECT_TRUE(ThrowsTsar([&] { b.SetStorageChecksum(1, 0); }, ErrorCode::kInvalidArgument));
  b.Plan();  // again: a no-op
  EXPECT_EQ(b.data_offset(), data_offset);
  const std::vector<uint8_t> head = b.EncodeHead();
  EXPECT_EQ(head.size(), data_offset);
  const Index idx = Index::Parse(head, b.file_size(), "late.tsar");
  EXPECT_EQ(idx.entries().size(), 1u);
  EXPECT_EQ(idx.tensors().size(), 1u);
  EXPECT_TRUE(idx.metadata().empty());
  EXPECT_TRUE(ThrowsTsar([] { IndexBuilder().EncodeHead(); }, ErrorCode::kInvalidArgument));
}

// Property: for random builder inputs, biased towards the edges of every rule,
// the builder either refuses (tsar::Error) or writes a head the decoder
// accepts, with every record it accepted. A refused call must leave the
// builder usable, so the generator goes on after one.
TEST(IndexBuilderProperty, EverythingItWritesDecodes) {
  std::mt19937_64 rng(20261121);
  auto below = [&rng](uint64_t n) {
    return std::uniform_int_distribution<uint64_t>(0, n - 1)(rng);
  };
  auto chance = [&](int percent) { return below(100) < static_cast<uint64_t>(percent); };
  auto pick = [&](const auto& v) { return v[below(std::size(v))]; };
  static const int64_t kDims[] = {0,
                                  1,
                                  1,
                                  2,
                                  2,
                                  3,
                                  4,
                                  7,
                                  1 << 20,
                                  int64_t{1} << 31,
                                  int64_t{1} << 32,
                                  int64_t{1} << 40,
                                  int64_t{1} << 61,
                                  k2p62,
                                  kI64Max - 1,
                                  kI64Max,
                                  3074457345618258602,
                                  6148914691236517204,
                                  6148914691236517205,
                                  -1,
                                  INT64_MIN};
  static const uint64_t kNbytes[] = {
      0, 1, 8, 16, 64, 100, 4096, 5000, uint64_t{1} << 40, UINT64_MAX / 2, UINT64_MAX - 100};
  static const uint64_t kOffsets[] = {0, 0, 0, 1, 2, 3, 100, uint64_t{1} << 61, UINT64_MAX};
  static const char* const kNames[] = {"a",   "b", "c", "w",    "bias",
                                       "a.b", "é", "",  "\xff", "\xc0\x80"};
  static const uint32_t kAlignments[] = {64, 128, 4096, 1u << 30, 100, 32};

  int refused = 0, accepted = 0, with_sparse = 0;
  for (int iter = 0; iter < 4000; ++iter) {
    std::unique_ptr<IndexBuilder> b;
    try {
      b = std::make_unique<IndexBuilder>(chance(5) ? pick(kAlignments) : 4096);
    } catch (const Error&) {
      ++refused;
      continue;
    }
    uint32_t entries = 0, storages = 0, tensors = 0, sparse = 0, metadata = 0;
    auto attempt = [](const std::function<void()>& f) {
      try {
        f();
        return true;
      } catch (const Error&) {
        return false;
      }
    };
    auto name = [&] {
      return chance(90) ? std::string(pick(kNames)) + std::to_string(below(6)) : pick(kNames);
    };
    auto dims = [&](size_t n) {
      std::vector<int64_t> v(n);
      for (auto& x : v) x = chance(70) ? static_cast<int64_t>(below(5)) : pick(kDims);
      return v;
    };
    auto tensor = [&](uint32_t sparse_id) {
      TensorSpec t;
      t.name = name();
      t.storage = static_cast<uint32_t>(below(storages + 1));
      t.dtype = static_cast<DType>(chance(95) ? 1 + below(18) : below(25));
      t.role = sparse_id != kNone ? Role::kSparseComponent : static_cast<Role>(below(3));
      if (chance(3)) t.role = static_cast<Role>(below(6));
      t.sparse = chance(3) ? static_cast<uint32_t>(below(3)) : sparse_id;
      t.requires_grad = chance(50);
      const size_t ndim = chance(2) ? 65 : below(4);
      t.sizes = dims(ndim);
      t.strides = dims(chance(3) ? below(4) : ndim);
      t.storage_offset = pick(kOffsets);
      t.device_type = static_cast<DeviceType>(chance(95) ? below(3) : below(6));
      t.device_index = static_cast<uint16_t>(chance(70) ? 0 : below(3));
      if (sparse_id != kNone && storages > 0 && chance(90)) {  // mostly a component that fits
        t.storage = static_cast<uint32_t>(below(storages));
        t.dtype = DType::kUInt8;
        t.requires_grad = false;  // R77
        t.sizes.assign(below(3), 0);
        t.strides = t.sizes;
        t.storage_offset = 0;
        t.device_type = DeviceType::kCuda;
      }
      if (attempt([&] { b->AddTensor(t); })) ++tensors;
    };

    const uint64_t n_storages = below(5);
    for (uint64_t i = 0; i < n_storages; ++i) {
      b->AddStorage(chance(85) ? below(129) : pick(kNbytes));
      ++storages;
    }
    const uint64_t n_entries = below(4);
    for (uint64_t e = 0; e < n_entries; ++e) {
      if (attempt([&] { b->AddEntry(chance(90) ? "e" + std::to_string(e) : name()); })) ++entries;
      const uint64_t n_items = below(5);
      for (uint64_t k = 0; k < n_items; ++k) {
        if (chance(15)) {  // a sparse record and (mostly) its components
          SparseSpec sp;
          sp.name = name();
          sp.layout = static_cast<SparseLayout>(chance(95) ? 1 + below(3) : below(6));
          sp.coalesced = chance(50);
          sp.sizes = dims(chance(2) ? 65 : below(3));
          sp.first_component = tensors + (chance(90) ? 0 : static_cast<uint32_t>(below(3)));
          const uint32_t id = sparse;
          if (attempt([&] { b->AddSparse(sp); })) ++sparse;
          const uint64_t n = (sp.layout == SparseLayout::kCoo ? 2 : 3) + (chance(90) ? 0 : 1) -
                             (chance(90) ? 0 : 1);
          for (uint64_t c = 0; c < n; ++c) tensor(id);
        } else {
          tensor(kNone);
        }
      }
    }
    const uint64_t n_meta = below(4);
    for (uint64_t k = 0; k < n_meta; ++k) {
      MetadataSpec m;
      m.entry = chance(50) ? kNone : static_cast<uint32_t>(below(entries + 1));
      m.key = name();
      m.type = static_cast<MetaType>(chance(95) ? 1 + below(4) : below(7));
      m.int_value = static_cast<int64_t>(rng());
      m.float_value = static_cast<double>(rng());
      m.bytes = chance(80) ? name() : std::string("\xed\xbf\xbf");
      if (attempt([&] { b->AddMetadata(m); })) ++metadata;
    }

    std::vector<uint8_t> head;
    try {
      b->Plan();
      head = b->EncodeHead();
    } catch (const Error&) {
      ++refused;
      continue;
    }
    try {
      const Index idx = Index::Parse(head, b->file_size(), "p.tsar");
      EXPECT_EQ(idx.entries().size(), entries) << "iteration " << iter;
      EXPECT_EQ(idx.storages().size(), storages) << "iteration " << iter;
      EXPECT_EQ(idx.tensors().size(), tensors) << "iteration " << iter;
      EXPECT_EQ(idx.sparse().size(), sparse) << "iteration " << iter;
      EXPECT_EQ(idx.metadata().size(), metadata) << "iteration " << iter;
      ++accepted;
      with_sparse += sparse > 0;
    } catch (const Error& e) {
      ADD_FAILURE() << "iteration " << iter
                    << ": the builder wrote a head the decoder rejects: " << e.what();
    }
  }
  // The inputs reach both outcomes often, and sparse records get through.
  EXPECT_GT(accepted, 400) << refused << " refused";
  EXPECT_GT(refused, 400) << accepted << " accepted";
  EXPECT_GT(with_sparse, 20);
  std::printf("%d accepted (%d with sparse records), %d refused\n", accepted, with_sparse, refused);
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

void ExpectDecodeError(const std::string& f, ErrorCode code, uint64_t offset,
                       const std::string& substring) {
  try {
    ParseString(f);
    ADD_FAILURE() << "parsed; expected " << ErrorCodeName(code);
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), code) << e.what();
    EXPECT_EQ(e.offset(), offset) << e.what();
    EXPECT_NE(std::string(e.what()).find(substring), std::string::npos) << e.what();
  }
}

TEST(IndexDecode, AcceptsAHigherMinorWithALongerHeader) {
  // A later minor may grow the header; this reader skips what it does not know.
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
  StoreU16(p + kOffMinor, kMinorVersion + 1);
  StoreU32(p + kOffHeaderSize, 128);
  StoreU64(p + kOffIndexOffset, 128);
  StoreU64(p + kOffDataOffset, data_offset);
  StoreU64(p + kOffFileSize, f.size());
  // Storage record offset moves with the data.
  const uint64_t storages = 128 + kIndexHeaderSize + kEntryRecordSize;
  StoreU64(p + storages, storage_off);
  StoreU64(p + kOffIndexXxh3, IndexChecksum(p, 128 + index_size));
  const Index idx = ParseString(f);
  EXPECT_EQ(idx.header().minor, kMinorVersion + 1);
  EXPECT_EQ(idx.tensors()[0].name, "w");
  // A feature bit this reader does not know: refused, naming the format needed (R79).
  StoreU32(p + kOffFlags, 0x10);
  StoreU64(p + kOffIndexXxh3, IndexChecksum(p, 128 + index_size));
  ExpectDecodeError(f, ErrorCode::kUnsupportedVersion, kOffFlags,
                    "flags: expected feature bits of format 1.5 (0xf), found 0x10 (the archive "
                    "needs a reader of format 1.6)");
  // Minor 1 exactly: the header must be 64 bytes again (R4).
  StoreU16(p + kOffMinor, 1);
  StoreU32(p + kOffFlags, 0);
  ExpectDecodeError(f, ErrorCode::kInvalidValue, kOffHeaderSize, "header_size: expected 64");
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
