#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "attn/concentration.hpp"
#include "attn/error.hpp"

namespace attn::concentration {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

double abs_sum(const double* a, int64_t n) {
  double s = 0;
  for (int64_t j = 0; j < n; ++j) s += std::abs(a[j]);
  return s;
}

}  // namespace

double sparsity(const double* a, int64_t n) {
  double l1 = 0, l2 = 0;
  for (int64_t j = 0; j < n; ++j) l1 += std::abs(a[j]), l2 += a[j] * a[j];
  if (n == 0 || l2 == 0) return kNaN;
  // (l1 / n) / sqrt(l2 / n), arranged so large rows do not overflow n * l2
  return l1 / std::sqrt(l2) / std::sqrt(static_cast<double>(n));
}

double entropy(const double* a, int64_t n) {
  double sum = 0;
  for (int64_t j = 0; j < n; ++j) {
    if (!(a[j] >= 0))
      fail("entropy", "weights must be non-negative (a distribution), got " + std::to_string(a[j]) + " at position " +
                          std::to_string(j));
    sum += a[j];
  }
  if (sum == 0 || !std::isfinite(sum)) return kNaN;
  double h = 0;
  for (int64_t j = 0; j < n; ++j)
    if (a[j] > 0) {
      const double p = a[j] / sum;
      h -= p * std::log(p);
    }
  return h;
}

double max_weight(const double* a, int64_t n) {
  const double total = abs_sum(a, n);
  if (total == 0) return kNaN;
  double top = 0;
  for (int64_t j = 0; j < n; ++j) top = std::max(top, std::abs(a[j]));
  return top / total;
}

double topk_mass(const double* a, int64_t n, int64_t k) {
  if (k < 1) fail("topk_mass", "k must be >= 1, got " + std::to_string(k));
  const double total = abs_sum(a, n);
  if (total == 0) return kNaN;
  if (k >= n) return 1.0;
  std::vector<double> m(static_cast<size_t>(n));
  for (int64_t j = 0; j < n; ++j) m[static_cast<size_t>(j)] = std::abs(a[j]);
  std::nth_element(m.begin(), m.begin() + (k - 1), m.end(), std::greater<>());
  double top = 0;
  for (int64_t j = 0; j < k; ++j) top += m[static_cast<size_t>(j)];
  return top / total;
}

}  // namespace attn::concentration
