#include "attn/theory.hpp"

#include <cmath>
#include <numbers>

#include "attn/error.hpp"

namespace attn::theory {
namespace {

void check_gamma(double gamma, const char* where) {
  if (!(gamma > 0) || !std::isfinite(gamma)) fail(where, "gamma must be a finite number > 0, got " + std::to_string(gamma));
}

double normal_pdf(double t) { return std::exp(-0.5 * t * t) / std::sqrt(2 * std::numbers::pi); }
double normal_cdf(double t) { return 0.5 * std::erfc(-t / std::numbers::sqrt2); }  // accurate in both tails

// S = E relu^2 / sqrt(E relu^4) from Phi(t), phi(t) (any evaluation of them).
double relu2_from(double beta, double gamma, double Phi, double phi) {
  const double b2 = beta * beta, g2 = gamma * gamma;
  const double m2 = (b2 + g2) * Phi + beta * gamma * phi;
  const double m4 = (b2 * b2 + 6 * b2 * g2 + 3 * g2 * g2) * Phi + beta * gamma * (b2 + 5 * g2) * phi;
  return m2 / std::sqrt(m4);
}

}  // namespace

double sparsity_exp(double beta, double gamma) {
  check_gamma(gamma, "sparsity_exp");
  (void)beta;
  return std::exp(-0.5 * gamma * gamma);
}

double sparsity_relu2(double beta, double gamma) {
  check_gamma(gamma, "sparsity_relu2");
  const double t = beta / gamma;
  return relu2_from(beta, gamma, normal_cdf(t), normal_pdf(t));
}

double sparsity_relu2_erf_form(double beta, double gamma) {
  check_gamma(gamma, "sparsity_relu2_erf_form");
  const double t = beta / gamma;
  return relu2_from(beta, gamma, 0.5 * (1 + std::erf(t / std::numbers::sqrt2)), normal_pdf(t));
}

double sparsity_identity(double beta, double gamma) {
  check_gamma(gamma, "sparsity_identity");
  const double mean_abs = std::sqrt(2 / std::numbers::pi) * gamma * std::exp(-beta * beta / (2 * gamma * gamma)) +
                          beta * std::erf(beta / (std::numbers::sqrt2 * gamma));
  return mean_abs / std::hypot(beta, gamma);
}

double sparsity_linear(const std::vector<double>& q, const std::vector<double>& mu, const std::vector<double>& sigma) {
  const size_t d = q.size();
  if (d == 0 || mu.size() != d || sigma.size() != d * d)
    fail("sparsity_linear", "expected q (d), mu (d) and sigma (d x d) with d >= 1, got " + std::to_string(q.size()) +
                                ", " + std::to_string(mu.size()) + ", " + std::to_string(sigma.size()));
  double mean = 0, var = 0;
  for (size_t i = 0; i < d; ++i) {
    mean += q[i] * mu[i];
    for (size_t j = 0; j < d; ++j) var += q[i] * sigma[i * d + j] * q[j];
  }
  if (mean == 0) fail("sparsity_linear", "q . mu must not be 0 (the weights' mean)");
  return 1 / std::sqrt(1 + var / (mean * mean));
}

double sparsity_linear_iid(const std::vector<double>& q, double mean, double deviation) {
  if (q.empty() || !(mean != 0)) fail("sparsity_linear_iid", "needs q (d >= 1) and a non-zero mean");
  double l1 = 0, l2 = 0;
  for (double x : q) l1 += std::abs(x), l2 += x * x;
  const double r = deviation / mean * std::sqrt(l2) / l1;
  return 1 / std::sqrt(1 + r * r);
}

double sparsity_decay(double lambda, int64_t n) {
  if (!(lambda > 0 && lambda <= 1) || n < 1)
    fail("sparsity_decay", "expected 0 < lambda <= 1 and n >= 1, got " + std::to_string(lambda) + ", " + std::to_string(n));
  if (lambda == 1) return 1.0;
  const double ln = std::pow(lambda, static_cast<double>(n));
  // (1 - l^n) / (1 - l) by expm1/log1p-free forms is fine here: l < 1, n >= 1
  return std::sqrt((1 - ln) / (static_cast<double>(n) * (1 - lambda)) * (1 + lambda) / (1 + ln));
}

}  // namespace attn::theory
