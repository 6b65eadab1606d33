// The feature maps' backward: the gradient of a row's features mapped back to the row. One
// function for the float64 reference and the fast forms. For n rows x (D values each), their
// features a = factor phi(x) (F values each) and da = dL/da:
//   elementwise maps (F = D):  dx_c = da_c (factor phi'(x_c))
//   performer:                 dx_c = s (sum_f Omega_cf w_f - [keys only] (s x_c) sum_f w_f),  w_f = a_f da_f
// with phi(x)_f = exp(s (Omega^T x)_f - sub) / sqrt(F), s = D^(-1/4). Keys: sub = |s x|^2 / 2, whose
// derivative is the second term. Queries: sub = max_f (the projections), a stabiliser: a factor
// common to a row's features, which cancels in the normalised output (performer always normalises,
// with no eps: linear_backward_refusal checks), so it is a constant here. w_f = a_f da_f does not
// depend on the factor (a = factor phi, da = dL/dphi / factor).
//   polaformer (F = 2 D):      dx_c = factor (da+_c p_c x_c^(p_c - 1) [x_c > 0] - da-_c p_c (-x_c)^(p_c - 1) [x_c < 0])
// with phi = [x+, x-] (queries, same-sign keys) or [x-, x+] (opposite-sign keys), x+ = relu(x)^p;
// and the powers' gradient dpower_c += (a+_c da+_c + a-_c da-_c) ln |x_c|  (d x^p / dp = x^p ln x).
// What a row keeps for this (aux, D values): the elementwise maps' slopes phi'(x), performer's s x,
// polaformer's x.
#pragma once
#include <algorithm>
#include <cmath>
#include <limits>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "kernels/kernel_table.hpp"
#include "linear/feature_map.hpp"
#include "linear/linear.hpp"

namespace attn::linear {

// Performer's random feature rows Omega (F, D) row-major as floats (omega_t transposed), the fast
// forms' right-hand side of sum_f w_f Omega_fc; empty for the elementwise maps. Built once per call,
// before the parallel region.
inline std::vector<float> feature_omega(const LinearProblem& p) {
  std::vector<float> omega;
  if (p.omega_t.empty()) return omega;
  omega.resize(static_cast<size_t>(p.F * p.D));
  for (int64_t c = 0; c < p.D; ++c)
    for (int64_t f = 0; f < p.F; ++f)
      omega[static_cast<size_t>(f * p.D + c)] = p.omega_t[static_cast<size_t>(c * p.F + f)];
  return omega;
}

// The aux of one row x (D values), in T (the reference's): phi'(x), or performer's s x.
template <class T>
void feature_aux(const LinearProblem& p, const T* x, T* aux) {
  if (p.polar()) {
    std::copy(x, x + p.D, aux);
    return;
  }
  if (p.omega_t.empty()) {
    for (int64_t c = 0; c < p.D; ++c) aux[c] = feature_slope(p.mech.map, x[c]);
    return;
  }
  const T s = static_cast<T>(std::pow(static_cast<double>(p.D), -0.25));
  for (int64_t c = 0; c < p.D; ++c) aux[c] = s * x[c];
}

// PolaFormer's part of feature_backward (its comment): dx and, with dpower (D values), the powers'
// gradient added. A NaN x poisons dx and dpower. from_features (the fast forms): |x|^(p-1) as the
// feature |x|^p over |x| (one division for a pow; std::pow where the feature under- or overflowed).
template <class T>
void polar_backward(const LinearProblem& p, bool query, int64_t n, const T* x, const T* a, const T* da, T factor,
                    T* dx, T* dpower, bool from_features) {
  const int64_t D = p.D, F = p.F;
  const bool swap = !query && p.stream == 1;
  // e |x|^(e - 1) for x != 0 whose feature is f = |x|^e
  const auto slope = [from_features](T ax, T e, T f) {
    return from_features && f > 0 && f < std::numeric_limits<T>::max() ? e * (f / ax) : e * std::pow(ax, e - 1);
  };
  for (int64_t r = 0; r < n; ++r)
    for (int64_t c = 0; c < D; ++c) {
      const T xc = x[r * D + c], e = static_cast<T>(p.power[static_cast<size_t>(c)]);
      const T poison = xc - xc;  // 0, or NaN
      const int64_t ip = r * F + (swap ? D + c : c), in = r * F + (swap ? c : D + c);
      const T up = xc > 0 ? slope(xc, e, a[ip]) : poison, down = xc < 0 ? -slope(-xc, e, a[in]) : poison;
      dx[r * D + c] = factor * (da[ip] * up + da[in] * down);
      if (dpower && xc != 0) dpower[c] += (a[ip] * da[ip] + a[in] * da[in]) * std::log(std::abs(xc));
    }
}

// dx (n x D) from da (n x F), the features a (n x F) and aux (n x D) of n rows; w: n x F scratch
// (performer); dpower: polaformer's powers' gradient (D values, added to) or null. Loops in T;
// with kern (float, the fast forms) performer's sum over features is one kern.gemm against omega
// (feature_omega(p)).
template <class T>
void feature_backward(const LinearProblem& p, bool query, int64_t n, const T* aux, const T* a, const T* da, T factor,
                      T* dx, T* w, const kernels::TileKernels* kern = nullptr, const float* omega = nullptr,
                      T* dpower = nullptr) {
  const int64_t D = p.D, F = p.F;
  if (p.polar()) return polar_backward(p, query, n, aux, a, da, factor, dx, dpower, kern != nullptr);
  if (p.omega_t.empty()) {  // elementwise: F = D
    for (int64_t e = 0; e < n * D; ++e) dx[e] = da[e] * (factor * aux[e]);
    return;
  }
  for (int64_t e = 0; e < n * F; ++e) w[e] = a[e] * da[e];
  bool done = false;
  if constexpr (std::is_same_v<T, float>) {
    if (kern && n > 0) {
      kern->gemm(n, D, F, w, F, 1, omega, D, dx, D, false);
      done = true;
    }
  }
  if (!done)
    for (int64_t r = 0; r < n; ++r)
      for (int64_t c = 0; c < D; ++c) {
        T sum = 0;
        for (int64_t f = 0; f < F; ++f) sum += static_cast<T>(p.omega_t[static_cast<size_t>(c * F + f)]) * w[r * F + f];
        dx[r * D + c] = sum;
      }
  const T s = static_cast<T>(std::pow(static_cast<double>(D), -0.25));
  for (int64_t r = 0; r < n; ++r) {
    T total = 0;
    if (!query)
      for (int64_t f = 0; f < F; ++f) total += w[r * F + f];
    for (int64_t c = 0; c < D; ++c) dx[r * D + c] = s * (dx[r * D + c] - aux[r * D + c] * total);
  }
}

}  // namespace attn::linear
