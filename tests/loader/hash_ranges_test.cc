// HashRanges (loader/hash_storages.h): the same hashes as one-shot XXH3 on
// every thread count's share, in range order, with progress ending at the total.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "format/checksum.h"
#include "loader/hash_storages.h"

namespace tsar {
namespace {

TEST(HashRanges, EqualsOneShotXxh3InOrderWithProgress) {
  // Enough bytes (> 64 MiB) for several threads; sizes from 0 to 40 MiB, so
  // one range spans several 16 MiB progress steps.
  std::vector<uint8_t> bytes(100u << 20);
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<uint8_t>(i * 2654435761u >> 13);
  const uint64_t sizes[] = {0, 1, 4095, 40u << 20, 7, 1u << 20, 30u << 20, 123457, 0, 9u << 20};
  std::vector<ByteRange> ranges;
  uint64_t off = 0, total = 0;
  for (uint64_t n : sizes) {
    ranges.push_back({bytes.data() + off, n});
    off += n;
    total += n;
  }
  ASSERT_LE(off, bytes.size());
  std::vector<uint64_t> seen;
  const std::vector<uint64_t> got = HashRanges(ranges, [&](uint64_t done) { seen.push_back(done); });
  ASSERT_EQ(got.size(), ranges.size());
  for (size_t i = 0; i < ranges.size(); ++i) {
    EXPECT_EQ(got[i], format::Xxh3(ranges[i].data, ranges[i].size)) << "range " << i;
  }
  ASSERT_FALSE(seen.empty());
  for (size_t i = 1; i < seen.size(); ++i) EXPECT_LE(seen[i - 1], seen[i]);
  EXPECT_EQ(seen.back(), total);
  EXPECT_TRUE(HashRanges({}).empty());
}

}  // namespace
}  // namespace tsar
