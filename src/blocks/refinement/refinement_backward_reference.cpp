// Attention-weight refinement's backward written plainly (attn/refinement.hpp's formulas): the
// forward again with every matrix out (P1, P2, A^, U = A V), then each product's derivative by
// hand, loops over every index, sums in T. T = double is the reference the fast form is tested
// against; T = float is the plain float32 implementation whose error sets the tests' tolerance.
#include <algorithm>
#include <cmath>
#include <vector>

#include "refinement/refinement_internal.hpp"

namespace attn::refinement {

template <class T>
void backward_plain(const T* dout, const T* a, const T* v, int64_t batch, int64_t n, int64_t dv, const T* w1,
                    const T* w2, int64_t r, const RefineOptions& o, T* grad_a, T* grad_v, T* grad_w1, T* grad_w2) {
  const bool stoch = o.form == RefineForm::stochastic;
  const bool vw = o.form == RefineForm::value_weighted, add = o.form == RefineForm::additive;
  const T gamma = static_cast<T>(o.gamma), c = add ? gamma : T(1);
  const T scale = static_cast<T>(1.0 / std::sqrt(static_cast<double>(r)));
  const size_t nr = static_cast<size_t>(n * r), nn = static_cast<size_t>(n * n), nd = static_cast<size_t>(n * dv);
  std::fill(grad_w1, grad_w1 + nr, T(0));
  std::fill(grad_w2, grad_w2 + nr, T(0));
  std::vector<T> p1(nr), p2(nr), x2(nr), hat(nn), dhat(nn), ds(nn), u(nd), du(nd), dvt(nd), dp1(nr), dp2(nr);
  for (int64_t b = 0; b < batch; ++b) {
    const T* A = a + b * n * n;
    const T* V = v + b * n * dv;
    const T* dO = dout + b * n * dv;
    // forward: P1 = A W1, P2 = A W2 (stochastic: sigma = elu(P2) + 1), U = A V
    for (int64_t i = 0; i < n; ++i)
      for (int64_t k = 0; k < r; ++k) {
        T s1 = 0, s2 = 0;
        for (int64_t p = 0; p < n; ++p) {
          s1 += A[i * n + p] * w1[p * r + k];
          s2 += A[i * n + p] * w2[p * r + k];
        }
        p1[i * r + k] = s1;
        p2[i * r + k] = s2;
        x2[i * r + k] = stoch ? elu1(s2) : s2;
      }
    for (int64_t i = 0; i < n; ++i)
      for (int64_t e = 0; e < dv; ++e) {
        T s = 0;
        for (int64_t p = 0; p < n; ++p) s += A[i * n + p] * V[p * dv + e];
        u[i * dv + e] = s;
      }
    // A^ = row softmax of the scores over j <= i
    std::fill(hat.begin(), hat.end(), T(0));
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t j = 0; j <= i; ++j) {
        T s = 0;
        for (int64_t k = 0; k < r; ++k) {
          if (stoch) {
            const T dm = p1[i * r + k] - p1[j * r + k], dsg = x2[i * r + k] - x2[j * r + k];
            s -= dm * dm + dsg * dsg;
          } else {
            s += p1[i * r + k] * x2[j * r + k];
          }
        }
        hat[i * n + j] = stoch ? s : s * scale;
      }
      softmax_row<T, T>(hat.data() + i * n, i + 1);
    }
    // O = c A^ Vt (+ (1 - gamma) U), Vt = U (value_weighted) or V
    const T* Vt = vw ? u.data() : V;
    std::fill(dhat.begin(), dhat.end(), T(0));
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j <= i; ++j) {
        T s = 0;
        for (int64_t e = 0; e < dv; ++e) s += dO[i * dv + e] * Vt[j * dv + e];
        dhat[i * n + j] = c * s;
      }
    for (int64_t j = 0; j < n; ++j)
      for (int64_t e = 0; e < dv; ++e) {
        T s = 0;
        for (int64_t i = j; i < n; ++i) s += hat[i * n + j] * dO[i * dv + e];
        dvt[j * dv + e] = c * s;
      }
    for (size_t e = 0; e < nd; ++e) du[e] = vw ? dvt[e] : add ? (T(1) - gamma) * dO[e] : T(0);
    T* gV = grad_v + b * n * dv;
    for (int64_t j = 0; j < n; ++j)
      for (int64_t e = 0; e < dv; ++e) {
        T s = vw ? T(0) : dvt[j * dv + e];
        for (int64_t i = 0; i < n; ++i) s += A[i * n + j] * du[i * dv + e];  // dV += A^T dU
        gV[j * dv + e] = s;
      }
    // the softmax's backward
    std::fill(ds.begin(), ds.end(), T(0));
    for (int64_t i = 0; i < n; ++i) {
      T dot = 0;
      for (int64_t j = 0; j <= i; ++j) dot += hat[i * n + j] * dhat[i * n + j];
      for (int64_t j = 0; j <= i; ++j) ds[i * n + j] = hat[i * n + j] * (dhat[i * n + j] - dot);
    }
    // the scores' backward: dP1, dP2
    std::fill(dp1.begin(), dp1.end(), T(0));
    std::fill(dp2.begin(), dp2.end(), T(0));
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j <= i; ++j) {
        const T g = ds[i * n + j];
        for (int64_t k = 0; k < r; ++k) {
          if (stoch) {  // s_ij = -sum (mu_i - mu_j)^2 + (sigma_i - sigma_j)^2
            const T dm = p1[i * r + k] - p1[j * r + k], dsg = x2[i * r + k] - x2[j * r + k];
            dp1[i * r + k] -= 2 * g * dm;
            dp1[j * r + k] += 2 * g * dm;
            dp2[i * r + k] -= 2 * g * dsg;  // d sigma, turned into d P2 below
            dp2[j * r + k] += 2 * g * dsg;
          } else {  // s_ij = scale p1_i . p2_j
            dp1[i * r + k] += scale * g * p2[j * r + k];
            dp2[j * r + k] += scale * g * p1[i * r + k];
          }
        }
      }
    if (stoch)
      for (size_t e = 0; e < nr; ++e) dp2[e] *= p2[e] > 0 ? T(1) : std::exp(p2[e]);  // elu'
    // dA = dP1 W1^T + dP2 W2^T + dU V^T (every entry), dW += A^T dP
    T* gA = grad_a + b * n * n;
    for (int64_t i = 0; i < n; ++i)
      for (int64_t p = 0; p < n; ++p) {
        T s = 0;
        for (int64_t k = 0; k < r; ++k) s += dp1[i * r + k] * w1[p * r + k] + dp2[i * r + k] * w2[p * r + k];
        for (int64_t e = 0; e < dv; ++e) s += du[i * dv + e] * V[p * dv + e];
        gA[i * n + p] = s;
      }
    for (int64_t p = 0; p < n; ++p)
      for (int64_t k = 0; k < r; ++k) {
        T s1 = 0, s2 = 0;
        for (int64_t i = 0; i < n; ++i) {
          s1 += A[i * n + p] * dp1[i * r + k];
          s2 += A[i * n + p] * dp2[i * r + k];
        }
        grad_w1[p * r + k] += s1;
        grad_w2[p * r + k] += s2;
      }
  }
}

template void backward_plain<float>(const float*, const float*, const float*, int64_t, int64_t, int64_t, const float*,
                                    const float*, int64_t, const RefineOptions&, float*, float*, float*, float*);
template void backward_plain<double>(const double*, const double*, const double*, int64_t, int64_t, int64_t,
                                     const double*, const double*, int64_t, const RefineOptions&, double*, double*,
                                     double*, double*);

}  // namespace attn::refinement
