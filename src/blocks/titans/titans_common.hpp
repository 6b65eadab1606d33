// What the Titans fast form and its float64 reference share (src/titans/): argument checks,
// the exact gelu and its derivative, and the layer sizes of a memory.
#pragma once
#include <cmath>
#include <cstdint>
#include <string>

#include "attn/error.hpp"
#include "attn/titans.hpp"

namespace attn::titans {

constexpr const char* kWhere = "titans_memory";
constexpr const char* kWhereBackward = "titans_memory_backward";

// gelu(z) = z Phi(z), exact (erf); gelu'(z) = Phi(z) + z phi(z).
template <class T>
inline T gelu(T z) {
  return T(0.5) * z * (T(1) + std::erf(z * T(0.70710678118654752440)));
}
template <class T>
inline T gelu_grad(T z) {
  const T cdf = T(0.5) * (T(1) + std::erf(z * T(0.70710678118654752440)));
  return cdf + z * T(0.39894228040143267794) * std::exp(T(-0.5) * z * z);
}

// Both at once, one erf and one exp.
template <class T>
inline void gelu_and_grad(T z, T& g, T& dg) {
  const T cdf = T(0.5) * (T(1) + std::erf(z * T(0.70710678118654752440)));
  g = z * cdf;
  dg = cdf + z * T(0.39894228040143267794) * std::exp(T(-0.5) * z * z);
}

// gelu and gelu' of n floats, in float, without libm: Phi(z) = 1 - erfc(u)/2 (z >= 0) or erfc(u)/2
// (z < 0) with u = |z|/sqrt(2), erfc(u) = exp(-u^2) t P(t), t = 1/(1 + u/2), P a degree-10
// polynomial fitted here (least squares on the relative error over u in [0, 10]; float
// evaluation within 4e-7 of erfc relative, so Phi within 2e-7 absolute), and exp(-u^2), which
// phi(z) = exp(-u^2)/sqrt(2 pi) reuses, as 2^n times a degree-7 Taylor polynomial. Branch-free,
// so the loop vectorises. Below exp(-87) the exponential is taken as 0. NaN and inf propagate
// as the float64 formulas do (gelu(-inf) and gelu'(+-inf) are NaN there too).
// Defined in titans_gelu.cpp, compiled with -fno-trapping-math (else GCC keeps the selects as
// branches and the loop scalar).
void gelu_rows(const float* z, float* g, float* dg, int64_t n);

// The loss's gradient scale: l = c ||e||^2 gives grad = 2c e (...): 2 (sum) or 2 / d (mean).
inline double grad_scale(TitansLoss loss, int64_t d) { return loss == TitansLoss::mean ? 2.0 / double(d) : 2.0; }

// Checks shape, config, the presence of the arrays and the gates' ranges (theta >= 0, eta and
// alpha in [0, 1]; NaN passes). T is float or double.
template <class T>
void check_args(const TitansShape& s, const TitansConfig& c, const T* q, const T* k, const T* v, const T* theta,
                const T* eta, const T* alpha, int64_t w0_groups, const void* y, const void* w_out,
                const char* where = kWhere) {
  auto need = [where](int64_t x, const char* name, int64_t lo) {
    if (x < lo) fail(where, std::string(name) + " must be >= " + std::to_string(lo) + ", got " + std::to_string(x));
  };
  need(s.batch, "batch (B)", 0);
  need(s.heads, "heads (H)", 0);
  need(s.tokens, "tokens (N)", 0);
  need(s.dim, "dim (d)", 1);
  need(c.batch_size, "batch_size", 1);
  if (c.memory != TitansMemory::linear && c.memory != TitansMemory::mlp)
    fail(where, "memory must be linear or mlp, got " + std::to_string(static_cast<int>(c.memory)));
  const int64_t seqs = s.batch * s.heads;
  if (w0_groups != 1 && w0_groups != s.heads && w0_groups != seqs)
    fail(where, "w0 (and s0) must hold 1, H = " + std::to_string(s.heads) + " or B*H = " + std::to_string(seqs) +
                     " sets of weights, got " + std::to_string(w0_groups));
  if (seqs == 0) return;
  if (s.tokens > 0) {
    const std::pair<const T*, const char*> arrays[] = {{q, "q"},         {k, "k"},     {v, "v"},
                                                       {theta, "theta"}, {eta, "eta"}, {alpha, "alpha"}};
    for (const auto& [p, name] : arrays)
      if (p == nullptr) fail(where, std::string(name) + " has no data");
    if (y == nullptr) fail(where, "y (the output) has no data");
  }
  if (w_out == nullptr) fail(where, "w_out (the final weights) has no data");
  const int64_t n = seqs * s.tokens;
  auto at = [&](int64_t i) {
    const int64_t t = i % s.tokens, bh = i / s.tokens;
    return "[b=" + std::to_string(bh / s.heads) + ", h=" + std::to_string(bh % s.heads) + ", t=" + std::to_string(t) +
           "] = ";
  };
  for (int64_t i = 0; i < n; ++i) {
    if (theta[i] < 0) fail(where, "theta" + at(i) + std::to_string(double(theta[i])) + " must be >= 0");
    if (eta[i] < 0 || eta[i] > 1)
      fail(where, "eta" + at(i) + std::to_string(double(eta[i])) + " must be in [0, 1]");
    if (alpha[i] < 0 || alpha[i] > 1)
      fail(where, "alpha" + at(i) + std::to_string(double(alpha[i])) + " must be in [0, 1]");
  }
}

// w0 of sequence bh (b * H + h) given w0_groups.
template <class T>
const T* w0_of(const T* w0, int64_t w0_groups, int64_t bh, int64_t heads, int64_t count) {
  if (w0 == nullptr) return nullptr;
  const int64_t g = w0_groups == 1 ? 0 : (w0_groups == heads ? bh % heads : bh);
  return w0 + g * count;
}

// The group of M_0 (and S_0) sequence bh reads.
inline int64_t group_of(int64_t w0_groups, int64_t bh, int64_t heads) {
  return w0_groups == 1 ? 0 : (w0_groups == heads ? bh % heads : bh);
}

// The backward's checks: the forward's (under the backward's name), and every gradient output
// that has to be written is there. Args: TitansArgs or TitansArgs64; Grads: TitansGrads(64).
template <class Args, class Grads>
void check_backward_args(const TitansShape& s, const TitansConfig& c, const Args& in, const Grads& out) {
  check_args(s, c, in.q, in.k, in.v, in.theta, in.eta, in.alpha, in.w0_groups, &s, &s, kWhereBackward);
  if (s.batch * s.heads == 0 || s.tokens == 0) return;
  const std::pair<const void*, const char*> outs[] = {{out.dq, "dq"},         {out.dk, "dk"},     {out.dv, "dv"},
                                                      {out.dtheta, "dtheta"}, {out.deta, "deta"}, {out.dalpha, "dalpha"}};
  for (const auto& [p, name] : outs)
    if (p == nullptr) fail(kWhereBackward, std::string(name) + " (a gradient output) has no data");
}

}  // namespace attn::titans
