// The feature maps phi of linear attention, one element at a time (references) and over float
// rows (fast forms; exp through the kernels' vector exp).
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>

#include <vector>

#include "attn/mechanism.hpp"
#include "kernels/kernel_table.hpp"
#include "linear/linear.hpp"

namespace attn::linear {

// Every map first turns +-inf into NaN (x + (x - x)): relu(-inf) = 0 or a clamped exp(+inf)
// would hide a non-finite input, which must poison the rows that see it.
template <class T>
T feature(FeatureMap f, T x) {
  x += x - x;
  switch (f) {
    case FeatureMap::elu: return x > 0 ? x + 1 : std::exp(x);
    case FeatureMap::relu: return x < 0 ? T(0) : x;  // NaN stays NaN (a non-finite input poisons)
    case FeatureMap::identity: return x;
    case FeatureMap::exp: return std::exp(x);
    case FeatureMap::relu2: return x < 0 ? T(0) : x * x;
  }
  return x;
}

// phi'(x), the backward's slope of feature(f, x); NaN for a non-finite x (it must poison the
// gradient of its row as it poisoned the output).
template <class T>
T feature_slope(FeatureMap f, T x) {
  x += x - x;
  const T poison = x - x;  // 0, or NaN
  switch (f) {
    case FeatureMap::elu: return x > 0 ? T(1) + poison : std::exp(x);
    case FeatureMap::relu: return (x > 0 ? T(1) : T(0)) + poison;
    case FeatureMap::identity: return T(1) + poison;
    case FeatureMap::exp: return std::exp(x);
    case FeatureMap::relu2: return (x > 0 ? 2 * x : T(0)) + poison;
  }
  return x;
}

// slope[i] = phi'(x[i]) from x and fx = phi(x) (the fast backward's), i < n: elu's slope at or
// below 0 and exp's are phi itself, so no second exp; NaN where fx is. One loop per map, without
// branches in the elu one (random signs would mispredict every other element).
inline void feature_slopes_from(FeatureMap f, const float* x, const float* fx, int64_t n, float* slope) {
  switch (f) {
    case FeatureMap::elu:
      for (int64_t i = 0; i < n; ++i) {  // m a + (1 - m) fx: a (1, or NaN with fx) above 0, else fx (finite there)
        const float m = x[i] > 0 ? 1.0f : 0.0f, above = 1.0f + (fx[i] - fx[i]);
        slope[i] = m * above + (1.0f - m) * fx[i];
      }
      return;
    case FeatureMap::exp: std::copy(fx, fx + n, slope); return;
    default:
      for (int64_t i = 0; i < n; ++i) slope[i] = feature_slope(f, x[i]);
  }
}

// x[i] = phi(x[i]) for i < n.
inline void map_features(const kernels::TileKernels& kern, FeatureMap f, float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] += x[i] - x[i];  // +-inf -> NaN, as feature()
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
      for (int64_t i = 0; i < n; ++i) x[i] = x[i] < 0 ? 0.0f : x[i] * x[i];  // NaN stays NaN
      return;
  }
}

// The features of one row x (D values) into out (F values), in T (the references): the
// elementwise map, or Performer's random features (queries shifted by their maximum).
// PolaFormer's [x+, x-] (queries and same-sign keys) or [x-, x+] (opposite-sign keys), with
// x+ = relu(x)^p, x- = relu(-x)^p per channel.
template <class T>
void polar_features(const LinearProblem& p, bool query, const T* x, T* out) {
  const bool swap = !query && p.stream == 1;
  for (int64_t c = 0; c < p.D; ++c) {
    const T e = static_cast<T>(p.power[static_cast<size_t>(c)]);
    // a NaN channel is NaN in both halves: it must reach the output, not vanish as "neither sign"
    const T nan = std::isnan(x[c]) ? x[c] : T(0);
    const T pos = x[c] > 0 ? std::pow(x[c], e) : nan, neg = x[c] < 0 ? std::pow(-x[c], e) : nan;
    out[c] = swap ? neg : pos;
    out[p.D + c] = swap ? pos : neg;
  }
}

template <class T>
void reference_features(const LinearProblem& p, bool query, const T* x, T* out) {
  if (p.polar()) return polar_features(p, query, x, out);
  if (p.omega_t.empty()) {
    for (int64_t c = 0; c < p.D; ++c) out[c] = feature(p.mech.map, x[c]);
    return;
  }
  const T s = std::pow(static_cast<T>(p.D), T(-0.25));
  T half = 0;
  for (int64_t c = 0; c < p.D; ++c) half += x[c] * s * x[c] * s;
  half /= 2;
  T most = -INFINITY;
  for (int64_t f = 0; f < p.F; ++f) {
    T u = 0;
    for (int64_t c = 0; c < p.D; ++c) u += static_cast<T>(p.omega_t[static_cast<size_t>(c * p.F + f)]) * (x[c] * s);
    out[f] = u;
    most = std::max(most, u);
  }
  const T sub = query ? most : half, norm = 1 / std::sqrt(static_cast<T>(p.F));
  for (int64_t f = 0; f < p.F; ++f) out[f] = std::exp(out[f] - sub) * norm;
}

// The same over n float rows: x (n x D, overwritten) -> out (n x F).
inline void fast_features(const kernels::TileKernels& kern, const LinearProblem& p, bool query, float* x, int64_t n,
                          float* out) {
  if (p.polar()) {
    for (int64_t r = 0; r < n; ++r) polar_features(p, query, x + r * p.D, out + r * p.F);
    return;
  }
  if (p.omega_t.empty()) {
    if (out != x) std::copy(x, x + n * p.D, out);
    map_features(kern, p.mech.map, out, n * p.D);
    return;
  }
  const float s = static_cast<float>(std::pow(static_cast<double>(p.D), -0.25));
  for (int64_t e = 0; e < n * p.D; ++e) x[e] *= s;
  kern.gemm(n, p.F, p.D, x, p.D, 1, p.omega_t.data(), p.F, out, p.F, false);
  const float norm = static_cast<float>(1 / std::sqrt(static_cast<double>(p.F)));
  for (int64_t r = 0; r < n; ++r) {
    float* u = out + r * p.F;
    float sub = 0;
    if (query) {
      sub = -INFINITY;
      for (int64_t f = 0; f < p.F; ++f) sub = std::max(sub, u[f]);
    } else {
      for (int64_t c = 0; c < p.D; ++c) sub += x[r * p.D + c] * x[r * p.D + c];
      sub /= 2;
    }
    kern.exp_shift_sum(u, p.F, sub);
    for (int64_t f = 0; f < p.F; ++f) u[f] *= norm;
  }
}

}  // namespace attn::linear
