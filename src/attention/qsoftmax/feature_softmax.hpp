// The query's feature softmax of qsoftmax, shared by its forward, backward and references.
#pragma once
#include <cmath>
#include <cstdint>
#include <limits>

namespace attn::qsoftmax {

// softmax over the row's features, in place; a NaN or +inf feature makes the row NaN.
template <class T>
void softmax_features(T* x, int64_t n) {
  T top = -std::numeric_limits<T>::infinity();
  for (int64_t f = 0; f < n; ++f) top = (x[f] > top || std::isnan(x[f])) ? x[f] : top;
  T sum = 0;
  for (int64_t f = 0; f < n; ++f) sum += (x[f] = std::exp(x[f] - top));
  for (int64_t f = 0; f < n; ++f) x[f] /= sum;
}

// Its backward: dx = a o (da - a . da) for a = softmax(x) and da the gradient with respect to a
// (the softmax's Jacobian diag(a) - a a^T, symmetric).
template <class T>
void softmax_features_backward(const T* a, const T* da, int64_t n, T* dx) {
  T s = 0;
  for (int64_t f = 0; f < n; ++f) s += a[f] * da[f];
  for (int64_t f = 0; f < n; ++f) dx[f] = a[f] * (da[f] - s);
}

}  // namespace attn::qsoftmax
