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

}  // namespace attn::linear
