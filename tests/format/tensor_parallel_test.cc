// §4.12 (format 1.4): the geometry of sharded tensors, the byte moves between
// C order and blocked slices, and what the encoder refuses (the decoder's
// rules are covered by samples/invalid, tests/format/samples_test.cc).
#include "format/tensor_parallel.h"

#include <gtest/gtest.h>

#include <cstring>
#include <numeric>

#include "format/checksum.h"
#include "format/encode.h"
#include "format/index.h"
#include "tests/format/test_util.h"

namespace tsar::format {
namespace {

using testing::ParseString;
using testing::ThrowsTsar;

TensorSpec Sharded(const std::string& name, uint32_t storage, std::vector<int64_t> sizes,
                   uint32_t dim, DType dt = DType::kBFloat16) {
  TensorSpec t;
  t.name = name;
  t.storage = storage;
  t.dtype = dt;
  t.strides = ShardStrides(sizes);
  t.sizes = std::move(sizes);
  t.shard_dim = dim;
  return t;
}

std::string Encode(IndexBuilder& b) {
  b.Plan();
  std::string out(b.file_size(), '\0');
  for (uint32_t i = 0; i < b.storage_count(); ++i) b.SetStorageChecksum(i, Xxh3("", 0));
  const auto head = b.EncodeHead();
  std::memcpy(out.data(), head.data(), head.size());
  return out;
}

TEST(ShardLayout, RowParallelBf16WeightForFourRanksAtPageAlignment) {
  // The worked example of §4.12.2: a LLaMA-7B down projection [4096, 11008],
  // bf16, split along dim 1 for 4 ranks in a 4096-aligned archive.
  const int64_t sizes[] = {4096, 11008};
  ShardLayout l;
  ASSERT_TRUE(ComputeShardLayout(sizes, 2, 1, 2, 4, 4096, &l));
  EXPECT_EQ(l.outer, 4096u);
  EXPECT_EQ(l.chunk, 2752u * 2);
  EXPECT_EQ(l.slice_bytes, 4096u * 2752 * 2);  // 22,544,384 = 5504 pages exactly
  EXPECT_EQ(l.block_stride, l.slice_bytes);
  EXPECT_EQ(l.nbytes, 4 * l.slice_bytes);
  // A slice that is not a whole number of pages is padded to the next page.
  const int64_t odd[] = {6, 1000};
  ASSERT_TRUE(ComputeShardLayout(odd, 2, 0, 4, 2, 4096, &l));
  EXPECT_EQ(l.slice_bytes, 12000u);
  EXPECT_EQ(l.block_stride, 12288u);
  EXPECT_EQ(l.nbytes, 12288u + 12000u);
  // Below the alignment: 64-byte blocks.
  const int64_t small[] = {4, 3};
  ASSERT_TRUE(ComputeShardLayout(small, 2, 0, 4, 2, 4096, &l));
  EXPECT_EQ(l.block_stride, 64u);
  EXPECT_EQ(l.nbytes, 64u + 24u);
}

TEST(ShardLayout, GatherThenScatterGivesTheTensorBackForEveryDimAndWorld) {
  const std::vector<int64_t> sizes = {4, 6, 8};
  std::vector<uint8_t> c_order(4 * 6 * 8 * 2);
  std::iota(c_order.begin(), c_order.end(), uint8_t{1});
  for (uint32_t dim = 0; dim < 3; ++dim) {
    for (uint32_t world : {2u, 4u}) {
      if (sizes[dim] % world) continue;
      ShardLayout l;
      ASSERT_TRUE(ComputeShardLayout(sizes.data(), 3, dim, 2, world, 128, &l));
      std::vector<uint8_t> blocked(l.nbytes, 0xEE);
      // In two uneven pieces, as the writer streams it.
      GatherBlocked(l, c_order.data(), 0, 37, blocked.data());
      GatherBlocked(l, c_order.data(), 37, l.nbytes - 37, blocked.data() + 37);
      // Rank r's slice is torch.chunk(x, world, dim)[r] in C order.
      const int64_t k = sizes[dim] / world;
      for (uint32_t r = 0; r < world; ++r) {
        size_t n = 0;
        for (int64_t a = 0; a < sizes[0]; ++a)
          for (int64_t b = 0; b < sizes[1]; ++b)
            for (int64_t c = 0; c < sizes[2]; ++c) {
              const int64_t idx[] = {a, b, c};
              if (idx[dim] / k != r) continue;
              const size_t src = static_cast<size_t>((a * 6 + b) * 8 + c) * 2;
              ASSERT_EQ(blocked[r * l.block_stride + n], c_order[src]) << dim << world << r;
              ASSERT_EQ(blocked[r * l.block_stride + n + 1], c_order[src + 1]);
              n += 2;
            }
        ASSERT_EQ(n, l.slice_bytes);
        for (uint64_t p = l.slice_bytes; r + 1 < world && p < l.block_stride; ++p)
          ASSERT_EQ(blocked[r * l.block_stride + p], 0) << "padding is zero";
      }
      std::vector<uint8_t> back(c_order.size(), 0);
      ScatterBlocked(l, blocked.data(), back.data());
      EXPECT_EQ(back, c_order) << "dim " << dim << " world " << world;
    }
  }
}

TEST(ShardEncode, RoundTripsThroughTheDecoderAsFormat14) {
  IndexBuilder b;
  b.SetTensorParallel(4);
  b.AddEntry("model");
  ShardLayout l;
  const std::vector<int64_t> sizes = {64, 128};
  ASSERT_TRUE(ComputeShardLayout(sizes.data(), 2, 1, 2, 4, 4096, &l));
  const uint32_t s = b.AddStorage(l.nbytes);
  b.AddTensor(Sharded("w", s, sizes, 1));
  b.AddTensor(Sharded("tied", s, sizes, 1));
  TensorSpec whole;
  whole.name = "norm";
  whole.storage = b.AddStorage(8);
  whole.sizes = {2};
  whole.strides = {1};
  b.AddTensor(whole);
  const Index idx = ParseString(Encode(b));
  EXPECT_EQ(idx.header().minor, 4);
  EXPECT_EQ(idx.header().flags, kFeatureTensorParallel);
  EXPECT_EQ(idx.tp_world(), 4u);
  EXPECT_EQ(idx.shard_count(), 2u);
  EXPECT_EQ(idx.tensors()[0].shard_dim, 1u);
  EXPECT_EQ(idx.tensors()[1].shard_dim, 1u);
  EXPECT_EQ(idx.tensors()[2].shard_dim, kNone);
}

TEST(ShardEncode, RefusesWhatTheDecoderWouldRefuseNamingTheTensor) {
  const auto refused = [](const std::function<void(IndexBuilder&)>& f, const char* words) {
    IndexBuilder b;
    b.AddEntry("model");
    try {
      f(b);
      Encode(b);
      ADD_FAILURE() << "accepted: " << words;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << e.what();
      EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
    }
  };
  refused([](IndexBuilder& b) { b.SetTensorParallel(1); }, "tp_world: expected 2 to 65536");
  refused([](IndexBuilder& b) { b.AddTensor(Sharded("w", b.AddStorage(88), {4, 3}, 0)); },
          "expected SetTensorParallel");
  refused(
      [](IndexBuilder& b) {
        b.SetTensorParallel(2);
        b.AddTensor(Sharded("w", b.AddStorage(24), {4, 3}, 1));
      },
      "tensor \"w\": shard size 1: expected a multiple of the world size 2, found 3");
  refused(
      [](IndexBuilder& b) {
        b.SetTensorParallel(2);
        b.AddTensor(Sharded("w", b.AddStorage(24), {4, 3}, 2));
      },
      "shard dim: expected less than the tensor's ndim 2, found 2");
  refused(
      [](IndexBuilder& b) {
        b.SetTensorParallel(2);
        b.AddTensor(Sharded("w", b.AddStorage(24), {4, 3}, 0));  // not 64 + 12
      },
      "shard storage nbytes: expected 76 (2 slices of 12 bytes, 64 bytes apart), found 24");
  refused(
      [](IndexBuilder& b) {
        b.SetTensorParallel(2);
        TensorSpec t = Sharded("w", b.AddStorage(76), {4, 3}, 0);
        t.strides = {1, 4};
        b.AddTensor(t);
      },
      "shard view: expected storage_offset 0 and C-contiguous strides [3, 1]");
  refused(
      [](IndexBuilder& b) {
        b.SetTensorParallel(2);
        const uint32_t s = b.AddStorage(76);
        b.AddTensor(Sharded("w", s, {4, 3}, 0));
        TensorSpec whole = Sharded("v", s, {4, 3}, kNone);
        b.AddTensor(whole);
      },
      "tensor \"v\": storage: expected a storage that no sharded tensor views");
  refused([](IndexBuilder& b) { b.SetTensorParallel(2); }, "shard_count: expected at least 1");
}

}  // namespace
}  // namespace tsar::format
