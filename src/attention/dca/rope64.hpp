// RoPE in float64 for DCA's references (forward and backward): a row rotated to its position,
// and a gradient rotated back. The rotation R(pos) is orthogonal, so the gradient of x -> R x is
// g -> R^T g = R(-pos) g: pair (a, b) of g becomes (a cos + b sin, -a sin + b cos).
#pragma once
#include <cmath>
#include <cstdint>

#include "attn/rope.hpp"
#include "attn/tensor.hpp"

namespace attn::dca {

// Channels (a, b) of pair c of a D-channel row and the pair's angle at position pos.
inline void rope64_pair(const Rope& r, int64_t D, int64_t c, int64_t pos, int64_t& ia, int64_t& ib, double& angle) {
  const int64_t half = D / 2;
  angle = static_cast<double>(pos) * std::pow(r.theta, -2.0 * static_cast<double>(c) / static_cast<double>(D));
  ia = r.style == RopeStyle::half ? c : 2 * c, ib = r.style == RopeStyle::half ? c + half : 2 * c + 1;
}

// out = row (b, h, n) of x rotated by RoPE at position pos, in float64.
inline void rope64(const Rope& r, const TensorView& x, int64_t b, int64_t h, int64_t n, int64_t pos, double* out) {
  const int64_t D = x.dim();
  for (int64_t c = 0; c < D; ++c) out[c] = x.at(b, h, n, c);
  for (int64_t c = 0; c < D / 2; ++c) {
    int64_t ia, ib;
    double angle;
    rope64_pair(r, D, c, pos, ia, ib, angle);
    const double xa = out[ia], xb = out[ib];
    out[ia] = xa * std::cos(angle) - xb * std::sin(angle);
    out[ib] = xa * std::sin(angle) + xb * std::cos(angle);
  }
}

// g (D values) = R(pos)^T g: the gradient with respect to a row from the gradient with respect to
// the row rotated at pos. T: double (the oracle) or float (the plain baseline).
template <class T>
void rope64_back(const Rope& r, int64_t D, int64_t pos, T* g) {
  for (int64_t c = 0; c < D / 2; ++c) {
    int64_t ia, ib;
    double angle;
    rope64_pair(r, D, c, pos, ia, ib, angle);
    const T co = static_cast<T>(std::cos(angle)), si = static_cast<T>(std::sin(angle));
    const T ga = g[ia], gb = g[ib];
    g[ia] = ga * co + gb * si;
    g[ib] = gb * co - ga * si;
  }
}

}  // namespace attn::dca
