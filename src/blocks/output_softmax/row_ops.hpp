// Row helpers shared by the output-layer softmaxes (src/output/): a stable log-softmax of one
// row, log sigmoid as -softplus(-z), and a dot product accumulated in double.
#pragma once
#include <cmath>
#include <cstdint>
#include <limits>

namespace attn::output {

// out[i] = x[i] - m - log sum_j exp(x[j] - m), m = max_j x[j]; all -inf stays all -inf. The
// max is taken so that a NaN anywhere makes the whole row NaN (m = NaN), never a silent value.
template <class In, class Out>
void log_softmax_row(const In* x, Out* out, int64_t n) {
  if (n == 0) return;
  double m = -std::numeric_limits<double>::infinity();
  bool nan = false;
  for (int64_t j = 0; j < n; ++j) {
    const double v = static_cast<double>(x[j]);
    nan |= std::isnan(v);
    m = v > m ? v : m;
  }
  if (nan) m = std::numeric_limits<double>::quiet_NaN();
  if (m == -std::numeric_limits<double>::infinity()) {  // every entry -inf: exp(-inf - -inf) is NaN
    for (int64_t j = 0; j < n; ++j) out[j] = static_cast<Out>(m);
    return;
  }
  double sum = 0;
  for (int64_t j = 0; j < n; ++j) sum += std::exp(static_cast<double>(x[j]) - m);
  // (x - m) - log(sum), not x - (m + log(sum)): with |m| = 1e30 the second loses log(sum)
  const double log_sum = std::log(sum);
  for (int64_t j = 0; j < n; ++j) out[j] = static_cast<Out>((static_cast<double>(x[j]) - m) - log_sum);
}

// log sigmoid(z) = -softplus(-z), softplus(y) = max(y, 0) + log1p(exp(-|y|)): no overflow.
inline double log_sigmoid(double z) {
  const double y = -z;
  return -((y > 0 ? y : 0.0) + std::log1p(std::exp(-std::fabs(y))));
}

template <class T>
double dot(const T* a, const T* b, int64_t n) {
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += static_cast<double>(a[i]) * static_cast<double>(b[i]);
  return s;
}

}  // namespace attn::output
