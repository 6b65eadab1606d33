// DCA's backward reference: the forward written out plainly and differentiated by hand. With
// q~_i^t = R(pos_t(i)) q_i (the query rotated for part t: intra, successive, inter), k~_j =
// R(j mod s) k_j and t(i, j) the part of pair (i, j) (its chunk lag 0, 1 or >= 2):
//   x_ij = scale q~_i^t(i,j) . k~_j + bias_ij,   P_ij = softmax_j(x_ij) over the keys row i sees,
//   o_i = sum_j P_ij v_j,   lse_i = log sum_j exp(x_ij)
// so, for a loss with gradients dO_i (and dlse_i):
//   dV_j = sum_i P_ij dO_i          dP_ij = dO_i . v_j          D_i = sum_j P_ij dP_ij
//   dX_ij = P_ij (dP_ij - D_i + dlse_i)
//   dq~_i^t = scale sum_(j in part t) dX_ij k~_j      dq_i = sum_t R(pos_t(i))^T dq~_i^t
//   dk~_j = scale sum_i dX_ij q~_i^t(i,j)              dk_j = R(j mod s)^T dk~_j
// One softmax over every key (not three merged ones), every pair visited once, float64 (or float
// with the intermediates rounded to the storage dtype: the tolerance rule's plain baseline).
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/reference_result.hpp"
#include "dca/dca.hpp"
#include "dca/rope64.hpp"
#include "mask/pattern.hpp"

namespace attn::dca {
namespace {

void store(const TensorView& t, int64_t b, int64_t h, int64_t i, int64_t c, double x) {
  store_from_float(t.data, t.dtype, t.offset(b, h, i, c), static_cast<float>(x));
}

template <class T>
void reference_impl(const DcaProblem& dp, const core::BackwardViews& g, bool plain) {
  const exact::Problem& p = dp;
  const Rope rope = dca_rope(dp.dca);
  const core::Rounding<T> rnd{p.q.dtype, plain};
  const T neg_inf = -std::numeric_limits<T>::infinity();
  const int64_t D = p.D, Dv = p.Dv;
  std::vector<double> kr(static_cast<size_t>(p.M * D)), qr(static_cast<size_t>(kDcaParts * D));
  std::vector<T> x(static_cast<size_t>(p.M)), P(static_cast<size_t>(p.M)), dP(static_cast<size_t>(p.M));
  std::vector<uint8_t> seen(static_cast<size_t>(p.M));
  std::vector<T> dkr(static_cast<size_t>(p.M * D)), dv(static_cast<size_t>(p.M * Dv)), dqr(static_cast<size_t>(kDcaParts * D));
  for (int64_t b = 0; b < p.B; ++b)
    for (int64_t hk = 0; hk < p.Hkv; ++hk) {
      for (int64_t j = 0; j < p.M; ++j) rope64(rope, p.k, b, hk, j, mask::floor_mod(j, dp.dca.chunk), &kr[static_cast<size_t>(j * D)]);
      std::fill(dkr.begin(), dkr.end(), T(0));
      std::fill(dv.begin(), dv.end(), T(0));
      for (int64_t h = hk * p.group; h < (hk + 1) * p.group; ++h)
        for (int64_t i = 0; i < p.N; ++i) {
          const int64_t pos = i + p.offset;
          for (int t = 0; t < kDcaParts; ++t)
            rope64(rope, p.q, b, h, i, dca_query_position(dp.dca, kDcaPartSpecs[t].part, pos), &qr[static_cast<size_t>(t * D)]);
          auto part_of = [&](int64_t j) { return static_cast<int64_t>(dca_part(dp.dca, pos, j)); };
          T mx = neg_inf;
          bool nan = false;
          for (int64_t j = 0; j < p.M; ++j) {
            seen[static_cast<size_t>(j)] = p.visible(b, h, i, j);
            if (!seen[static_cast<size_t>(j)]) continue;
            const double* qv = &qr[static_cast<size_t>(part_of(j) * D)];
            T dot = 0;
            for (int64_t c = 0; c < D; ++c) dot += static_cast<T>(qv[c]) * static_cast<T>(kr[static_cast<size_t>(j * D + c)]);
            x[static_cast<size_t>(j)] = rnd(dot * static_cast<T>(p.base_scale) + static_cast<T>(p.additive_bias(b, h, i, j)));
            mx = std::max(mx, x[static_cast<size_t>(j)]);
            nan |= std::isnan(x[static_cast<size_t>(j)]);
          }
          if (mx == neg_inf && !nan) {  // no visible key: the output is 0 whatever q, k, v
            for (int64_t c = 0; c < D; ++c) store(g.dq, b, h, i, c, 0.0);
            continue;
          }
          T sum = 0;
          for (int64_t j = 0; j < p.M; ++j) sum += seen[static_cast<size_t>(j)] ? std::exp(x[static_cast<size_t>(j)] - mx) : T(0);
          T Di = 0;
          for (int64_t j = 0; j < p.M; ++j) {
            P[static_cast<size_t>(j)] = dP[static_cast<size_t>(j)] = 0;
            if (!seen[static_cast<size_t>(j)]) continue;  // a hidden key gets no gradient, even in a NaN row
            P[static_cast<size_t>(j)] = nan ? std::numeric_limits<T>::quiet_NaN() : rnd(std::exp(x[static_cast<size_t>(j)] - mx) / sum);
            T dov = 0;
            for (int64_t c = 0; c < Dv; ++c) dov += static_cast<T>(g.dout.at(b, h, i, c)) * static_cast<T>(p.v.at(b, hk, j, c));
            dP[static_cast<size_t>(j)] = rnd(dov);
            Di += P[static_cast<size_t>(j)] * dP[static_cast<size_t>(j)];
          }
          const T dlse = g.dlse.empty() ? T(0) : static_cast<T>(g.dlse.at(b, h, i, 0));
          const T scale = static_cast<T>(p.base_scale);
          std::fill(dqr.begin(), dqr.end(), T(0));
          for (int64_t j = 0; j < p.M; ++j) {
            if (!seen[static_cast<size_t>(j)]) continue;
            for (int64_t c = 0; c < Dv; ++c)
              dv[static_cast<size_t>(j * Dv + c)] += P[static_cast<size_t>(j)] * static_cast<T>(g.dout.at(b, h, i, c));
            const T dx = rnd(P[static_cast<size_t>(j)] * (dP[static_cast<size_t>(j)] - rnd(Di) + dlse)) * scale;
            const int64_t t = part_of(j);
            for (int64_t c = 0; c < D; ++c) {
              dqr[static_cast<size_t>(t * D + c)] += dx * static_cast<T>(kr[static_cast<size_t>(j * D + c)]);
              dkr[static_cast<size_t>(j * D + c)] += dx * static_cast<T>(qr[static_cast<size_t>(t * D + c)]);
            }
          }
          for (int t = 0; t < kDcaParts; ++t)  // back through each part's rotation, then summed
            rope64_back(rope, D, dca_query_position(dp.dca, kDcaPartSpecs[t].part, pos), &dqr[static_cast<size_t>(t * D)]);
          for (int64_t c = 0; c < D; ++c) {
            T s = 0;
            for (int t = 0; t < kDcaParts; ++t) s += dqr[static_cast<size_t>(t * D + c)];
            store(g.dq, b, h, i, c, static_cast<double>(s));
          }
        }
      for (int64_t j = 0; j < p.M; ++j) {
        rope64_back(rope, D, mask::floor_mod(j, dp.dca.chunk), &dkr[static_cast<size_t>(j * D)]);
        for (int64_t c = 0; c < D; ++c) store(g.dk, b, hk, j, c, static_cast<double>(dkr[static_cast<size_t>(j * D + c)]));
        for (int64_t c = 0; c < Dv; ++c) store(g.dv, b, hk, j, c, static_cast<double>(dv[static_cast<size_t>(j * Dv + c)]));
      }
    }
}

}  // namespace

void DcaFamily::backward_reference(const DcaProblem& p, const core::BackwardViews& g, core::RefPrecision precision) {
  if (precision == core::RefPrecision::f64)
    reference_impl<double>(p, g, false);
  else
    reference_impl<float>(p, g, true);
}

}  // namespace attn::dca
