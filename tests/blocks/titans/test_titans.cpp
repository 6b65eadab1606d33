// Titans neural long-term memory: the float64 token loop's worked cases, the closed-form
// gradients against finite differences, and the mini-batch fast form against the token loop.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "attn/titans.hpp"
#include "support/expect_error.hpp"
#include "titans/titans_common.hpp"

namespace attn {
namespace {

using testing::expect_error;

struct Case {
  TitansShape shape;
  TitansConfig cfg;
  std::vector<double> q, k, v, theta, eta, alpha, w0;
  int64_t w0_groups = 1;
};

// Unit keys and queries, small positive learning rates, gates in [0, 1]; w0 per head.
Case random_case(TitansMemory memory, int64_t B, int64_t H, int64_t N, int64_t d, int64_t b, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<double> normal(0.0, 1.0);
  std::uniform_real_distribution<double> unif(0.0, 1.0);
  Case c;
  c.shape = {B, H, N, d};
  c.cfg.memory = memory;
  c.cfg.batch_size = b;
  const int64_t rows = B * H * N;
  auto unit_rows = [&](std::vector<double>& x) {
    x.resize(static_cast<size_t>(rows * d));
    for (int64_t r = 0; r < rows; ++r) {
      double n2 = 0;
      for (int64_t i = 0; i < d; ++i) n2 += (x[r * d + i] = normal(gen)) * x[r * d + i];
      for (int64_t i = 0; i < d; ++i) x[r * d + i] /= std::sqrt(n2);
    }
  };
  unit_rows(c.q);
  unit_rows(c.k);
  c.v.resize(static_cast<size_t>(rows * d));
  for (double& x : c.v) x = normal(gen);
  for (int64_t r = 0; r < rows; ++r) {
    c.theta.push_back(0.2 * unif(gen));
    c.eta.push_back(0.5 + 0.5 * unif(gen));
    c.alpha.push_back(0.1 * unif(gen));
  }
  const int64_t count = titans_weight_count(memory, d);
  c.w0.resize(static_cast<size_t>(H * count));
  for (double& x : c.w0) x = normal(gen) / std::sqrt(double(d));
  c.w0_groups = H;
  return c;
}

struct Result {
  std::vector<double> y, w, s;
};

Result reference(const Case& c) {
  const int64_t count = titans_weight_count(c.cfg.memory, c.shape.dim);
  const int64_t seqs = c.shape.batch * c.shape.heads;
  Result r{std::vector<double>(c.q.size()), std::vector<double>(static_cast<size_t>(seqs * count)),
           std::vector<double>(static_cast<size_t>(seqs * count))};
  TitansArgs64 a{c.q.data(), c.k.data(), c.v.data(), c.theta.data(), c.eta.data(), c.alpha.data(),
                 c.w0.empty() ? nullptr : c.w0.data(), c.w0_groups};
  titans_memory_reference(c.shape, c.cfg, a, r.y.data(), r.w.data(), r.s.data());
  return r;
}

std::vector<float> f32(const std::vector<double>& x) { return std::vector<float>(x.begin(), x.end()); }

Result fast(const Case& c, int threads = 0) {
  const int64_t count = titans_weight_count(c.cfg.memory, c.shape.dim);
  const int64_t seqs = c.shape.batch * c.shape.heads;
  const auto q = f32(c.q), k = f32(c.k), v = f32(c.v), th = f32(c.theta), et = f32(c.eta), al = f32(c.alpha),
             w0 = f32(c.w0);
  std::vector<float> y(q.size()), w(static_cast<size_t>(seqs * count)), s(w.size());
  TitansArgs a{q.data(), k.data(), v.data(), th.data(), et.data(), al.data(), w0.empty() ? nullptr : w0.data(),
               c.w0_groups};
  titans_memory(c.shape, c.cfg, a, y.data(), w.data(), s.data(), threads);
  return {std::vector<double>(y.begin(), y.end()), std::vector<double>(w.begin(), w.end()),
          std::vector<double>(s.begin(), s.end())};
}

// max |a - b| / (1 + max |b|)
double rel_diff(const std::vector<double>& a, const std::vector<double>& b) {
  double m = 0, s = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    m = std::max(m, std::abs(a[i] - b[i]));
    s = std::max(s, std::abs(b[i]));
  }
  EXPECT_EQ(a.size(), b.size());
  return m / (1 + s);
}

TEST(Titans, WorkedCaseOneStepStoresThePair) {
  // linear, W_0 = 0, ||k|| = 1, theta = 1/2, eta = alpha = 0: S_1 = -1/2 * 2 (0 - v) k^T = v k^T
  for (int64_t b : {1, 16}) {
    Case c;
    c.shape = {1, 1, 1, 3};
    c.cfg.batch_size = b;
    c.k = {0.6, 0.0, 0.8};
    c.q = c.k;
    c.v = {1.5, -2.0, 0.25};
    c.theta = {0.5};
    c.eta = {0.0};
    c.alpha = {0.0};
    for (const Result& r : {reference(c), fast(c)}) {
      for (int i = 0; i < 3; ++i) EXPECT_NEAR(r.y[i], c.v[i], 1e-6) << i;
      for (int o = 0; o < 3; ++o)
        for (int p = 0; p < 3; ++p) EXPECT_NEAR(r.w[o * 3 + p], c.v[o] * c.k[p], 1e-6);
    }
  }
}

TEST(Titans, AlphaOneKeepsOnlyTheMomentum) {
  for (TitansMemory m : {TitansMemory::linear, TitansMemory::mlp}) {
    Case c = random_case(m, 1, 2, 21, 4, 4, 7);
    std::fill(c.alpha.begin(), c.alpha.end(), 1.0);
    const Result r = reference(c), f = fast(c);
    EXPECT_EQ(r.w, r.s);  // M_t = 0 * M_{t-1} + S_t
    EXPECT_LT(rel_diff(f.w, f.s), 1e-6);
    EXPECT_LT(rel_diff(f.y, r.y), 2e-5);
    EXPECT_LT(rel_diff(f.s, r.s), 2e-5);
  }
}

TEST(Titans, ReferenceIsTheOnlineTokenLoopAtBatchOne) {
  // b = 1: every gradient at the state just before its token, written out by hand here.
  const int64_t d = 3, N = 5;
  Case c = random_case(TitansMemory::linear, 1, 1, N, d, 1, 3);
  std::vector<double> W(c.w0.begin(), c.w0.end()), S(d * d, 0.0), y(N * d);
  for (int64_t t = 0; t < N; ++t) {
    std::vector<double> e(d);
    for (int o = 0; o < d; ++o) {
      for (int p = 0; p < d; ++p) e[o] += W[o * d + p] * c.k[t * d + p];
      e[o] -= c.v[t * d + o];
    }
    for (int o = 0; o < d; ++o)
      for (int p = 0; p < d; ++p) {
        S[o * d + p] = c.eta[t] * S[o * d + p] - c.theta[t] * 2 * e[o] * c.k[t * d + p];
        W[o * d + p] = (1 - c.alpha[t]) * W[o * d + p] + S[o * d + p];
      }
    for (int o = 0; o < d; ++o)
      for (int p = 0; p < d; ++p) y[t * d + o] += W[o * d + p] * c.q[t * d + p];
  }
  const Result r = reference(c);
  EXPECT_LT(rel_diff(r.y, y), 1e-14);
  EXPECT_LT(rel_diff(r.w, W), 1e-14);
}

TEST(Titans, FastBatchOneEqualsTheTokenLoop) {
  for (TitansMemory m : {TitansMemory::linear, TitansMemory::mlp}) {
    const Case c = random_case(m, 2, 1, 13, 8, 1, 11);
    const Result r = reference(c), f = fast(c);
    EXPECT_LT(rel_diff(f.y, r.y), 2e-5);
    EXPECT_LT(rel_diff(f.w, r.w), 2e-5);
    EXPECT_LT(rel_diff(f.s, r.s), 2e-5);
  }
}

TEST(Titans, FastMiniBatchesMatchTheReferenceAtOddLength) {
  for (TitansMemory m : {TitansMemory::linear, TitansMemory::mlp})
    for (TitansLoss loss : {TitansLoss::sum, TitansLoss::mean}) {
      Case c = random_case(m, 2, 2, 37, 8, 16, 5);  // 37 = 2 * 16 + 5
      c.cfg.loss = loss;
      const Result r = reference(c), f = fast(c);
      EXPECT_LT(rel_diff(f.y, r.y), 2e-5);
      EXPECT_LT(rel_diff(f.w, r.w), 2e-5);
      EXPECT_LT(rel_diff(f.s, r.s), 2e-5);
      // a different b is a different rule: the comparison can fail
      Case c4 = c;
      c4.cfg.batch_size = 4;
      EXPECT_GT(rel_diff(reference(c4).y, r.y), 1e-4);
    }
}

TEST(Titans, ZeroGatesAndFullForgettingInsideAMiniBatch) {
  // eta = 0 and alpha = 1 at some tokens: products through zero gates, no 0 * inf or 0 / 0
  Case c = random_case(TitansMemory::mlp, 1, 1, 19, 4, 8, 9);
  for (int64_t t = 0; t < 19; t += 3) c.eta[t] = 0.0;
  for (int64_t t = 1; t < 19; t += 5) c.alpha[t] = 1.0;
  const Result r = reference(c), f = fast(c);
  EXPECT_LT(rel_diff(f.y, r.y), 2e-5);
  EXPECT_LT(rel_diff(f.w, r.w), 2e-5);
}

TEST(Titans, SameBitsForAnyThreadCount) {
  const Case c = random_case(TitansMemory::mlp, 2, 3, 20, 4, 16, 13);
  const Result a = fast(c, 1), b = fast(c, 2), e = fast(c, 5);
  EXPECT_EQ(a.y, b.y);
  EXPECT_EQ(a.w, b.w);
  EXPECT_EQ(a.y, e.y);
}

TEST(Titans, SharedAndPerSequenceInitialWeights) {
  Case c = random_case(TitansMemory::linear, 2, 2, 6, 4, 4, 17);
  c.w0.resize(16);
  c.w0_groups = 1;  // one W_0 for all
  Case c2 = c;
  c2.w0_groups = 4;
  c2.w0.clear();
  for (int i = 0; i < 4; ++i) c2.w0.insert(c2.w0.end(), c.w0.begin(), c.w0.end());
  EXPECT_EQ(reference(c).y, reference(c2).y);
  EXPECT_EQ(fast(c).y, fast(c2).y);
}

TEST(Titans, ContinuingFromTheFinalStateEqualsOneCall) {
  // 12 tokens in one call = 8 tokens, then 4 more from (w_out, s_out) (8 is a multiple of b = 4)
  for (TitansMemory m : {TitansMemory::linear, TitansMemory::mlp}) {
    const int64_t d = 4, count = titans_weight_count(m, d);
    const Case all = random_case(m, 1, 1, 12, d, 4, 31);
    auto part = [&](int64_t t0, int64_t n) {
      Case c = all;
      c.shape.tokens = n;
      for (auto* x : {&c.q, &c.k, &c.v})
        x->assign(x->begin() + t0 * d, x->begin() + (t0 + n) * d);
      for (auto* x : {&c.theta, &c.eta, &c.alpha}) x->assign(x->begin() + t0, x->begin() + t0 + n);
      return c;
    };
    const Case first = part(0, 8);
    const Result r1 = reference(first), f1 = fast(first);
    Case second = part(8, 4);
    second.w0 = r1.w;
    second.w0_groups = 1;
    const Result whole = reference(all);
    std::vector<double> s0 = r1.s;
    TitansArgs64 a{second.q.data(), second.k.data(), second.v.data(), second.theta.data(), second.eta.data(),
                   second.alpha.data(), r1.w.data(), 1, s0.data()};
    std::vector<double> y(4 * d), w(count), s(count);
    titans_memory_reference(second.shape, second.cfg, a, y.data(), w.data(), s.data());
    EXPECT_LT(rel_diff(w, whole.w), 1e-14);
    EXPECT_LT(rel_diff(y, std::vector<double>(whole.y.begin() + 8 * d, whole.y.end())), 1e-14);
    // the fast form from its own first part's state
    const auto q = f32(second.q), k = f32(second.k), v = f32(second.v), th = f32(second.theta),
               et = f32(second.eta), al = f32(second.alpha), w0 = f32(f1.w), fs0 = f32(f1.s);
    std::vector<float> y32(4 * d), w32(count);
    titans_memory(second.shape, second.cfg, {q.data(), k.data(), v.data(), th.data(), et.data(), al.data(),
                                             w0.data(), 1, fs0.data()},
                  y32.data(), w32.data());
    EXPECT_LT(rel_diff(std::vector<double>(w32.begin(), w32.end()), whole.w), 2e-5);
    EXPECT_LT(rel_diff(std::vector<double>(y32.begin(), y32.end()),
                       std::vector<double>(whole.y.begin() + 8 * d, whole.y.end())), 2e-5);
  }
}

TEST(Titans, NonFiniteValuesPropagate) {
  Case c = random_case(TitansMemory::linear, 1, 1, 8, 4, 4, 19);
  c.v[5 * 4 + 1] = std::numeric_limits<double>::quiet_NaN();  // token 5, in the second mini-batch
  const Result f = fast(c);
  EXPECT_FALSE(std::isnan(f.y[3 * 4]));
  EXPECT_FALSE(std::isnan(f.y[4 * 4]));  // same mini-batch, read before token 5
  // linear: only e_5's second entry is NaN, so only row 1 of W (and y's entry 1) turns NaN
  EXPECT_TRUE(std::isnan(f.y[5 * 4 + 1]));
  EXPECT_TRUE(std::isnan(f.y[7 * 4 + 1]));
  EXPECT_FALSE(std::isnan(f.y[7 * 4]));
  EXPECT_TRUE(std::isnan(f.w[1 * 4 + 2]));
}

TEST(Titans, GradientsMatchFiniteDifferences) {
  for (TitansMemory m : {TitansMemory::linear, TitansMemory::mlp})
    for (TitansLoss loss : {TitansLoss::sum, TitansLoss::mean}) {
      const int64_t d = 3, count = titans_weight_count(m, d);
      const Case c = random_case(m, 1, 1, 1, d, 1, 23);
      std::vector<double> w(c.w0.begin(), c.w0.begin() + count), g(static_cast<size_t>(count));
      titans_loss_and_gradient(m, loss, d, w.data(), c.k.data(), c.v.data(), g.data());
      const double h = 1e-6;
      for (int64_t i = 0; i < count; ++i) {
        std::vector<double> wp = w, wm = w;
        wp[i] += h;
        wm[i] -= h;
        const double fd = (titans_loss_and_gradient(m, loss, d, wp.data(), c.k.data(), c.v.data(), nullptr) -
                           titans_loss_and_gradient(m, loss, d, wm.data(), c.k.data(), c.v.data(), nullptr)) /
                          (2 * h);
        EXPECT_NEAR(g[i], fd, 1e-7 * (1 + std::abs(fd))) << "weight " << i;
      }
    }
}

TEST(Titans, FloatGeluMatchesTheErfFormula) {
  // the fast form's gelu and gelu' (no libm, vectorised) against float64 erf on a fine grid
  const int n = 40001;
  std::vector<float> z(n), g(n), dg(n);
  for (int i = 0; i < n; ++i) z[i] = -20.0f + 40.0f * float(i) / float(n - 1);
  titans::gelu_rows(z.data(), g.data(), dg.data(), n);
  double worst_g = 0, worst_dg = 0;
  for (int i = 0; i < n; ++i) {
    double G, D;
    titans::gelu_and_grad<double>(double(z[i]), G, D);
    worst_g = std::max(worst_g, std::abs(g[i] - G) / (1 + std::abs(G)));
    worst_dg = std::max(worst_dg, std::abs(dg[i] - D) / (1 + std::abs(D)));
  }
  EXPECT_LT(worst_g, 3e-7);
  EXPECT_LT(worst_dg, 3e-7);
  float nan = std::numeric_limits<float>::quiet_NaN(), a, b;
  titans::gelu_rows(&nan, &a, &b, 1);
  EXPECT_TRUE(std::isnan(a) && std::isnan(b));
}

TEST(Titans, BadInputNamesTheArgument) {
  const Case good = random_case(TitansMemory::linear, 1, 2, 5, 4, 4, 29);
  auto run = [](const Case& c) { fast(c); };
  auto with = [&](auto change) {
    Case c = good;
    change(c);
    return c;
  };
  expect_error([&] { run(with([](Case& c) { c.theta[3] = -0.5; })); }, "theta[b=0, h=0, t=3] = -0.500000 must be >= 0");
  expect_error([&] { run(with([](Case& c) { c.eta[6] = 1.5; })); }, "eta[b=0, h=1, t=1] = 1.500000 must be in [0, 1]");
  expect_error([&] { run(with([](Case& c) { c.alpha[0] = -0.1; })); }, "alpha[b=0, h=0, t=0]");
  expect_error([&] { run(with([](Case& c) { c.cfg.batch_size = 0; })); }, "batch_size must be >= 1, got 0");
  expect_error([&] { run(with([](Case& c) { c.w0_groups = 3; })); }, "w0 (and s0) must hold 1, H = 2 or B*H = 2 sets");
  expect_error([&] { reference(with([](Case& c) { c.eta[2] = -1.0; })); }, "eta[b=0, h=0, t=2]");
  expect_error([] { titans_memory_from_text("deep"); }, "memory must be 'linear' or 'mlp', got 'deep'");
  expect_error([] { titans_loss_from_text("l1"); }, "loss must be 'sum' or 'mean', got 'l1'");
}

}  // namespace
}  // namespace attn
