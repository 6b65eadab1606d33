// Mixture-of-experts backward: the float64 reference against central finite differences of the
// forward (output and auxiliary loss), the gathered float32 form against the reference (error at
// most 3x the plain float32 loop's, plus a floor), 1 vs 3 threads bitwise, odd sizes (experts
// with fewer and with more than 16 tokens, top_k = E, one token), unchosen experts, bad input.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "attn/moe.hpp"
#include "model/moe_backward.hpp"
#include "support/expect_error.hpp"

namespace attn {
namespace {

using testing::expect_error;

struct Inputs {
  std::vector<double> x, router, w1, w2, w3, dy;
};

Inputs random_inputs(const MoeSizes& z, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<double> nd(0.0, 1.0);
  auto fill = [&](int64_t count, double sd) {
    std::vector<double> v(static_cast<size_t>(count));
    for (double& a : v) a = sd * nd(gen);
    return v;
  };
  Inputs in;
  in.x = fill(z.tokens * z.dim, 1.0);
  in.router = fill(z.experts * z.dim, 1.0 / std::sqrt(double(z.dim)));
  in.w1 = fill(z.experts * z.hidden * z.dim, 1.0 / std::sqrt(double(z.dim)));
  in.w3 = fill(z.experts * z.hidden * z.dim, 1.0 / std::sqrt(double(z.dim)));
  in.w2 = fill(z.experts * z.dim * z.hidden, 1.0 / std::sqrt(double(z.hidden)));
  in.dy = fill(z.tokens * z.dim, 1.0);
  return in;
}

template <class T>
struct Grads {
  std::vector<T> dx, drouter, dw1, dw2, dw3;
  explicit Grads(const MoeSizes& z)
      : dx(static_cast<size_t>(z.tokens * z.dim)), drouter(static_cast<size_t>(z.experts * z.dim)),
        dw1(static_cast<size_t>(z.experts * z.hidden * z.dim)), dw2(dw1.size()), dw3(dw1.size()) {}
  MoeGradients<T> spans() { return {dx, drouter, dw1, dw2, dw3}; }
  std::vector<std::vector<double>> all() const {
    return {{dx.begin(), dx.end()},
            {drouter.begin(), drouter.end()},
            {dw1.begin(), dw1.end()},
            {dw2.begin(), dw2.end()},
            {dw3.begin(), dw3.end()}};
  }
};
const char* kNames[] = {"dx", "drouter", "dw1", "dw2", "dw3"};

std::vector<float> f32(const std::vector<double>& v) { return {v.begin(), v.end()}; }

Grads<double> reference(const MoeSizes& z, const Inputs& in, double daux) {
  Grads<double> g(z);
  moe_feed_forward_backward(z, std::span<const double>(in.dy), daux, in.x, in.router, in.w1, in.w2, in.w3, g.spans());
  return g;
}

Grads<float> fast(const MoeSizes& z, const Inputs& in, double daux, int threads) {
  const auto dy = f32(in.dy), x = f32(in.x), r = f32(in.router), w1 = f32(in.w1), w2 = f32(in.w2), w3 = f32(in.w3);
  Grads<float> g(z);
  moe_feed_forward_backward(z, std::span<const float>(dy), daux, x, r, w1, w2, w3, g.spans(), threads);
  return g;
}

// The plain loop in float32: the baseline of the error rule.
Grads<float> plain32(const MoeSizes& z, const Inputs& in, double daux) {
  const auto dy = f32(in.dy), x = f32(in.x), r = f32(in.router), w1 = f32(in.w1), w2 = f32(in.w2), w3 = f32(in.w3);
  Grads<float> g(z);
  model::moe_backward_plain<float>(z, dy.data(), daux, x.data(), r.data(), w1.data(), w2.data(), w3.data(),
                                   g.dx.data(), g.drouter.data(), g.dw1.data(), g.dw2.data(), g.dw3.data());
  return g;
}

double max_diff(const std::vector<double>& a, const std::vector<double>& b) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::abs(a[i] - b[i]));
  return m;
}
double max_abs(const std::vector<double>& a) {
  double m = 0;
  for (double v : a) m = std::max(m, std::abs(v));
  return m;
}

// L = <dy, y> + daux * aux, in float64.
double objective(const MoeSizes& z, const Inputs& in, double daux) {
  std::vector<double> y(static_cast<size_t>(z.tokens * z.dim));
  const double aux = moe_feed_forward(z, std::span<const double>(in.x), in.router, in.w1, in.w2, in.w3,
                                      std::span<double>(y));
  double l = daux * aux;
  for (size_t i = 0; i < y.size(); ++i) l += in.dy[i] * y[i];
  return l;
}

TEST(MoeBackward, ReferenceMatchesCentralFiniteDifferences) {
  for (const MoeSizes z : {MoeSizes{6, 5, 4, 3, 2}, MoeSizes{3, 4, 3, 5, 3}, MoeSizes{5, 3, 5, 2, 1}}) {
    for (const double daux : {0.0, 250.0}) {  // a large daux so the aux term is visible beside <dy, y>
      Inputs in = random_inputs(z, 11 + static_cast<uint32_t>(z.experts));
      const Grads<double> g = reference(z, in, daux);
      const auto grads = g.all();
      std::vector<double>* vars[] = {&in.x, &in.router, &in.w1, &in.w2, &in.w3};
      const double h = 1e-6;
      for (int which = 0; which < 5; ++which) {
        std::vector<double>& v = *vars[which];
        double worst = 0;
        for (size_t i = 0; i < v.size(); ++i) {
          const double keep = v[i];
          v[i] = keep + h;
          const double up = objective(z, in, daux);
          v[i] = keep - h;
          const double down = objective(z, in, daux);
          v[i] = keep;
          worst = std::max(worst, std::abs((up - down) / (2 * h) - grads[which][i]));
        }
        // central differences err by O(h^2 f''') + O(eps f / h) ~ 1e-9 here
        EXPECT_LT(worst, 1e-7 * (1 + max_abs(grads[which]))) << kNames[which] << " daux " << daux;
      }
    }
  }
}

TEST(MoeBackward, Float32WithinThreeTimesThePlainLoopsErrorAndThreadCountChangesNoBit) {
  // (tokens, dim, experts, hidden, top_k): experts with < 16 tokens (the forward's few-row path)
  // and with more; odd sizes; top_k = E; one token.
  for (const MoeSizes z : {MoeSizes{37, 23, 5, 19, 2}, MoeSizes{70, 40, 7, 67, 3}, MoeSizes{1, 9, 3, 5, 1},
                           MoeSizes{20, 16, 4, 33, 4}, MoeSizes{90, 17, 3, 130, 2}}) {
    const Inputs in = random_inputs(z, 5 + static_cast<uint32_t>(z.tokens));
    const double daux = 3.0;
    const auto ref = reference(z, in, daux).all();
    const auto plain = plain32(z, in, daux).all();
    const Grads<float> one = fast(z, in, daux, 1), three = fast(z, in, daux, 3);
    const auto f = one.all();
    EXPECT_EQ(0, std::memcmp(one.dx.data(), three.dx.data(), one.dx.size() * sizeof(float)));
    EXPECT_EQ(0, std::memcmp(one.drouter.data(), three.drouter.data(), one.drouter.size() * sizeof(float)));
    EXPECT_EQ(0, std::memcmp(one.dw1.data(), three.dw1.data(), one.dw1.size() * sizeof(float)));
    EXPECT_EQ(0, std::memcmp(one.dw2.data(), three.dw2.data(), one.dw2.size() * sizeof(float)));
    EXPECT_EQ(0, std::memcmp(one.dw3.data(), three.dw3.data(), one.dw3.size() * sizeof(float)));
    for (int i = 0; i < 5; ++i) {
      // Floor: 1e-5 of max(1, the gradient's largest magnitude), as the linear family's gradient
      // tests: the router's gradient p (dp - sum p dp) cancels, and with one token the plain loop's
      // error can be a lucky 1e-9 where reordered float32 sums give 3e-8.
      const double bound = 3 * max_diff(plain[static_cast<size_t>(i)], ref[static_cast<size_t>(i)]) +
                           1e-5 * std::max(1.0, max_abs(ref[static_cast<size_t>(i)]));
      EXPECT_LE(max_diff(f[static_cast<size_t>(i)], ref[static_cast<size_t>(i)]), bound)
          << kNames[i] << " tokens " << z.tokens;
      EXPECT_GT(max_abs(ref[static_cast<size_t>(i)]), 0.0) << kNames[i];
    }
  }
}

TEST(MoeBackward, ExpertsNoTokenChoseGetZeroGradients) {
  const MoeSizes z{8, 6, 5, 7, 2};  // top_k 2: with top_k 1 the weight is p / p = 1, no router gradient
  Inputs in = random_inputs(z, 3);
  // router row 4 far below the others: expert 4 is never chosen (the others' logits >= ~10)
  for (int64_t c = 0; c < z.dim; ++c) in.router[static_cast<size_t>(4 * z.dim + c)] = 0;
  for (int64_t t = 0; t < z.tokens; ++t) in.x[static_cast<size_t>(t * z.dim)] = 1.0 + std::abs(in.x[t * z.dim]);
  for (int64_t e = 0; e < 4; ++e) in.router[static_cast<size_t>(e * z.dim)] = 10.0 + e;
  const auto ref = reference(z, in, 0.0);
  const auto f = fast(z, in, 0.0, 2);
  const int64_t m = z.hidden * z.dim;
  for (int64_t i = 4 * m; i < 5 * m; ++i) {
    EXPECT_EQ(ref.dw1[static_cast<size_t>(i)], 0.0);
    EXPECT_EQ(ref.dw2[static_cast<size_t>(i)], 0.0);
    EXPECT_EQ(f.dw1[static_cast<size_t>(i)], 0.0f);
    EXPECT_EQ(f.dw3[static_cast<size_t>(i)], 0.0f);
  }
  // its router row still gets a gradient: its probability enters every softmax
  double row = 0;
  for (int64_t c = 0; c < z.dim; ++c) row += std::abs(ref.drouter[static_cast<size_t>(4 * z.dim + c)]);
  EXPECT_GT(row, 0.0);
}

TEST(MoeBackward, NoTokensGiveZeroWeightGradients) {
  const MoeSizes z{0, 4, 3, 5, 2};
  const Inputs in = random_inputs(z, 1);
  const auto f = fast(z, in, 1.0, 2);
  const auto r = reference(z, in, 1.0);
  for (float v : f.dw1) EXPECT_EQ(v, 0.0f);
  for (double v : r.drouter) EXPECT_EQ(v, 0.0);
}

TEST(MoeBackward, BadInputIsAnErrorNamingTheArgument) {
  const MoeSizes z{3, 4, 3, 5, 2};
  const Inputs in = random_inputs(z, 1);
  const auto dy = f32(in.dy), x = f32(in.x), r = f32(in.router), w1 = f32(in.w1), w2 = f32(in.w2), w3 = f32(in.w3);
  Grads<float> g(z);
  MoeSizes bad = z;
  bad.top_k = 4;
  expect_error([&] { moe_feed_forward_backward(bad, std::span<const float>(dy), 0, x, r, w1, w2, w3, g.spans()); },
               "moe_feed_forward_backward: top_k must be in [1, experts = 3], got 4");
  expect_error([&] {
    moe_feed_forward_backward(z, std::span<const float>(dy.data(), 11), 0, x, r, w1, w2, w3, g.spans());
  }, "dy must hold tokens x dim = 12 values, got 11");
  Grads<float> short_g(z);
  short_g.dw2.resize(59);
  expect_error([&] { moe_feed_forward_backward(z, std::span<const float>(dy), 0, x, r, w1, w2, w3, short_g.spans()); },
               "dw2 must hold experts x dim x hidden = 60 values, got 59");
  expect_error([&] { moe_feed_forward_backward(z, std::span<const float>(dy), 0, x, r, w1, w2, w3, g.spans(), 300); },
               "threads must be in [0, 256], got 300");
  std::vector<float> xx = x;
  MoeGradients<float> alias = g.spans();
  alias.dx = std::span<float>(xx);
  expect_error([&] { moe_feed_forward_backward(z, std::span<const float>(dy), 0, xx, r, w1, w2, w3, alias); },
               "dx must not overlap x");
  Grads<double> g64(z);
  g64.drouter.resize(1);
  expect_error([&] {
    moe_feed_forward_backward(z, std::span<const double>(in.dy), 0, in.x, in.router, in.w1, in.w2, in.w3, g64.spans());
  }, "drouter must hold experts x dim = 12 values, got 1");
}

}  // namespace
}  // namespace attn
