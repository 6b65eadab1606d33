#include "softmax/reference.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/row_stats.hpp"

namespace attn::exact {
namespace {

template <class T>
T score(const Problem& p, int64_t b, int64_t h, int64_t i, int64_t j, DType round_dtype, bool plain) {
  const core::KvRows keys = p.keys(b, p.kv_head(h));
  const core::Rounding<T> rnd{round_dtype, plain};
  T s = 0;
  if (p.mech.score == ScoreKind::additive) {
        for (int64_t a = 0; a < p.A; ++a) {
      T hq = 0, hk_ = 0;
      for (int64_t c = 0; c < p.D; ++c) {
        hq += static_cast<T>(p.wq[a * p.D + c]) * p.q.at(b, h, i, c);
        hk_ += static_cast<T>(p.wk[a * p.D + c]) * keys.at(j, c);
      }
      // tanh saturates at +-inf: + (u - u) keeps a non-finite input's NaN (as the fast forms do)
      const T u = hq + hk_;
      s += static_cast<T>(p.w[a]) * (std::tanh(u) + (u - u));
    }
  } else {
    T nq = 0, nk = 0;
    for (int64_t c = 0; c < p.D; ++c) {
      const T qc = p.q.at(b, h, i, c), kc = keys.at(j, c);
      s += qc * kc;
      nq += qc * qc;
      nk += kc * kc;
    }
    s += s - s;  // a score of +-inf (a non-finite q or k) is NaN, as in the kernels' qk
    if (p.mech.score == ScoreKind::cosine) {
      const T tiny = static_cast<T>(1e-30);
      s /= std::sqrt(std::max(nq, tiny)) * std::sqrt(std::max(nk, tiny));
    }
  }
  s = rnd(s * static_cast<T>(p.row_scale(b, h, i)));
  if (p.mech.softcap > 0) {
    const T cap = static_cast<T>(p.mech.softcap);
    s = rnd(cap * std::tanh(s / cap) + (s - s));  // tanh(+-inf) would hide a non-finite score
  }
  if (p.has_bias()) s = rnd(s + static_cast<T>(p.additive_bias(b, h, i, j)));
  return s;
}

template <class T>
core::ReferenceResult run(const Problem& p, bool plain) {
  core::ReferenceResult r = core::zero_result(p.B, p.H, p.N, p.M, p.Dv, p.stats_topk);
  r.lse.assign(static_cast<size_t>(p.B * p.H * p.N), -std::numeric_limits<double>::infinity());
  r.probs.assign(static_cast<size_t>(p.B * p.H * p.N * p.M), 0.0);
  const DType dt = p.q.dtype;
  const core::Rounding<T> rnd{dt, plain};
  const T neg_inf = -std::numeric_limits<T>::infinity();
  std::vector<T> s(static_cast<size_t>(p.M)), w(static_cast<size_t>(p.M)), acc(static_cast<size_t>(p.Dv));
  std::vector<uint8_t> counted(static_cast<size_t>(p.M));
  for (int64_t b = 0; b < p.B; ++b)
    for (int64_t h = 0; h < p.H; ++h)
      for (int64_t i = 0; i < p.N; ++i) {
        T mx = neg_inf;
        bool nan = false;
        for (int64_t j = 0; j < p.M; ++j) {
          s[j] = p.visible(b, h, i, j) ? score<T>(p, b, h, i, j, dt, plain) : neg_inf;
          mx = std::max(mx, s[j]);
          nan |= std::isnan(s[j]);
        }
        const size_t row = static_cast<size_t>((b * p.H + h) * p.N + i);
        if (nan) {  // a NaN score (NaN in q, k or bias) poisons its row: output, LSE and weights NaN
          const double q_nan = std::numeric_limits<double>::quiet_NaN();
          r.lse[row] = q_nan;
          std::fill(r.out.begin() + static_cast<int64_t>(row) * p.Dv, r.out.begin() + static_cast<int64_t>(row + 1) * p.Dv, q_nan);
          std::fill(r.probs.begin() + static_cast<int64_t>(row) * p.M, r.probs.begin() + static_cast<int64_t>(row + 1) * p.M, q_nan);
          continue;
        }
        if (mx == neg_inf) continue;  // no visible key: zeros, lse = -inf
        T sum = 0;
        for (int64_t j = 0; j < p.M; ++j) sum += (w[j] = std::exp(s[j] - mx));
        r.lse[row] = static_cast<double>(mx + std::log(sum));
        const core::KvRows values = p.values(b, p.kv_head(h));
        std::fill(acc.begin(), acc.end(), T(0));
        for (int64_t j = 0; j < p.M; ++j) {
          const T pj = rnd(w[j] / sum);
          r.probs[row * p.M + j] = static_cast<double>(pj);
          T pd = pj;
          if (p.mech.dropout > 0)
            pd = dropout_keep(p.mech.seed, p.mech.dropout, b, h, i, j) ? pj / static_cast<T>(1 - p.mech.dropout) : 0;
          if (pd == 0) continue;  // also keeps NaN in hidden values out of the sum
          for (int64_t c = 0; c < p.Dv; ++c)
            acc[c] += pd * static_cast<T>(values.at(j, c));
        }
        for (int64_t c = 0; c < p.Dv; ++c) r.out[row * p.Dv + c] = static_cast<double>(rnd(acc[c]));
        if (double* st = r.stats_of(b, h, i)) {  // over the keys whose score is > -inf
          for (int64_t j = 0; j < p.M; ++j) counted[static_cast<size_t>(j)] = s[j] > neg_inf;
          core::reference_row_stats(&r.probs[row * p.M], counted.data(), p.M, p.stats_topk, st);
        }
      }
  return r;
}

}  // namespace

core::ReferenceResult reference_softmax(const Problem& p, core::RefPrecision precision) {
  return precision == core::RefPrecision::f64 ? run<double>(p, false) : run<float>(p, true);
}

void softmax_reference_form(const Problem& p, const core::Outputs& o, const core::Context&) {
  core::write_reference(reference_softmax(p), o);
}

}  // namespace attn::exact
