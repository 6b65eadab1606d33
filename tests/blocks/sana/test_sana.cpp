// SANA's LiteLA, Mix-FFN and block: float forms against the double references, the
// property tests (token permutation, centre-only depthwise kernel = token-wise GLU MLP, an impulse
// moves outputs only in its 3 x 3 neighbourhood) and bad input.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "attn/sana.hpp"
#include "support/expect_error.hpp"

namespace attn {
namespace {

using testing::expect_error;

template <class T>
std::vector<T> normal(size_t n, uint32_t seed, double scale = 1.0) {
  std::mt19937 gen(seed);
  std::normal_distribution<double> d(0.0, scale);
  std::vector<T> v(n);
  for (T& x : v) x = static_cast<T>(d(gen));
  return v;
}

template <class T>
std::vector<T> as(const std::vector<double>& x) {
  return std::vector<T>(x.begin(), x.end());
}

// All weights of a block with C channels and hidden h, as double, and views of them in T.
struct Params {
  int64_t C, h;
  std::vector<double> qkv, proj, proj_b, in, in_b, dw, dw_b, point;
  Params(int64_t c, int64_t hidden, uint32_t seed) : C(c), h(hidden) {
    const double s = 1.0 / std::sqrt(double(c));
    qkv = normal<double>(3 * C * C, seed, s);
    proj = normal<double>(C * C, seed + 1, s);
    proj_b = normal<double>(C, seed + 2, 0.1);
    in = normal<double>(2 * h * C, seed + 3, s);
    in_b = normal<double>(2 * h, seed + 4, 0.1);
    dw = normal<double>(2 * h * 9, seed + 5, 0.3);
    dw_b = normal<double>(2 * h, seed + 6, 0.1);
    point = normal<double>(C * h, seed + 7, 1.0 / std::sqrt(double(h)));
  }
};

template <class T>
struct Views {
  std::vector<T> qkv, proj, proj_b, in, in_b, dw, dw_b, point;
  explicit Views(const Params& p)
      : qkv(as<T>(p.qkv)), proj(as<T>(p.proj)), proj_b(as<T>(p.proj_b)), in(as<T>(p.in)), in_b(as<T>(p.in_b)),
        dw(as<T>(p.dw)), dw_b(as<T>(p.dw_b)), point(as<T>(p.point)) {}
  LiteLaWeights<T> attention(int64_t C) const {
    return {{qkv.data(), 3 * C, C}, {proj.data(), C, C}, proj_b, 32, 1e-15};
  }
  MixFfnWeights<T> ffn(int64_t C, int64_t h) const {
    return {{in.data(), 2 * h, C}, in_b, {dw.data(), 2 * h, 9}, dw_b, {point.data(), C, h}};
  }
};

double silu(double x) { return x / (1 + std::exp(-x)); }

TEST(Sana, FloatFormsMatchDoubleReferences) {
  const int64_t B = 2, H = 3, W = 5, N = H * W, C = 64, h = 160;
  const Params p(C, h, 1);
  const Views<double> wd(p);
  const Views<float> wf(p);
  const std::vector<double> x = normal<double>(B * N * C, 20);
  const std::vector<float> xf = as<float>(x);
  std::vector<double> want(x.size());
  std::vector<float> got(x.size()), got1(x.size());
  const auto compare = [&](double tol) {
    double worst = 0, scale = 0;
    for (size_t e = 0; e < x.size(); ++e) {
      worst = std::max(worst, std::fabs(got[e] - want[e]));
      scale = std::max(scale, std::fabs(want[e]));
      ASSERT_EQ(got[e], got1[e]) << "thread count changed element " << e;
    }
    EXPECT_LT(worst, tol * scale);
    EXPECT_GT(scale, 0.1);
  };
  lite_la(x.data(), B, N, C, wd.attention(C), want.data());
  lite_la(xf.data(), B, N, C, wf.attention(C), got.data(), 2);
  lite_la(xf.data(), B, N, C, wf.attention(C), got1.data(), 1);
  compare(1e-5);
  mix_ffn(x.data(), B, N, C, H, W, wd.ffn(C, h), want.data());
  mix_ffn(xf.data(), B, N, C, H, W, wf.ffn(C, h), got.data(), 2);
  mix_ffn(xf.data(), B, N, C, H, W, wf.ffn(C, h), got1.data(), 1);
  compare(1e-5);
  sana_block(x.data(), B, N, C, H, W, wd.attention(C), wd.ffn(C, h), want.data());
  sana_block(xf.data(), B, N, C, H, W, wf.attention(C), wf.ffn(C, h), got.data(), 2);
  sana_block(xf.data(), B, N, C, H, W, wf.attention(C), wf.ffn(C, h), got1.data(), 1);
  compare(1e-5);
  // the block is the composition of the two pieces attn/sana.hpp states
  std::vector<double> ln(x.size()), y(x.size()), f(x.size());
  const auto norm = [&](const double* src) {
    for (int64_t r = 0; r < B * N; ++r) {
      double m = 0, v = 0;
      for (int64_t c = 0; c < C; ++c) m += src[r * C + c] / C;
      for (int64_t c = 0; c < C; ++c) v += (src[r * C + c] - m) * (src[r * C + c] - m) / C;
      for (int64_t c = 0; c < C; ++c) ln[r * C + c] = (src[r * C + c] - m) / std::sqrt(v + 1e-6);
    }
  };
  norm(x.data());
  lite_la(ln.data(), B, N, C, wd.attention(C), y.data());
  for (size_t e = 0; e < x.size(); ++e) y[e] += x[e];
  norm(y.data());
  mix_ffn(ln.data(), B, N, C, H, W, wd.ffn(C, h), f.data());
  for (size_t e = 0; e < x.size(); ++e) EXPECT_NEAR(want[e], y[e] + f[e], 1e-12);
}

TEST(Sana, LiteLaPermutingTokensPermutesOutputAndZeroQueriesGiveBias) {
  const int64_t N = 11, C = 32;
  const Params p(C, 80, 2);
  const Views<float> wf(p);
  const std::vector<float> x = normal<float>(N * C, 21);
  std::vector<int64_t> perm(N);
  for (int64_t i = 0; i < N; ++i) perm[i] = (i * 4 + 3) % N;
  std::vector<float> xp(x.size()), out(x.size()), outp(x.size());
  for (int64_t i = 0; i < N; ++i)
    for (int64_t c = 0; c < C; ++c) xp[i * C + c] = x[perm[i] * C + c];
  lite_la(x.data(), 1, N, C, wf.attention(C), out.data());
  lite_la(xp.data(), 1, N, C, wf.attention(C), outp.data());
  for (int64_t i = 0; i < N; ++i)
    for (int64_t c = 0; c < C; ++c) EXPECT_NEAR(outp[i * C + c], out[perm[i] * C + c], 1e-5);
  // q = 0 for every token: relu(q) = 0, the attention output is 0 (not NaN), the result the bias
  Views<float> zq(p);
  std::fill(zq.qkv.begin(), zq.qkv.begin() + C * C, 0.0f);
  lite_la(x.data(), 1, N, C, zq.attention(C), out.data());
  for (int64_t i = 0; i < N; ++i)
    for (int64_t c = 0; c < C; ++c) EXPECT_FLOAT_EQ(out[i * C + c], zq.proj_b[c]);
}

TEST(Sana, CentreOnlyDepthwiseKernelMakesMixFfnATokenwiseGluMlp) {
  const int64_t H = 4, W = 3, N = H * W, C = 8, h = 20;
  Params p(C, h, 3);
  for (int64_t c = 0; c < 2 * h; ++c)
    for (int64_t t = 0; t < 9; ++t)
      if (t != 4) p.dw[c * 9 + t] = 0.0;
  const Views<float> wf(p);
  const std::vector<double> x = normal<double>(N * C, 22);
  const std::vector<float> xf = as<float>(x);
  std::vector<float> out(x.size());
  mix_ffn(xf.data(), 1, N, C, H, W, wf.ffn(C, h), out.data());
  for (int64_t n = 0; n < N; ++n) {
    std::vector<double> d(2 * h);
    for (int64_t c = 0; c < 2 * h; ++c) {
      double s = p.in_b[c];
      for (int64_t k = 0; k < C; ++k) s += p.in[c * C + k] * x[n * C + k];
      d[c] = p.dw[c * 9 + 4] * silu(s) + p.dw_b[c];
    }
    for (int64_t c = 0; c < C; ++c) {
      double s = 0;
      for (int64_t k = 0; k < h; ++k) s += p.point[c * h + k] * d[k] * silu(d[h + k]);
      EXPECT_NEAR(out[n * C + c], s, 1e-5) << n << ", " << c;
    }
  }
}

TEST(Sana, ImpulseMovesMixFfnOutputsOnlyInItsNeighbourhood) {
  const int64_t H = 5, W = 6, N = H * W, C = 4, h = 10;
  const Params p(C, h, 4);
  const Views<float> wf(p);
  const std::vector<float> x(N * C, 0.0f);
  std::vector<float> xi = x, out(x.size()), outi(x.size());
  const int64_t py = 2, px = 4;
  for (int64_t c = 0; c < C; ++c) xi[(py * W + px) * C + c] = 3.0f;
  mix_ffn(x.data(), 1, N, C, H, W, wf.ffn(C, h), out.data());
  mix_ffn(xi.data(), 1, N, C, H, W, wf.ffn(C, h), outi.data());
  for (int64_t y = 0; y < H; ++y)
    for (int64_t xx = 0; xx < W; ++xx) {
      bool moved = false;
      for (int64_t c = 0; c < C; ++c) moved |= out[(y * W + xx) * C + c] != outi[(y * W + xx) * C + c];
      const bool near = std::abs(y - py) <= 1 && std::abs(xx - px) <= 1;
      EXPECT_EQ(moved, near) << "pixel (" << y << ", " << xx << ")";
    }
}

TEST(Sana, BadInputNamesTheArgument) {
  const int64_t C = 32, h = 80, N = 6;
  const Params p(C, h, 5);
  const Views<float> wf(p);
  const std::vector<float> x(N * C, 0.5f);
  std::vector<float> out(x.size());
  expect_error([&] { mix_ffn(x.data(), 1, N, C, 2, 2, wf.ffn(C, h), out.data()); },
               "tokens must equal height * width = 2 * 2 = 4, got N = 6");
  expect_error([&] { mix_ffn(x.data(), 1, N, C, 2, 3, wf.ffn(C, h - 1), out.data()); },
               "inverted bias must have 2h = 158 values, got 160");
  auto ffn = wf.ffn(C, h);
  ffn.point.cols = h + 1;
  expect_error([&] { mix_ffn(x.data(), 1, N, C, 2, 3, ffn, out.data()); },
               "point weight must have shape (C, h) = (32, 80), got (32, 81)");
  ffn = wf.ffn(C, h);
  ffn.depth_bias = ffn.depth_bias.subspan(1);
  expect_error([&] { mix_ffn(x.data(), 1, N, C, 2, 3, ffn, out.data()); },
               "depth bias must have 2h = 160 values, got 159");
  auto att = wf.attention(C);
  att.head_dim = 24;
  expect_error([&] { lite_la(x.data(), 1, N, C, att, out.data()); },
               "head_dim must divide the channels C = 32, got head_dim = 24");
  att = wf.attention(C);
  att.qkv.rows = C;
  expect_error([&] { lite_la(x.data(), 1, N, C, att, out.data()); },
               "qkv weight must have shape (3 C, C) = (96, 32), got (32, 32)");
  expect_error([&] { sana_block(x.data(), 1, N, C, 3, 3, wf.attention(C), wf.ffn(C, h), out.data()); },
               "sana_block: tokens must equal height * width");
}

}  // namespace
}  // namespace attn
