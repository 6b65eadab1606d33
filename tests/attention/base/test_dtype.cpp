#include <gtest/gtest.h>

#include <cmath>

#include "attn/dtype.hpp"

namespace attn {
namespace {

TEST(DType, Bf16RoundsToNearestEven) {
  EXPECT_EQ(float_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(bf16_to_float(0x3f80), 1.0f);
  // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties to even (1.0)
  EXPECT_EQ(float_to_bf16(1.0f + std::ldexp(1.0f, -8)), 0x3f80);
  EXPECT_EQ(float_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3f82);
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(NAN))));
  EXPECT_EQ(bf16_to_float(float_to_bf16(-INFINITY)), -INFINITY);
}

TEST(DType, F16RoundTripsAndEdges) {
  EXPECT_EQ(float_to_f16(1.0f), 0x3c00);
  EXPECT_EQ(float_to_f16(65504.0f), 0x7bff);
  EXPECT_EQ(float_to_f16(65520.0f), 0x7c00);  // rounds to infinity
  EXPECT_EQ(float_to_f16(std::ldexp(1.0f, -24)), 0x0001);  // smallest subnormal
  EXPECT_EQ(float_to_f16(-2.0f), 0xc000);
  EXPECT_TRUE(std::isnan(f16_to_float(float_to_f16(NAN))));
  for (uint32_t h = 0; h < 0x7c00; ++h)  // every finite positive half survives a round trip
    ASSERT_EQ(float_to_f16(f16_to_float(static_cast<uint16_t>(h))), h) << h;
  EXPECT_EQ(f16_to_float(0x3555), 0.333251953125f);
}

}  // namespace
}  // namespace attn
