// Mixture-of-experts feed-forward (MiniMax-01's): the gathered float32 form against the float64
// per-token reference, and the worked cases (weights sum to 1, identical experts, the
// auxiliary loss of uniform routing, ties to the lower id, bad input).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "attn/moe.hpp"
#include "support/expect_error.hpp"

namespace attn {
namespace {

using testing::expect_error;

struct Weights {
  std::vector<double> x, router, w1, w2, w3;
};

Weights random_weights(const MoeSizes& z, uint32_t seed, double router_scale = 1.0) {
  std::mt19937 gen(seed);
  std::normal_distribution<double> nd(0.0, 1.0);
  auto fill = [&](int64_t count, double sd) {
    std::vector<double> v(static_cast<size_t>(count));
    for (double& a : v) a = sd * nd(gen);
    return v;
  };
  Weights w;
  w.x = fill(z.tokens * z.dim, 1.0);
  w.router = fill(z.experts * z.dim, router_scale / std::sqrt(static_cast<double>(z.dim)));
  w.w1 = fill(z.experts * z.hidden * z.dim, 1.0 / std::sqrt(static_cast<double>(z.dim)));
  w.w3 = fill(z.experts * z.hidden * z.dim, 1.0 / std::sqrt(static_cast<double>(z.dim)));
  w.w2 = fill(z.experts * z.dim * z.hidden, 1.0 / std::sqrt(static_cast<double>(z.hidden)));
  return w;
}

std::vector<float> to_float(const std::vector<double>& v) { return {v.begin(), v.end()}; }

struct RefRun {
  std::vector<double> y;
  double aux;
  MoeRouting<double> routing;
};

RefRun reference(const MoeSizes& z, const Weights& w) {
  RefRun r;
  r.y.resize(static_cast<size_t>(z.tokens * z.dim));
  r.aux = moe_feed_forward(z, std::span<const double>(w.x), w.router, w.w1, w.w2, w.w3, std::span<double>(r.y), 0,
                           &r.routing);
  return r;
}

struct FastRun {
  std::vector<float> y;
  double aux;
  MoeRouting<float> routing;
};

FastRun fast(const MoeSizes& z, const Weights& w, int threads) {
  const std::vector<float> x = to_float(w.x), router = to_float(w.router), w1 = to_float(w.w1), w2 = to_float(w.w2),
                           w3 = to_float(w.w3);
  FastRun r;
  r.y.resize(static_cast<size_t>(z.tokens * z.dim));
  r.aux = moe_feed_forward(z, std::span<const float>(x), router, w1, w2, w3, std::span<float>(r.y), threads,
                           &r.routing);
  return r;
}

TEST(Moe, GatheredFloat32MatchesFloat64ReferenceOnOddShapes) {
  for (const MoeSizes z : {MoeSizes{37, 23, 5, 19, 2}, MoeSizes{70, 40, 7, 67, 3}, MoeSizes{1, 9, 3, 5, 1},
                           MoeSizes{20, 16, 4, 33, 4}}) {
    const Weights w = random_weights(z, 7);
    const RefRun ref = reference(z, w);
    const FastRun one = fast(z, w, 1), two = fast(z, w, 2);
    ASSERT_EQ(one.routing.ids, two.routing.ids);
    EXPECT_EQ(0, std::memcmp(one.y.data(), two.y.data(), one.y.size() * sizeof(float))) << "threads change bits";
    EXPECT_EQ(one.aux, two.aux);
    for (size_t i = 0; i < one.routing.ids.size(); ++i) EXPECT_EQ(one.routing.ids[i], ref.routing.ids[i]) << i;
    double scale = 0;
    for (double v : ref.y) scale = std::max(scale, std::abs(v));
    for (size_t i = 0; i < ref.y.size(); ++i) EXPECT_NEAR(one.y[i], ref.y[i], 2e-5 * scale) << "element " << i;
    for (size_t i = 0; i < ref.routing.weights.size(); ++i)
      EXPECT_NEAR(one.routing.weights[i], ref.routing.weights[i], 1e-6);
    EXPECT_NEAR(one.aux, ref.aux, 1e-7 * ref.aux);
  }
}

TEST(Moe, RoutingWeightsSumToOneInDescendingOrder) {
  const MoeSizes z{50, 12, 8, 10, 3};
  const Weights w = random_weights(z, 3, 4.0);
  const RefRun ref = reference(z, w);
  const FastRun f = fast(z, w, 2);
  for (int64_t t = 0; t < z.tokens; ++t) {
    double s64 = 0, s32 = 0;
    for (int64_t i = 0; i < z.top_k; ++i) {
      const size_t at = static_cast<size_t>(t * z.top_k + i);
      s64 += ref.routing.weights[at], s32 += f.routing.weights[at];
      if (i > 0) {
        EXPECT_GE(ref.routing.weights[at - 1], ref.routing.weights[at]);
        const int32_t prev = ref.routing.ids[at - 1], cur = ref.routing.ids[at];
        EXPECT_GE(ref.routing.probs[static_cast<size_t>(t * z.experts + prev)],
                  ref.routing.probs[static_cast<size_t>(t * z.experts + cur)]);
      }
    }
    EXPECT_NEAR(s64, 1.0, 1e-12);
    EXPECT_NEAR(s32, 1.0, 1e-6);
  }
}

TEST(Moe, IdenticalExpertsGiveOneExpertsOutput) {
  const MoeSizes z{29, 11, 6, 13, 2}, one{29, 11, 1, 13, 1};
  Weights w = random_weights(z, 5), w1 = random_weights(one, 5);
  w1.x = w.x;
  // every expert a copy of expert 0
  const int64_t m = z.hidden * z.dim;
  for (int64_t e = 1; e < z.experts; ++e)
    for (int64_t i = 0; i < m; ++i) {
      w.w1[static_cast<size_t>(e * m + i)] = w.w1[static_cast<size_t>(i)];
      w.w3[static_cast<size_t>(e * m + i)] = w.w3[static_cast<size_t>(i)];
      w.w2[static_cast<size_t>(e * m + i)] = w.w2[static_cast<size_t>(i)];
    }
  w1.w1.assign(w.w1.begin(), w.w1.begin() + m), w1.w3.assign(w.w3.begin(), w.w3.begin() + m);
  w1.w2.assign(w.w2.begin(), w.w2.begin() + m);
  const RefRun all = reference(z, w), single = reference(one, w1);
  const FastRun fast_all = fast(z, w, 2);
  for (size_t i = 0; i < all.y.size(); ++i) {
    EXPECT_NEAR(all.y[i], single.y[i], 1e-12);
    EXPECT_NEAR(fast_all.y[i], single.y[i], 1e-5);
  }
}

TEST(Moe, UniformProbabilitiesGiveAuxOfTopKAndTiesGoToLowerIds) {
  for (const int64_t k : {1, 2, 3}) {
    const MoeSizes z{16, 8, 4, 6, k};
    Weights w = random_weights(z, 11);
    std::fill(w.router.begin(), w.router.end(), 0.0);  // p = 1/E for every token
    const RefRun ref = reference(z, w);
    const FastRun f = fast(z, w, 2);
    EXPECT_NEAR(ref.aux / kMoeAuxCoefficient, static_cast<double>(k), 1e-12);
    EXPECT_NEAR(f.aux / kMoeAuxCoefficient, static_cast<double>(k), 1e-6);
    for (int64_t t = 0; t < z.tokens; ++t)
      for (int64_t i = 0; i < k; ++i) {
        EXPECT_EQ(f.routing.ids[static_cast<size_t>(t * k + i)], i);
        EXPECT_EQ(ref.routing.ids[static_cast<size_t>(t * k + i)], i);
        EXPECT_NEAR(f.routing.weights[static_cast<size_t>(t * k + i)], 1.0 / static_cast<double>(k), 1e-7);
      }
  }
}

TEST(Moe, BalancedRoutingWithUniformMeanGivesAuxOfTopK) {
  // E = 2, k = 1, tokens alternate between the experts with p = (0.9, 0.1) and (0.1, 0.9):
  // f = P = (1/2, 1/2), aux / 0.001 = 2 (1/4 + 1/4) = 1 = k. All on expert 0: 2 (1 * 0.9) = 1.8.
  const MoeSizes z{4, 1, 2, 3, 1};
  Weights w = random_weights(z, 2);
  const double logit = std::log(9.0);
  w.router = {logit, 0.0};
  w.x = {1.0, -1.0, 1.0, -1.0};
  EXPECT_NEAR(reference(z, w).aux / kMoeAuxCoefficient, 1.0, 1e-12);
  EXPECT_NEAR(fast(z, w, 1).aux / kMoeAuxCoefficient, 1.0, 1e-6);
  w.x = {1.0, 1.0, 1.0, 1.0};
  EXPECT_NEAR(reference(z, w).aux / kMoeAuxCoefficient, 1.8, 1e-12);
  EXPECT_NEAR(fast(z, w, 1).aux / kMoeAuxCoefficient, 1.8, 1e-6);
}

TEST(Moe, NaNInOneTokenStaysInThatToken) {
  const MoeSizes z{9, 10, 4, 7, 2};
  Weights w = random_weights(z, 4);
  const FastRun clean = fast(z, w, 2);
  w.x[static_cast<size_t>(3 * z.dim + 2)] = std::numeric_limits<double>::quiet_NaN();
  const FastRun dirty = fast(z, w, 2);
  for (int64_t t = 0; t < z.tokens; ++t)
    for (int64_t c = 0; c < z.dim; ++c) {
      const size_t i = static_cast<size_t>(t * z.dim + c);
      if (t == 3) EXPECT_TRUE(std::isnan(dirty.y[i]));
      else EXPECT_EQ(dirty.y[i], clean.y[i]);
    }
  EXPECT_TRUE(std::isnan(reference(z, w).y[static_cast<size_t>(3 * z.dim)]));
}

TEST(Moe, NoTokensGiveNoOutputAndZeroAux) {
  const MoeSizes z{0, 4, 3, 5, 2};
  const Weights w = random_weights(z, 1);
  EXPECT_EQ(fast(z, w, 1).aux, 0.0);
  EXPECT_EQ(reference(z, w).aux, 0.0);
}

TEST(Moe, BadInputIsAnErrorNamingTheArgument) {
  const MoeSizes z{3, 4, 3, 5, 2};
  const Weights w = random_weights(z, 1);
  const std::vector<float> x = to_float(w.x), r = to_float(w.router), w1 = to_float(w.w1), w2 = to_float(w.w2),
                           w3 = to_float(w.w3);
  std::vector<float> y(x.size());
  auto call = [&](MoeSizes s, const std::vector<float>& xx, const std::vector<float>& ww1, int threads = 0) {
    std::vector<float> out(xx.size());
    moe_feed_forward(s, std::span<const float>(xx), r, ww1, w2, w3, std::span<float>(out), threads);
  };
  MoeSizes bad = z;
  bad.top_k = 4;
  expect_error([&] { call(bad, x, w1); }, "top_k must be in [1, experts = 3], got 4");
  bad.top_k = 0;
  expect_error([&] { call(bad, x, w1); }, "top_k must be in [1, experts = 3], got 0");
  bad = z, bad.hidden = 0;
  expect_error([&] { call(bad, x, w1); }, "hidden must be >= 1, got 0");
  bad = z, bad.tokens = -1;
  expect_error([&] { call(bad, x, w1); }, "tokens must be >= 0, got -1");
  expect_error([&] { call(z, std::vector<float>(11), w1); }, "x must hold tokens x dim = 12 values, got 11");
  expect_error([&] { call(z, x, std::vector<float>(59)); }, "w1 must hold experts x hidden x dim = 60 values, got 59");
  expect_error([&] { call(z, x, w1, -1); }, "threads must be in [0, 256], got -1");
  std::vector<double> y64(w.x.size() - 1);
  expect_error([&] { moe_feed_forward(z, std::span<const double>(w.x), w.router, w.w1, w.w2, w.w3, std::span<double>(y64)); },
               "y must hold tokens x dim = 12 values, got 11");
  std::vector<float> shared = x;
  expect_error([&] {
    moe_feed_forward(z, std::span<const float>(shared), r, w1, w2, w3, std::span<float>(shared));
  }, "y must not overlap x");
}

}  // namespace
}  // namespace attn
