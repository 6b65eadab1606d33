// RoPE against its float64 reference, by hand, and by its defining property: after rotation,
// q_i . k_j depends on i - j only.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "support/expect_error.hpp"
#include "attn/rope.hpp"
#include "support/random_inputs.hpp"

namespace attn {
namespace {

double max_abs(const std::vector<double>& v) {
  double m = 0;
  for (double x : v) m = std::max(m, std::abs(x));
  return m;
}

TEST(Rope, MatchesTheReference) {
  std::mt19937 rng(9);
  for (DType dt : {DType::f32, DType::bf16, DType::f16})
    for (RopeStyle style : {RopeStyle::half, RopeStyle::interleaved})
      for (int64_t D : {2, 8, 64, 66})
        for (int64_t rot : {int64_t{0}, D / 2 - (D / 2) % 2}) {
          auto x = testing::random_tensor(rng, dt, 2, 3, 37, D, Layout::bnhd, 2.0f, 3);
          Rope r;
          r.style = style, r.rotary_dim = rot, r.offset = 1000, r.theta = D == 66 ? 1e6 : 10000;
          const std::vector<int64_t> batch_offsets{0, 123456789};
          const auto want = rope_reference(x.view, r, batch_offsets);
          apply_rope(x.view, r, batch_offsets);
          const double scale = std::max(1.0, max_abs(want));
          const double tol = dt == DType::f32 ? 1e-6 * scale : (dt == DType::bf16 ? 0x1p-8 : 0x1p-11) * scale;
          double err = 0;
          for (int64_t b = 0; b < 2; ++b)
            for (int64_t h = 0; h < 3; ++h)
              for (int64_t n = 0; n < 37; ++n)
                for (int64_t c = 0; c < D; ++c)
                  err = std::max(err, std::abs(x.view.at(b, h, n, c) - want[static_cast<size_t>(((b * 3 + h) * 37 + n) * D + c)]));
          EXPECT_LE(err, tol) << dtype_name(dt) << " " << to_string(style) << " D " << D << " rotary " << rot;
        }
}

TEST(Rope, ByHand) {
  std::vector<float> x = {1, 0, 0, 1};  // two tokens, D = 2
  TensorView v = make_view(x.data(), DType::f32, 1, 1, 2, 2);
  Rope r;
  r.offset = 1;  // positions 1 and 2; one pair, angle = position
  apply_rope(v, r);
  EXPECT_NEAR(x[0], std::cos(1.0), 1e-7);
  EXPECT_NEAR(x[1], std::sin(1.0), 1e-7);
  EXPECT_NEAR(x[2], -std::sin(2.0), 1e-7);
  EXPECT_NEAR(x[3], std::cos(2.0), 1e-7);
}

TEST(Rope, PositionZeroIsTheIdentityAndOnlyRotaryChannelsMove) {
  std::mt19937 rng(2);
  auto x = testing::random_tensor(rng, DType::f32, 1, 2, 1, 16);
  auto before = x.bytes;
  apply_rope(x.view, Rope{});  // one token at position 0
  EXPECT_EQ(before, x.bytes);
  auto y = testing::random_tensor(rng, DType::f32, 1, 2, 5, 16);
  before = y.bytes;
  Rope r;
  r.rotary_dim = 6, r.offset = 7;
  apply_rope(y.view, r);
  for (int64_t h = 0; h < 2; ++h)
    for (int64_t n = 0; n < 5; ++n)
      for (int64_t c = 6; c < 16; ++c)
        EXPECT_EQ(y.view.at(0, h, n, c), reinterpret_cast<const float*>(before.data())[y.view.offset(0, h, n, c)]);
}

TEST(Rope, ScoresDependOnRelativePositionOnly) {
  std::mt19937 rng(4);
  for (RopeStyle style : {RopeStyle::half, RopeStyle::interleaved}) {
    auto q = testing::random_tensor(rng, DType::f32, 1, 1, 1, 32);
    auto k = testing::random_tensor(rng, DType::f32, 1, 1, 1, 32);
    auto dot_at = [&](int64_t qi, int64_t kj) {
      auto qq = q, kk = k;
      qq.view.data = qq.bytes.data(), kk.view.data = kk.bytes.data();
      Rope r;
      r.style = style;
      r.offset = qi;
      apply_rope(qq.view, r);
      r.offset = kj;
      apply_rope(kk.view, r);
      double s = 0;
      for (int64_t c = 0; c < 32; ++c) s += double(qq.view.at(0, 0, 0, c)) * kk.view.at(0, 0, 0, c);
      return s;
    };
    EXPECT_NEAR(dot_at(10, 3), dot_at(1010, 1003), 1e-4);
    EXPECT_NEAR(dot_at(5, 5), dot_at(0, 0), 1e-5);
  }
}

TEST(Rope, BadArgumentsAreNamed) {
  std::vector<float> x(2 * 6, 1.0f);
  TensorView v = make_view(x.data(), DType::f32, 1, 1, 2, 6);
  auto expect = [&](Rope r, std::vector<int64_t> offs, const char* fragment) {
    testing::expect_error([&] { apply_rope(v, r, offs); }, fragment);
  };
  Rope r;
  r.rotary_dim = 3;
  expect(r, {}, "rotary_dim must be even and in [0, D = 6]");
  r = {};
  r.theta = 1.0;
  expect(r, {}, "theta must be a finite number > 1");
  expect(Rope{}, {1, 2}, "batch_offsets must have one value per batch (1), got 2");
  r = {};
  r.offset = -1;
  expect(r, {}, "offset gives positions outside [0, 2^40]");
  expect(Rope{}, {int64_t{1} << 41}, "batch_offsets[0] gives positions outside");
}

}  // namespace
}  // namespace attn
