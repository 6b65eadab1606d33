// The feature maps phi of linear attention, one element at a time (references) and over float
// rows (fast forms; exp through the kernels' vector exp).
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "attn/mechanism.hpp"
#include "kernels/kernel_table.hpp"

namespace attn::linear {

template <class T>
T feature(FeatureMap f, T x) {
  switch (f) {
    case FeatureMap::elu: return x > 0 ? x + 1 : std::exp(x);
    case FeatureMap::relu: return x > 0 ? x : T(0);
    case FeatureMap::identity: return x;
    case FeatureMap::exp: return std::exp(x);
    case FeatureMap::relu2: return x > 0 ? x * x : T(0);
  }
  return x;
}

// x[i] = phi(x[i]) for i < n.
inline void map_features(const kernels::TileKernels& kern, FeatureMap f, float* x, int64_t n) {
  switch (f) {
    case FeatureMap::elu:  // max(x, 0) + exp(min(x, 0)): x + 1 above zero, exp(x) at or below
      for (int64_t i0 = 0; i0 < n; i0 += 256) {
        float pos[256];
        const int64_t m = std::min<int64_t>(256, n - i0);
        for (int64_t i = 0; i < m; ++i) pos[i] = std::max(x[i0 + i], 0.0f), x[i0 + i] = std::min(x[i0 + i], 0.0f);
        kern.exp_shift_sum(x + i0, m, 0.0f);
        for (int64_t i = 0; i < m; ++i) x[i0 + i] += pos[i];
      }
      return;
    case FeatureMap::relu:
      for (int64_t i = 0; i < n; ++i) x[i] = std::max(x[i], 0.0f);
      return;
    case FeatureMap::identity: return;
    case FeatureMap::exp: kern.exp_shift_sum(x, n, 0.0f); return;
    case FeatureMap::relu2:
      for (int64_t i = 0; i < n; ++i) x[i] = x[i] > 0 ? x[i] * x[i] : 0.0f;
      return;
  }
}

}  // namespace attn::linear
