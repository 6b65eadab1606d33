// SANA's LiteLA and Mix-FFN backwards: the fast float forms against the float64 references
// (tolerance from the plain float32 implementations' errors), the references against central
// finite differences, 1 vs 3 threads bitwise, odd sizes, and bad input.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "attn/sana.hpp"
#include "blocks/gradient_check.hpp"
#include "sana/sana_internal.hpp"
#include "support/expect_error.hpp"

namespace attn {
namespace {

using testing::expect_error;
using testing::expect_finite_differences;
using testing::expect_gradient_close;

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

// every weight of LiteLA and Mix-FFN, in T; the gradients have the same shapes
template <class T>
struct Params {
  int64_t C, h, hd;
  std::vector<T> qkv, proj, proj_b, in, in_b, dw, dw_b, point;
  Params(int64_t c, int64_t hidden, int64_t head_dim) : C(c), h(hidden), hd(head_dim) {
    qkv.resize(3 * C * C), proj.resize(C * C), proj_b.resize(C), in.resize(2 * h * C), in_b.resize(2 * h);
    dw.resize(2 * h * 9), dw_b.resize(2 * h), point.resize(C * h);
  }
  static Params random(int64_t c, int64_t hidden, int64_t head_dim, uint32_t seed) {
    Params p(c, hidden, head_dim);
    const double s = 1.0 / std::sqrt(double(c));
    p.qkv = as<T>(normal<double>(3 * c * c, seed, s));
    p.proj = as<T>(normal<double>(c * c, seed + 1, s));
    p.proj_b = as<T>(normal<double>(c, seed + 2, 0.1));
    p.in = as<T>(normal<double>(2 * hidden * c, seed + 3, s));
    p.in_b = as<T>(normal<double>(2 * hidden, seed + 4, 0.1));
    p.dw = as<T>(normal<double>(2 * hidden * 9, seed + 5, 0.3));
    p.dw_b = as<T>(normal<double>(2 * hidden, seed + 6, 0.1));
    p.point = as<T>(normal<double>(c * hidden, seed + 7, 1.0 / std::sqrt(double(hidden))));
    return p;
  }
  template <class U>
  Params<U> to() const {
    Params<U> p(C, h, hd);
    const auto cv = [](const std::vector<T>& x) { return std::vector<U>(x.begin(), x.end()); };
    p.qkv = cv(qkv), p.proj = cv(proj), p.proj_b = cv(proj_b), p.in = cv(in), p.in_b = cv(in_b), p.dw = cv(dw);
    p.dw_b = cv(dw_b), p.point = cv(point);
    return p;
  }
  LiteLaWeights<T> attention(bool bias = true) const {
    return {{qkv.data(), 3 * C, C}, {proj.data(), C, C}, bias ? std::span<const T>(proj_b) : std::span<const T>(),
            hd, 1e-15};
  }
  MixFfnWeights<T> ffn() const {
    return {{in.data(), 2 * h, C}, in_b, {dw.data(), 2 * h, 9}, dw_b, {point.data(), C, h}};
  }
  LiteLaGradients<T> attention_grads(std::vector<T>& x) { return {x.data(), qkv.data(), proj.data(), proj_b.data()}; }
  MixFfnGradients<T> ffn_grads(std::vector<T>& x) {
    return {x.data(), in.data(), in_b.data(), dw.data(), dw_b.data(), point.data()};
  }
};

struct Sizes {
  int64_t B, H, W, C, h, hd;
  int64_t N() const { return H * W; }
};

TEST(SanaBackward, FastMatchesReferenceOddSizes) {
  // 3 x 5 and 9 x 11 images (99 tokens: a ragged 64-row block), C = 48 in 3 heads of 16, odd h
  for (const Sizes s : {Sizes{2, 3, 5, 48, 27, 16}, Sizes{1, 9, 11, 24, 5, 8}}) {
    SCOPED_TRACE("N=" + std::to_string(s.N()) + " C=" + std::to_string(s.C));
    const int64_t n = s.B * s.N() * s.C;
    const Params<double> pd = Params<double>::random(s.C, s.h, s.hd, 3);
    const Params<float> pf = pd.to<float>();
    const std::vector<double> x = normal<double>(n, 4), dout = normal<double>(n, 5);
    const std::vector<float> xf = as<float>(x), df = as<float>(dout);
    for (bool bias : {true, false}) {
      SCOPED_TRACE(bias ? "lite_la with bias" : "lite_la without bias");
      Params<double> want(s.C, s.h, s.hd);
      Params<float> got(s.C, s.h, s.hd), got1(s.C, s.h, s.hd), plain(s.C, s.h, s.hd);
      std::vector<double> gx(n);
      std::vector<float> gxf(n), gxf1(n), gxp(n);
      lite_la_backward(dout.data(), x.data(), s.B, s.N(), s.C, pd.attention(bias), want.attention_grads(gx));
      lite_la_backward(df.data(), xf.data(), s.B, s.N(), s.C, pf.attention(bias), got.attention_grads(gxf), 3);
      lite_la_backward(df.data(), xf.data(), s.B, s.N(), s.C, pf.attention(bias), got1.attention_grads(gxf1), 1);
      sana::lite_la_backward_plain(df.data(), xf.data(), s.B, s.N(), s.C, pf.attention(bias),
                                   plain.attention_grads(gxp));
      expect_gradient_close("x", gxf, gxf1, gx, gxp);
      expect_gradient_close("qkv", got.qkv, got1.qkv, want.qkv, plain.qkv);
      expect_gradient_close("proj", got.proj, got1.proj, want.proj, plain.proj);
      if (bias) expect_gradient_close("proj_bias", got.proj_b, got1.proj_b, want.proj_b, plain.proj_b);
    }
    {
      SCOPED_TRACE("mix_ffn");
      Params<double> want(s.C, s.h, s.hd);
      Params<float> got(s.C, s.h, s.hd), got1(s.C, s.h, s.hd), plain(s.C, s.h, s.hd);
      std::vector<double> gx(n);
      std::vector<float> gxf(n), gxf1(n), gxp(n);
      mix_ffn_backward(dout.data(), x.data(), s.B, s.N(), s.C, s.H, s.W, pd.ffn(), want.ffn_grads(gx));
      mix_ffn_backward(df.data(), xf.data(), s.B, s.N(), s.C, s.H, s.W, pf.ffn(), got.ffn_grads(gxf), 3);
      mix_ffn_backward(df.data(), xf.data(), s.B, s.N(), s.C, s.H, s.W, pf.ffn(), got1.ffn_grads(gxf1), 1);
      sana::mix_ffn_backward_plain(df.data(), xf.data(), s.B, s.N(), s.C, s.H, s.W, s.h, pf.ffn(),
                                   plain.ffn_grads(gxp));
      expect_gradient_close("x", gxf, gxf1, gx, gxp);
      expect_gradient_close("inverted", got.in, got1.in, want.in, plain.in);
      expect_gradient_close("inverted_bias", got.in_b, got1.in_b, want.in_b, plain.in_b);
      expect_gradient_close("depth", got.dw, got1.dw, want.dw, plain.dw);
      expect_gradient_close("depth_bias", got.dw_b, got1.dw_b, want.dw_b, plain.dw_b);
      expect_gradient_close("point", got.point, got1.point, want.point, plain.point);
    }
  }
}

TEST(SanaBackward, ReferencesMatchFiniteDifferences) {
  const Sizes s{2, 2, 3, 8, 3, 4};  // 2 x 3 image, 2 heads of 4, h = 3
  const int64_t n = s.B * s.N() * s.C;
  Params<double> p = Params<double>::random(s.C, s.h, s.hd, 40);
  std::vector<double> x = normal<double>(n, 41);
  const std::vector<double> dout = normal<double>(n, 42);
  std::vector<double> out(n);
  const auto dot = [&] {
    double t = 0;
    for (int64_t e = 0; e < n; ++e) t += dout[e] * out[e];
    return t;
  };
  {
    SCOPED_TRACE("lite_la");
    Params<double> g(s.C, s.h, s.hd);
    std::vector<double> gx(n);
    lite_la_backward(dout.data(), x.data(), s.B, s.N(), s.C, p.attention(), g.attention_grads(gx));
    const auto loss = [&] {
      lite_la(x.data(), s.B, s.N(), s.C, p.attention(), out.data());
      return dot();
    };
    expect_finite_differences("x", x, gx, loss);
    expect_finite_differences("qkv", p.qkv, g.qkv, loss);
    expect_finite_differences("proj", p.proj, g.proj, loss);
    expect_finite_differences("proj_bias", p.proj_b, g.proj_b, loss);
  }
  {
    SCOPED_TRACE("mix_ffn");
    Params<double> g(s.C, s.h, s.hd);
    std::vector<double> gx(n);
    mix_ffn_backward(dout.data(), x.data(), s.B, s.N(), s.C, s.H, s.W, p.ffn(), g.ffn_grads(gx));
    const auto loss = [&] {
      mix_ffn(x.data(), s.B, s.N(), s.C, s.H, s.W, p.ffn(), out.data());
      return dot();
    };
    expect_finite_differences("x", x, gx, loss);
    expect_finite_differences("inverted", p.in, g.in, loss);
    expect_finite_differences("inverted_bias", p.in_b, g.in_b, loss);
    expect_finite_differences("depth", p.dw, g.dw, loss);
    expect_finite_differences("depth_bias", p.dw_b, g.dw_b, loss);
    expect_finite_differences("point", p.point, g.point, loss);
  }
}

TEST(SanaBackward, EmptyBatchGivesZeroWeightGradients) {
  Params<float> p = Params<float>::random(8, 3, 4, 1), g = Params<float>::random(8, 3, 4, 2);
  std::vector<float> none;
  lite_la_backward(static_cast<const float*>(nullptr), nullptr, 0, 6, 8, p.attention(), g.attention_grads(none));
  mix_ffn_backward(static_cast<const float*>(nullptr), nullptr, 0, 6, 8, 2, 3, p.ffn(), g.ffn_grads(none));
  for (const auto* v : {&g.qkv, &g.proj, &g.proj_b, &g.in, &g.in_b, &g.dw, &g.dw_b, &g.point})
    for (float e : *v) ASSERT_EQ(e, 0.0f);
}

TEST(SanaBackward, BadInputNamesTheArgument) {
  Params<float> p = Params<float>::random(8, 3, 4, 1), g(8, 3, 4);
  const std::vector<float> x = normal<float>(6 * 8, 2);
  std::vector<float> gx(x.size());
  LiteLaGradients<float> lg = g.attention_grads(gx);
  lg.proj_bias = nullptr;
  expect_error([&] { lite_la_backward(x.data(), x.data(), 1, 6, 8, p.attention(), lg); },
               "lite_la_backward: grads.proj_bias is null, but the weights have a proj bias");
  lite_la_backward(x.data(), x.data(), 1, 6, 8, p.attention(false), lg);  // no bias: none needed
  LiteLaWeights<float> bad_heads = p.attention();
  bad_heads.head_dim = 3;
  expect_error([&] { lite_la_backward(x.data(), x.data(), 1, 6, 8, bad_heads, g.attention_grads(gx)); },
               "lite_la_backward: head_dim must divide the channels C = 8, got head_dim = 3");
  MixFfnGradients<float> fg = g.ffn_grads(gx);
  fg.depth = nullptr;
  expect_error([&] { mix_ffn_backward(x.data(), x.data(), 1, 6, 8, 2, 3, p.ffn(), fg); },
               "mix_ffn_backward: grads.depth is null");
  expect_error([&] { mix_ffn_backward(x.data(), x.data(), 1, 6, 8, 3, 3, p.ffn(), g.ffn_grads(gx)); },
               "mix_ffn_backward: tokens must equal height * width = 3 * 3 = 9, got N = 6");
  MixFfnWeights<float> bad_point = p.ffn();
  bad_point.point.cols = 4;
  expect_error([&] { mix_ffn_backward(x.data(), x.data(), 1, 6, 8, 2, 3, bad_point, g.ffn_grads(gx)); },
               "point weight must have shape (C, h)");
  expect_error([&] { mix_ffn_backward(x.data(), x.data(), 1, 6, 8, 2, 3, p.ffn(), g.ffn_grads(gx), -1); },
               "threads must be in [0,");
}

}  // namespace
}  // namespace attn
