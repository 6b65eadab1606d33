// NormAttention's output normalisation (TransNormer): RMSNorm or LayerNorm over a row's Dv
// channels, no affine, eps 1e-6; the same code in the references (T = double) and fast forms.
#pragma once
#include <cmath>
#include <cstdint>

#include "attn/mechanism.hpp"

namespace attn::linear {

constexpr double kNormEps = 1e-6;

template <class T>
void normalise_row(OutputNorm norm, T* x, int64_t n) {
  if (norm == OutputNorm::none || n == 0) return;
  T mean = 0;
  if (norm == OutputNorm::layer) {
    for (int64_t c = 0; c < n; ++c) mean += x[c];
    mean /= static_cast<T>(n);
  }
  T sq = 0;
  for (int64_t c = 0; c < n; ++c) sq += (x[c] - mean) * (x[c] - mean);
  const T inv = 1 / std::sqrt(sq / static_cast<T>(n) + static_cast<T>(kNormEps));
  for (int64_t c = 0; c < n; ++c) x[c] = (x[c] - mean) * inv;
}

// The backward of normalise_row: dy (n) from the row before it, y, and the gradient of the row
// after it, dout. With o = (y - mean) inv (mean 0 for RMSNorm), inv = 1 / sqrt(mean((y - mean)^2) + eps):
//   dy = inv (dout - o mean(dout . o)) [- its mean, LayerNorm].
template <class T>
void normalise_row_backward(OutputNorm norm, const T* y, const T* dout, T* dy, int64_t n) {
  if (norm == OutputNorm::none || n == 0) {
    for (int64_t c = 0; c < n; ++c) dy[c] = dout[c];
    return;
  }
  T mean = 0;
  if (norm == OutputNorm::layer) {
    for (int64_t c = 0; c < n; ++c) mean += y[c];
    mean /= static_cast<T>(n);
  }
  T sq = 0;
  for (int64_t c = 0; c < n; ++c) sq += (y[c] - mean) * (y[c] - mean);
  const T inv = 1 / std::sqrt(sq / static_cast<T>(n) + static_cast<T>(kNormEps));
  T dot = 0;  // mean(dout . o)
  for (int64_t c = 0; c < n; ++c) dot += dout[c] * (y[c] - mean) * inv;
  dot /= static_cast<T>(n);
  T shift = 0;
  for (int64_t c = 0; c < n; ++c) {
    dy[c] = inv * (dout[c] - (y[c] - mean) * inv * dot);
    shift += dy[c];
  }
  if (norm == OutputNorm::layer)
    for (int64_t c = 0; c < n; ++c) dy[c] -= shift / static_cast<T>(n);
}

}  // namespace attn::linear
