// The dtype table of spec §5: codes, sizes and names round-trip.
#include "tsar/dtype.h"

#include <gtest/gtest.h>

namespace tsar {
namespace {

TEST(DType, CodesAreDenseAndRoundTrip) {
  uint16_t expect = 1;
  for (DType dt : kAllDTypes) {
    EXPECT_EQ(static_cast<uint16_t>(dt), expect++);
    EXPECT_EQ(DTypeFromCode(static_cast<uint16_t>(dt)), dt);
    EXPECT_EQ(DTypeFromName(DTypeName(dt)), dt);
  }
  EXPECT_FALSE(DTypeFromCode(0));
  EXPECT_FALSE(DTypeFromCode(expect));
}

TEST(DType, SizesMatchPyTorch) {
  EXPECT_EQ(ElementSize(DType::kBool), 1u);
  EXPECT_EQ(ElementSize(DType::kBFloat16), 2u);
  EXPECT_EQ(ElementSize(DType::kComplex32), 4u);
  EXPECT_EQ(ElementSize(DType::kComplex64), 8u);
  EXPECT_EQ(ElementSize(DType::kComplex128), 16u);
  EXPECT_EQ(ElementSize(DType::kFloat8E4M3FN), 1u);
  EXPECT_EQ(ElementSize(DType::kUInt64), 8u);
}

TEST(DType, AcceptsPyTorchAliases) {
  EXPECT_EQ(DTypeFromName("torch.float"), DType::kFloat32);
  EXPECT_EQ(DTypeFromName("half"), DType::kFloat16);
  EXPECT_EQ(DTypeFromName("long"), DType::kInt64);
  EXPECT_EQ(DTypeFromName("cdouble"), DType::kComplex128);
  EXPECT_FALSE(DTypeFromName("float31"));
}

}  // namespace
}  // namespace tsar
