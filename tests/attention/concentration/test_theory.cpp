// The closed forms of attn/theory.hpp against numerical quadrature of their defining expectations
// (<= 1e-6 relative over beta in [-2, 2], gamma in [0.25, 4]) and against Monte Carlo on
// generated keys, with stated tolerances; and where plain Monte Carlo cannot see the limit.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <numbers>
#include <random>
#include <vector>

#include "attn/concentration.hpp"
#include "attn/theory.hpp"

namespace attn::theory {
namespace {

// integral of g over [a, b]: composite 10-point Gauss-Legendre on `pieces` pieces
double integrate(const std::function<double(double)>& g, double a, double b, int pieces = 800) {
  static const double x[5] = {0.1488743389816312, 0.4333953941292472, 0.6794095682990244, 0.8650633666889845,
                              0.9739065285171717};
  static const double w[5] = {0.2955242247147529, 0.2692667193099963, 0.2190863625159820, 0.1494513491505806,
                              0.0666713443086881};
  double sum = 0;
  const double h = (b - a) / pieces;
  for (int p = 0; p < pieces; ++p) {
    const double mid = a + (p + 0.5) * h, half = h / 2;
    for (int i = 0; i < 5; ++i) sum += w[i] * half * (g(mid - half * x[i]) + g(mid + half * x[i]));
  }
  return sum;
}

double pdf(double e) { return std::exp(-0.5 * e * e) / std::sqrt(2 * std::numbers::pi); }

// S = E|f| / sqrt(E f^2) for score beta + gamma e, by quadrature over e in [lo, hi] (the support
// and where the integrand lives), split at `kink`.
double sparsity_by_quadrature(const std::function<double(double)>& f, double beta, double gamma, double lo, double hi) {
  auto m1 = [&](double e) { return std::abs(f(beta + gamma * e)) * pdf(e); };
  auto m2 = [&](double e) { const double v = f(beta + gamma * e); return v * v * pdf(e); };
  return integrate(m1, lo, hi) / std::sqrt(integrate(m2, lo, hi));
}

const double kBetas[] = {-2, -1.5, -1, -0.5, -0.1, 0, 0.1, 0.5, 1, 1.5, 2};
const double kGammas[] = {0.25, 0.5, 1, 2, 3, 4};

TEST(Theory, ClosedFormsMatchQuadrature) {
  for (double beta : kBetas)
    for (double gamma : kGammas) {
      const double t = beta / gamma;
      // exp: the integrand e^(k gamma e) phi(e) peaks at e = k gamma
      const double se = sparsity_by_quadrature([](double s) { return std::exp(s); }, beta, gamma, -40, 2 * gamma + 40);
      EXPECT_NEAR(sparsity_exp(beta, gamma) / se, 1.0, 1e-6) << beta << " " << gamma;
      // relu^2: support e > -t
      const double sr = sparsity_by_quadrature([](double s) { return s > 0 ? s * s : 0.0; }, beta, gamma,
                                               std::max(-t, -40.0), std::max(-t, -40.0) + 60);
      EXPECT_NEAR(sparsity_relu2(beta, gamma) / sr, 1.0, 1e-6) << beta << " " << gamma;
      // identity: |.| has its kink at e = -t
      const auto id = [](double s) { return s; };
      const double num = integrate([&](double e) { return std::abs(beta + gamma * e) * pdf(e); }, -40, -t) +
                         integrate([&](double e) { return std::abs(beta + gamma * e) * pdf(e); }, -t, 40);
      const double den = integrate([&](double e) { const double v = id(beta + gamma * e); return v * v * pdf(e); }, -40, 40);
      EXPECT_NEAR(sparsity_identity(beta, gamma) / (num / std::sqrt(den)), 1.0, 1e-6) << beta << " " << gamma;
    }
  EXPECT_NEAR(sparsity_relu2(0, 1), 1 / std::sqrt(6.0), 1e-15);
  EXPECT_NEAR(sparsity_identity(0, 1), std::sqrt(2 / std::numbers::pi), 1e-15);
}

TEST(Theory, TheDocumentsErfFormCancelsForVeryNegativeT) {
  // the same value where 1 + erf(u) is well away from 0 ...
  for (double t : {-3.0, -1.0, 0.0, 2.0}) EXPECT_NEAR(sparsity_relu2_erf_form(t, 1) / sparsity_relu2(t, 1), 1.0, 1e-9) << t;
  // ... and nothing right below t = -6, where 1 + erf(t / sqrt 2) has lost its digits
  const double stable = sparsity_relu2(-8, 1);
  const double literal = sparsity_relu2_erf_form(-8, 1);
  EXPECT_GT(stable, 0);
  EXPECT_LT(stable, 1e-6);
  EXPECT_TRUE(std::isnan(literal) || std::abs(literal / stable - 1) > 0.5) << literal << " vs " << stable;
}

TEST(Theory, DecayRowEqualsItsExplicitRow) {
  for (double lambda : {0.5, 0.9, 0.99, 0.999})
    for (int64_t n : {1, 2, 10, 1000, 100000}) {
      std::vector<double> row(static_cast<size_t>(n));
      for (int64_t j = 0; j < n; ++j) row[static_cast<size_t>(j)] = std::pow(lambda, static_cast<double>(n - 1 - j));
      EXPECT_NEAR(sparsity_decay(lambda, n) / concentration::sparsity(row.data(), n), 1.0, 1e-12) << lambda << " " << n;
    }
  EXPECT_LT(sparsity_decay(0.9, 1000000), 0.01);  // -> 0: sparse, on recent keys only
}

// Monte Carlo on generated scores: S of n samples of f(beta + gamma eps).
double monte_carlo(const std::function<double(double)>& f, double beta, double gamma, int n, uint32_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> eps;
  std::vector<double> row(static_cast<size_t>(n));
  for (double& a : row) a = f(beta + gamma * eps(rng));
  return concentration::sparsity(row.data(), n);
}

TEST(Theory, MonteCarloAgreesWhereItCanAndSaysWhereItCannot) {
  const int n = 400000;
  // tolerances: 6 standard errors of the ratio of sample moments at this n
  EXPECT_NEAR(monte_carlo([](double s) { return s; }, 0.5, 1.0, n, 1) / sparsity_identity(0.5, 1.0), 1.0, 0.01);
  EXPECT_NEAR(monte_carlo([](double s) { return s > 0 ? s * s : 0.0; }, 0.3, 1.0, n, 2) / sparsity_relu2(0.3, 1.0), 1.0,
              0.03);
  EXPECT_NEAR(monte_carlo([](double s) { return std::exp(s); }, 0.0, 0.5, n, 3) / sparsity_exp(0, 0.5), 1.0, 0.03);
  // softmax at gamma = 4 needs n >> e^(4 gamma^2) = 6e27 keys: 4e5 samples sit far above the limit
  // (a few samples carry the row; measured 0.0127 against exp(-8) = 0.00034)
  EXPECT_GT(monte_carlo([](double s) { return std::exp(s); }, 0.0, 4.0, n, 4), 10 * sparsity_exp(0, 4.0));
  // a non-negative linear map: i.i.d. exponential features (mean 1, deviation 1)
  std::mt19937_64 rng(5);
  std::exponential_distribution<double> feature(1.0);
  const std::vector<double> q = {0.7, 0.1, 0.2, 1.5};
  std::vector<double> row(static_cast<size_t>(n));
  for (double& a : row) {
    a = 0;
    for (double qi : q) a += qi * feature(rng);
  }
  const double sigma[16] = {1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1};
  const double s_general = sparsity_linear(q, {1, 1, 1, 1}, std::vector<double>(sigma, sigma + 16));
  EXPECT_NEAR(s_general, sparsity_linear_iid(q, 1.0, 1.0), 1e-15);
  EXPECT_NEAR(concentration::sparsity(row.data(), n) / s_general, 1.0, 0.01);
}

}  // namespace
}  // namespace attn::theory
