// Little-endian helpers (spec §2) at boundary values.
#include "format/endian.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

namespace tsar::format {
namespace {

TEST(Endian, StoresLittleEndianBytes) {
  uint8_t b[8];
  StoreU32(b, 0x01020304u);
  EXPECT_EQ(b[0], 0x04);
  EXPECT_EQ(b[3], 0x01);
  StoreU64(b, 0x0102030405060708ull);
  EXPECT_EQ(b[0], 0x08);
  EXPECT_EQ(b[7], 0x01);
  StoreU16(b, 0xABCD);
  EXPECT_EQ(b[0], 0xCD);
  EXPECT_EQ(b[1], 0xAB);
}

TEST(Endian, RoundTripsBoundaries) {
  uint8_t b[8];
  for (uint64_t v : {uint64_t{0}, uint64_t{1}, uint64_t{0x7F}, uint64_t{0x80}, uint64_t{0xFFFFFFFF},
                     uint64_t{1} << 32, uint64_t{INT64_MAX}, UINT64_MAX}) {
    StoreU64(b, v);
    EXPECT_EQ(LoadU64(b), v);
    StoreU32(b, static_cast<uint32_t>(v));
    EXPECT_EQ(LoadU32(b), static_cast<uint32_t>(v));
    StoreU16(b, static_cast<uint16_t>(v));
    EXPECT_EQ(LoadU16(b), static_cast<uint16_t>(v));
  }
}

TEST(Endian, DoublesTravelAsBits) {
  for (double d : {0.0, -0.0, 1.5, -2.25e300, std::numeric_limits<double>::infinity(),
                   std::numeric_limits<double>::denorm_min()}) {
    EXPECT_EQ(DoubleToBits(BitsToDouble(DoubleToBits(d))), DoubleToBits(d));
  }
  EXPECT_EQ(DoubleToBits(1.0), 0x3FF0000000000000ull);
  EXPECT_TRUE(std::isnan(BitsToDouble(0x7FF8000000000000ull)));
}

}  // namespace
}  // namespace tsar::format
