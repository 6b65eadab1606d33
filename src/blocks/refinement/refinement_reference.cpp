// Attention-weight refinement's float64 reference (Liu et al. 2024, our reading [unverified]): the
// plain formulas, every N x N matrix written out, sums in double. The float form is tested
// against it.
#include <cmath>
#include <vector>

#include "refinement/refinement_internal.hpp"

namespace attn::refinement {

void reference_weights(const double* a, int64_t n, const double* w1, const double* w2, int64_t r,
                       const RefineOptions& o, double* R) {
  const bool stoch = o.form == RefineForm::stochastic;
  std::vector<double> p1(static_cast<size_t>(n * r), 0.0), p2(static_cast<size_t>(n * r), 0.0);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t c = 0; c < r; ++c) {
      double s1 = 0, s2 = 0;
      for (int64_t k = 0; k < n; ++k) {
        s1 += a[i * n + k] * w1[k * r + c];
        s2 += a[i * n + k] * w2[k * r + c];
      }
      p1[i * r + c] = s1;
      p2[i * r + c] = stoch ? elu1(s2) : s2;
    }
  std::vector<double> hat(static_cast<size_t>(n * n), 0.0);
  const double scale = 1.0 / std::sqrt(static_cast<double>(r));
  for (int64_t i = 0; i < n; ++i) {
    double* h = hat.data() + i * n;
    for (int64_t j = 0; j <= i; ++j) {
      double s = 0;
      for (int64_t c = 0; c < r; ++c) {
        if (stoch) {
          const double dm = p1[i * r + c] - p1[j * r + c], ds = p2[i * r + c] - p2[j * r + c];
          s -= dm * dm + ds * ds;
        } else {
          s += p1[i * r + c] * p2[j * r + c];
        }
      }
      h[j] = stoch ? s : s * scale;
    }
    softmax_row<double, double>(h, i + 1);  // keys j > i stay 0 (the causal mask)
  }
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double v = 0;
      switch (o.form) {
        case RefineForm::simple:
        case RefineForm::stochastic: v = hat[i * n + j]; break;
        case RefineForm::additive: v = (1.0 - o.gamma) * a[i * n + j] + o.gamma * hat[i * n + j]; break;
        case RefineForm::value_weighted:
          for (int64_t k = 0; k < n; ++k) v += hat[i * n + k] * a[k * n + j];
          break;
      }
      R[i * n + j] = v;
    }
}

}  // namespace attn::refinement
