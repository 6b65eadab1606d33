#include <gtest/gtest.h>

#include "attn/error.hpp"
#include "attn/tensor.hpp"
#include "base/checked_math.hpp"

namespace attn {
namespace {

TEST(TensorView, LayoutsAndStrides) {
  float x = 0;
  const auto a = make_view(&x, DType::f32, 2, 3, 5, 7, Layout::bhnd);
  EXPECT_EQ(a.strides, (std::array<int64_t, 4>{105, 35, 7, 1}));
  const auto b = make_view(&x, DType::f32, 2, 3, 5, 7, Layout::bnhd);
  EXPECT_EQ(b.strides, (std::array<int64_t, 4>{105, 7, 21, 1}));
  EXPECT_EQ(b.offset(1, 2, 4, 6), 105 + 14 + 84 + 6);
}

// Offsets are 64-bit: products above 2^31 and 2^32 come out exact (no allocation needed).
TEST(TensorView, OffsetsBeyondTwoToThe32) {
  float x = 0;
  const auto v = make_view(&x, DType::f32, 1, 8, int64_t{1} << 20, 1024, Layout::bnhd);
  const int64_t want = ((int64_t{1} << 20) - 1) * 8 * 1024 + 7 * 1024 + 1023;
  EXPECT_GT(want, int64_t{1} << 32);
  EXPECT_EQ(v.offset(0, 7, (int64_t{1} << 20) - 1, 1023), want);
  EXPECT_EQ(v.numel(), int64_t{1} << 33);
}

TEST(CheckedMath, ReportsOverflow) {
  EXPECT_EQ(checked_mul(int64_t{1} << 31, int64_t{1} << 31, "x"), int64_t{1} << 62);
  EXPECT_THROW(checked_mul(int64_t{1} << 32, int64_t{1} << 32, "x"), Error);
  EXPECT_THROW(checked_add(INT64_MAX, 1, "x"), Error);
}

TEST(Tensor, OwnsZeroedAlignedStorage) {
  Tensor t(DType::bf16, {1, 2, 3, 4}, Layout::bnhd);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(t.view().data) % 64, 0u);
  EXPECT_EQ(t.at(0, 1, 2, 3), 0.0f);
  EXPECT_THROW(Tensor(DType::f32, {-1, 1, 1, 1}), Error);
}

}  // namespace
}  // namespace attn
