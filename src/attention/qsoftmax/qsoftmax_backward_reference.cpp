// qsoftmax's backward reference: the forward written out with its quadratic weights and
// differentiated by hand. With a_i = softmax(q_i) over the D features, S0 the initial state and
// the keys row i sees j < end(i) (the valid ones; causal: j <= i):
//   w_ij = a_i . k_j,   o_i = scale (a_i^T S0 + sum_j w_ij v_j),
//   final state S = S0 + sum_(j < len) k_j v_j^T   (every valid key, causal or not)
// so, for a loss with gradients dO_i (and dS through the final state):
//   dw_ij = scale dO_i . v_j           dV_j = sum_(i sees j) scale w_ij dO_i + dS^T k_j
//   da_i = sum_j dw_ij k_j + scale S0 dO_i
//   dK_j = sum_(i sees j) dw_ij a_i + dS v_j
//   dq_i = a_i o (da_i - a_i . da_i)   (the feature softmax's Jacobian)
//   dS0 = scale sum_i a_i dO_i^T + dS
// dK and dV summed over a kv head's query heads; keys past the valid length get 0. Every (row,
// key) pair visited once, float64 (or float with the intermediates rounded to the storage dtype:
// the tolerance rule's plain baseline).
#include <algorithm>
#include <vector>

#include "core/params.hpp"
#include "qsoftmax/feature_softmax.hpp"
#include "qsoftmax/qsoftmax.hpp"

namespace attn::qsoftmax {
namespace {

void store(const TensorView& t, int64_t b, int64_t h, int64_t i, int64_t c, double x) {
  store_from_float(t.data, t.dtype, t.offset(b, h, i, c), static_cast<float>(x));
}

template <class T>
void reference_impl(const QSoftmaxProblem& p, const core::BackwardViews& g, bool plain) {
  const core::Rounding<T> rnd{p.q.dtype, plain};
  const int64_t D = p.D, Dv = p.Dv;
  const T scale = static_cast<T>(p.scale);
  std::vector<T> a(static_cast<size_t>(D)), da(static_cast<size_t>(D)), dq(static_cast<size_t>(D));
  std::vector<T> dk(static_cast<size_t>(p.M * D)), dv(static_cast<size_t>(p.M * Dv)), ds0(static_cast<size_t>(D * Dv));
  for (int64_t b = 0; b < p.B; ++b)
    for (int64_t hk = 0; hk < p.Hkv; ++hk) {
      std::fill(dk.begin(), dk.end(), T(0));
      std::fill(dv.begin(), dv.end(), T(0));
      for (int64_t h = hk * p.group; h < (hk + 1) * p.group; ++h) {
        auto s0 = [&](int64_t f, int64_t c) { return p.initial ? static_cast<T>(core::element_at(*p.initial, b, h, f, c)) : T(0); };
        auto dS = [&](int64_t f, int64_t c) { return g.dfinal_state.empty() ? T(0) : static_cast<T>(g.dfinal_state.at(b, h, f, c)); };
        std::fill(ds0.begin(), ds0.end(), T(0));
        for (int64_t i = 0; i < p.N; ++i) {
          for (int64_t f = 0; f < D; ++f) a[static_cast<size_t>(f)] = static_cast<T>(p.q.at(b, h, i, f));
          softmax_features(a.data(), D);
          for (T& x : a) x = rnd(x);
          for (int64_t f = 0; f < D; ++f) {  // through the state passed in
            T x = 0;
            for (int64_t c = 0; c < Dv; ++c) {
              const T d = static_cast<T>(g.dout.at(b, h, i, c));
              x += s0(f, c) * d;
              ds0[static_cast<size_t>(f * Dv + c)] += scale * a[static_cast<size_t>(f)] * d;
            }
            da[static_cast<size_t>(f)] = scale * x;
          }
          for (int64_t j = 0; j < key_end(p, b, i); ++j) {
            T w = 0, dw = 0;
            for (int64_t f = 0; f < D; ++f) w += a[static_cast<size_t>(f)] * static_cast<T>(p.k.at(b, hk, j, f));
            for (int64_t c = 0; c < Dv; ++c) dw += static_cast<T>(g.dout.at(b, h, i, c)) * static_cast<T>(p.v.at(b, hk, j, c));
            w = rnd(w), dw = rnd(rnd(dw) * scale);
            for (int64_t c = 0; c < Dv; ++c) dv[static_cast<size_t>(j * Dv + c)] += scale * w * static_cast<T>(g.dout.at(b, h, i, c));
            for (int64_t f = 0; f < D; ++f) {
              da[static_cast<size_t>(f)] += dw * static_cast<T>(p.k.at(b, hk, j, f));
              dk[static_cast<size_t>(j * D + f)] += dw * a[static_cast<size_t>(f)];
            }
          }
          for (T& x : da) x = rnd(x);
          softmax_features_backward(a.data(), da.data(), D, dq.data());
          for (int64_t f = 0; f < D; ++f) store(g.dq, b, h, i, f, static_cast<double>(dq[static_cast<size_t>(f)]));
        }
        if (!g.dfinal_state.empty())  // the final state: S0 + every valid key's k v^T
          for (int64_t j = 0; j < p.kv_len[static_cast<size_t>(b)]; ++j)
            for (int64_t f = 0; f < D; ++f)
              for (int64_t c = 0; c < Dv; ++c) {
                dk[static_cast<size_t>(j * D + f)] += dS(f, c) * static_cast<T>(p.v.at(b, hk, j, c));
                dv[static_cast<size_t>(j * Dv + c)] += dS(f, c) * static_cast<T>(p.k.at(b, hk, j, f));
              }
        if (!g.d_initial_state.empty())
          for (int64_t f = 0; f < D; ++f)
            for (int64_t c = 0; c < Dv; ++c)
              store(g.d_initial_state, b, h, f, c, static_cast<double>(ds0[static_cast<size_t>(f * Dv + c)] + dS(f, c)));
      }
      for (int64_t j = 0; j < p.M; ++j) {
        for (int64_t f = 0; f < D; ++f) store(g.dk, b, hk, j, f, static_cast<double>(dk[static_cast<size_t>(j * D + f)]));
        for (int64_t c = 0; c < Dv; ++c) store(g.dv, b, hk, j, c, static_cast<double>(dv[static_cast<size_t>(j * Dv + c)]));
      }
    }
}

}  // namespace

void QSoftmaxFamily::backward_reference(const QSoftmaxProblem& p, const core::BackwardViews& g,
                                        core::RefPrecision precision) {
  if (precision == core::RefPrecision::f64)
    reference_impl<double>(p, g, false);
  else
    reference_impl<float>(p, g, true);
}

}  // namespace attn::qsoftmax
