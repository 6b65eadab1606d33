// Internals of attention-weight refinement (src/refinement/): the row helpers both forms use and
// the float64 reference (refinement_reference.cpp).
#pragma once
#include <cmath>
#include <cstdint>
#include <limits>

#include "attn/refinement.hpp"

namespace attn::refinement {

// Softmax over x[0..n) in place. A NaN or an infinite maximum makes the row NaN (non-finite
// inputs propagate); the diagonal key is always allowed, so a row is never empty.
template <class T, class Acc>
void softmax_row(T* x, int64_t n) {
  Acc m = -std::numeric_limits<Acc>::infinity();
  bool nan = false;
  for (int64_t j = 0; j < n; ++j) {
    const Acc v = static_cast<Acc>(x[j]);
    nan |= std::isnan(v);
    m = v > m ? v : m;
  }
  if (nan || m == std::numeric_limits<Acc>::infinity() || m == -std::numeric_limits<Acc>::infinity()) {
    // +inf scores or NaN: no meaningful distribution; NaN propagates
    for (int64_t j = 0; j < n; ++j) x[j] = std::numeric_limits<T>::quiet_NaN();
    return;
  }
  Acc sum = 0;
  for (int64_t j = 0; j < n; ++j) {
    const Acc e = std::exp(static_cast<Acc>(x[j]) - m);
    x[j] = static_cast<T>(e);
    sum += e;
  }
  const Acc inv = Acc(1) / sum;
  for (int64_t j = 0; j < n; ++j) x[j] = static_cast<T>(static_cast<Acc>(x[j]) * inv);
}

template <class T>
T elu1(T x) {
  return x > 0 ? x + T(1) : std::exp(x);  // elu(x) + 1; NaN stays NaN
}

// R (n, n) of one batch entry: the refined weights of the form, every matrix written out, sums in
// double (a (n, n), w1 and w2 (n, r)).
void reference_weights(const double* a, int64_t n, const double* w1, const double* w2, int64_t r,
                       const RefineOptions& o, double* R);

}  // namespace attn::refinement
