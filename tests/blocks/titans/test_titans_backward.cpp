// Titans memory backward: the float64 reference against central finite differences of the
// forward (through y, the final weights and the final momentum; linear and mlp memory, sum and
// mean loss, online and mini-batch updates, w0 per head and shared, s0 given), the float32 form
// against it, 1 vs 3 threads bitwise, shared-group sums, no tokens, bad input.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "attn/titans.hpp"
#include "support/expect_error.hpp"

namespace attn {
namespace {

using testing::expect_error;

struct Case {
  TitansShape shape;
  TitansConfig cfg;
  std::vector<double> q, k, v, theta, eta, alpha, w0, s0, dy, dw, ds;
  int64_t groups = 1;
};

Case random_case(TitansMemory memory, TitansLoss loss, int64_t B, int64_t H, int64_t N, int64_t d, int64_t b,
                 int64_t groups, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<double> nd(0.0, 1.0);
  std::uniform_real_distribution<double> unif(0.0, 1.0);
  Case c;
  c.shape = {B, H, N, d};
  c.cfg = {memory, loss, b};
  c.groups = groups;
  const int64_t rows = B * H * N, count = titans_weight_count(memory, d);
  auto fill = [&](std::vector<double>& x, int64_t n, double sd) {
    x.resize(static_cast<size_t>(n));
    for (double& a : x) a = sd * nd(gen);
  };
  const double unit = 1.0 / std::sqrt(double(d));
  fill(c.q, rows * d, unit);
  fill(c.k, rows * d, unit);
  fill(c.v, rows * d, 1.0);
  for (int64_t r = 0; r < rows; ++r) {
    c.theta.push_back(0.05 + 0.2 * unif(gen));
    c.eta.push_back(0.3 + 0.6 * unif(gen));
    c.alpha.push_back(0.05 + 0.2 * unif(gen));
  }
  fill(c.w0, groups * count, unit);
  fill(c.s0, groups * count, 0.3 * unit);
  fill(c.dy, rows * d, 1.0);
  fill(c.dw, B * H * count, 1.0);
  fill(c.ds, B * H * count, 1.0);
  return c;
}

struct Grads {
  std::vector<double> dq, dk, dv, dtheta, deta, dalpha, dw0, ds0;
};
const char* kNames[] = {"dq", "dk", "dv", "dtheta", "deta", "dalpha", "dw0", "ds0"};
std::vector<std::vector<double>> all(const Grads& g) { return {g.dq, g.dk, g.dv, g.dtheta, g.deta, g.dalpha, g.dw0, g.ds0}; }

Grads sized(const Case& c) {
  const size_t rows = c.theta.size(), n = c.q.size(), w = c.w0.size();
  return {std::vector<double>(n), std::vector<double>(n), std::vector<double>(n), std::vector<double>(rows),
          std::vector<double>(rows), std::vector<double>(rows), std::vector<double>(w), std::vector<double>(w)};
}

TitansArgs64 args64(const Case& c) {
  return {c.q.data(), c.k.data(), c.v.data(), c.theta.data(), c.eta.data(), c.alpha.data(),
          c.w0.data(), c.groups,  c.s0.data()};
}

Grads reference(const Case& c) {
  Grads g = sized(c);
  titans_memory_backward_reference(c.shape, c.cfg, args64(c), c.dy.data(), c.dw.data(), c.ds.data(),
                                   {g.dq.data(), g.dk.data(), g.dv.data(), g.dtheta.data(), g.deta.data(),
                                    g.dalpha.data(), g.dw0.data(), g.ds0.data()});
  return g;
}

std::vector<float> f32(const std::vector<double>& x) { return {x.begin(), x.end()}; }

Grads fast(const Case& c, int threads) {
  const auto q = f32(c.q), k = f32(c.k), v = f32(c.v), th = f32(c.theta), et = f32(c.eta), al = f32(c.alpha),
             w0 = f32(c.w0), s0 = f32(c.s0), dy = f32(c.dy), dw = f32(c.dw), ds = f32(c.ds);
  std::vector<float> dq(q.size()), dk(q.size()), dv(q.size()), dth(th.size()), det(th.size()), dal(th.size()),
      dw0(w0.size()), ds0(w0.size());
  TitansArgs a{q.data(), k.data(), v.data(), th.data(), et.data(), al.data(), w0.data(), c.groups, s0.data()};
  titans_memory_backward(c.shape, c.cfg, a, dy.data(), dw.data(), ds.data(),
                         {dq.data(), dk.data(), dv.data(), dth.data(), det.data(), dal.data(), dw0.data(), ds0.data()},
                         threads);
  auto d = [](const std::vector<float>& x) { return std::vector<double>(x.begin(), x.end()); };
  return {d(dq), d(dk), d(dv), d(dth), d(det), d(dal), d(dw0), d(ds0)};
}

// L = <dy, y> + <dw, M_N> + <ds, S_N> by the float64 forward.
double objective(const Case& c) {
  const int64_t count = titans_weight_count(c.cfg.memory, c.shape.dim), seqs = c.shape.batch * c.shape.heads;
  std::vector<double> y(c.q.size()), w(static_cast<size_t>(seqs * count)), s(w.size());
  titans_memory_reference(c.shape, c.cfg, args64(c), y.data(), w.data(), s.data());
  double l = 0;
  for (size_t i = 0; i < y.size(); ++i) l += c.dy[i] * y[i];
  for (size_t i = 0; i < w.size(); ++i) l += c.dw[i] * w[i] + c.ds[i] * s[i];
  return l;
}

double max_abs(const std::vector<double>& a) {
  double m = 0;
  for (double v : a) m = std::max(m, std::abs(v));
  return m;
}
double max_diff(const std::vector<double>& a, const std::vector<double>& b) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::abs(a[i] - b[i]));
  return m;
}

void check_finite_differences(Case c) {
  const Grads g = reference(c);
  const auto grads = all(g);
  std::vector<double>* vars[] = {&c.q, &c.k, &c.v, &c.theta, &c.eta, &c.alpha, &c.w0, &c.s0};
  const double h = 1e-6;
  for (int which = 0; which < 8; ++which) {
    std::vector<double>& x = *vars[which];
    double worst = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      const double keep = x[i];
      x[i] = keep + h;
      const double up = objective(c);
      x[i] = keep - h;
      const double down = objective(c);
      x[i] = keep;
      worst = std::max(worst, std::abs((up - down) / (2 * h) - grads[static_cast<size_t>(which)][i]));
    }
    // central differences: O(h^2) truncation, O(1e-16 |L| / h) rounding: ~1e-9 here
    EXPECT_LT(worst, 2e-7 * (1 + max_abs(grads[static_cast<size_t>(which)])))
        << kNames[which] << (c.cfg.memory == TitansMemory::mlp ? " mlp" : " linear") << " b=" << c.cfg.batch_size;
    EXPECT_GT(max_abs(grads[static_cast<size_t>(which)]), 0.0) << kNames[which];
  }
}

TEST(TitansBackward, LinearReferenceMatchesFiniteDifferences) {
  // online (b = 1), mini-batches of 3 over 7 tokens (a partial last one), one mini-batch; w0 per
  // head, shared, per sequence; sum and mean loss
  check_finite_differences(random_case(TitansMemory::linear, TitansLoss::sum, 1, 2, 7, 3, 1, 2, 1));
  check_finite_differences(random_case(TitansMemory::linear, TitansLoss::sum, 2, 1, 7, 4, 3, 1, 2));
  check_finite_differences(random_case(TitansMemory::linear, TitansLoss::mean, 1, 2, 5, 3, 16, 2, 3));
}

TEST(TitansBackward, MlpReferenceMatchesFiniteDifferences) {
  check_finite_differences(random_case(TitansMemory::mlp, TitansLoss::sum, 1, 1, 5, 2, 1, 1, 4));
  check_finite_differences(random_case(TitansMemory::mlp, TitansLoss::mean, 1, 2, 7, 3, 3, 2, 5));
}

TEST(TitansBackward, Float32FormMatchesTheReferenceAndThreadCountChangesNoBit) {
  // The float32 form is the reference's loop in float32 (no faster form yet): it is its own plain
  // float32 baseline, so the rule is rule 5's relative bound, 1e-3 of the gradient's magnitude.
  for (const TitansMemory m : {TitansMemory::linear, TitansMemory::mlp}) {
    for (const int64_t groups : {int64_t(1), int64_t(3), int64_t(6)}) {
      const Case c = random_case(m, TitansLoss::sum, 2, 3, 37, m == TitansMemory::mlp ? 7 : 13, 16, groups,
                                 9 + static_cast<uint32_t>(groups));
      const auto ref = all(reference(c));
      const auto one = all(fast(c, 1)), three = all(fast(c, 3));
      for (size_t i = 0; i < ref.size(); ++i) {
        EXPECT_EQ(one[i], three[i]) << kNames[i] << ": threads change bits";
        EXPECT_LE(max_diff(one[i], ref[i]), 1e-3 * max_abs(ref[i])) << kNames[i] << " groups " << groups;
      }
    }
  }
}

TEST(TitansBackward, SharedGroupGetsTheSumOfItsSequences) {
  Case per = random_case(TitansMemory::linear, TitansLoss::sum, 2, 2, 9, 3, 4, 4, 8);
  Case shared = per;
  const int64_t count = 9;
  shared.groups = 1;
  shared.w0.assign(per.w0.begin(), per.w0.begin() + count);
  shared.s0.assign(per.s0.begin(), per.s0.begin() + count);
  for (int64_t g = 1; g < 4; ++g)  // every sequence starts from group 0's weights
    for (int64_t i = 0; i < count; ++i)
      per.w0[static_cast<size_t>(g * count + i)] = per.w0[static_cast<size_t>(i)],
                                        per.s0[static_cast<size_t>(g * count + i)] = per.s0[static_cast<size_t>(i)];
  const Grads a = reference(per), b = reference(shared);
  EXPECT_EQ(a.dq, b.dq);
  for (int64_t i = 0; i < count; ++i) {
    double s = 0, m = 0;
    for (int64_t g = 0; g < 4; ++g) s += a.dw0[static_cast<size_t>(g * count + i)], m += a.ds0[static_cast<size_t>(g * count + i)];
    EXPECT_NEAR(b.dw0[static_cast<size_t>(i)], s, 1e-12 * (1 + std::abs(s)));
    EXPECT_NEAR(b.ds0[static_cast<size_t>(i)], m, 1e-12 * (1 + std::abs(m)));
  }
}

TEST(TitansBackward, NoTokensPassTheFinalGradientsToTheInitialState) {
  Case c = random_case(TitansMemory::mlp, TitansLoss::sum, 1, 2, 0, 2, 16, 2, 3);
  const Grads r = reference(c), f = fast(c, 2);
  EXPECT_EQ(r.dw0, c.dw);  // M_N = M_0, S_N = S_0
  EXPECT_EQ(r.ds0, c.ds);
  EXPECT_LE(max_diff(f.dw0, c.dw), 1e-6 * max_abs(c.dw));
}

TEST(TitansBackward, BadInputIsAnErrorNamingTheArgument) {
  Case c = random_case(TitansMemory::linear, TitansLoss::sum, 1, 1, 3, 2, 2, 1, 1);
  Grads g = sized(c);
  TitansGrads64 out{g.dq.data(), g.dk.data(), g.dv.data(), g.dtheta.data(), g.deta.data(), g.dalpha.data(), nullptr,
                    nullptr};
  c.eta[1] = 1.5;
  expect_error([&] { titans_memory_backward_reference(c.shape, c.cfg, args64(c), c.dy.data(), nullptr, nullptr, out); },
               "titans_memory_backward: eta[b=0, h=0, t=1] = 1.500000 must be in [0, 1]");
  c.eta[1] = 0.5;
  out.dk = nullptr;
  expect_error([&] { titans_memory_backward_reference(c.shape, c.cfg, args64(c), c.dy.data(), nullptr, nullptr, out); },
               "titans_memory_backward: dk (a gradient output) has no data");
  out.dk = g.dk.data();
  TitansConfig bad = c.cfg;
  bad.batch_size = 0;
  expect_error([&] { titans_memory_backward_reference(c.shape, bad, args64(c), c.dy.data(), nullptr, nullptr, out); },
               "batch_size must be >= 1, got 0");
  const auto q = f32(c.q), k = f32(c.k), v = f32(c.v), th = f32(c.theta), et = f32(c.eta), al = f32(c.alpha);
  std::vector<float> o(q.size()), o3(th.size());
  TitansArgs a{q.data(), k.data(), v.data(), th.data(), et.data(), al.data(), nullptr, 1, nullptr};
  expect_error([&] {
    titans_memory_backward(c.shape, c.cfg, a, nullptr, nullptr, nullptr,
                           {o.data(), o.data(), o.data(), o3.data(), o3.data(), o3.data(), nullptr, nullptr}, -2);
  }, "titans_memory_backward: threads must be in [0, 256], got -2");
  a.w0_groups = 2;
  expect_error([&] {
    titans_memory_backward(c.shape, c.cfg, a, nullptr, nullptr, nullptr,
                           {o.data(), o.data(), o.data(), o3.data(), o3.data(), o3.data(), nullptr, nullptr});
  }, "w0 (and s0) must hold 1, H = 1 or B*H = 1 sets of weights, got 2");
}

}  // namespace
}  // namespace attn
