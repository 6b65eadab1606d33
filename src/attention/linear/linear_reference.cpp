// The quadratic reference: every weight w_ij = scale * phi(q_i) . phi(k_j) * decay^(i - j) written
// out, the rows summed directly, the final state summed from its definition. No recurrence, no
// chunks: what the three fast forms must reproduce.
#include <algorithm>
#include <cmath>

#include "core/row_stats.hpp"
#include "linear/feature_map.hpp"
#include "linear/linear.hpp"
#include "linear/output_norm.hpp"

namespace attn::linear {
namespace {

// The keys query i of batch b may see (its row: zeros included, the initial state's tokens not).
int64_t row_keys(const LinearProblem& p, int64_t b, int64_t i) {
  const int64_t len = p.kv_len[static_cast<size_t>(b)], pos = i + p.M - p.N;  // causal calls have N = M
  return p.mech.causal ? std::min(len, pos + 1) : len;
}

template <class T>
core::ReferenceResult reference_impl(const LinearProblem& p, bool plain) {
  const DType dt = p.q.dtype;
  const core::Rounding<T> rnd{dt, plain};
  const int64_t cols = p.state_cols(), F = p.F;
  core::ReferenceResult r = core::zero_result(p.B, p.H, p.N, p.M, p.Dv, p.stats_topk);
  r.F = F, r.state_cols = cols;
  r.probs.assign(static_cast<size_t>(p.B * p.H * p.N * p.M), 0.0);
  r.state.assign(static_cast<size_t>(p.B * p.H * F * cols), 0.0);
  std::vector<T> fq(static_cast<size_t>(F)), fk(static_cast<size_t>(p.M * F)), w(static_cast<size_t>(p.M)),
      num(static_cast<size_t>(p.Dv));
  for (int64_t b = 0; b < p.B; ++b)
    for (int64_t h = 0; h < p.H; ++h) {
      const int64_t hk = p.kv_head(h), len = p.kv_len[static_cast<size_t>(b)];
      const T lambda = static_cast<T>(p.decay[static_cast<size_t>(h)]);
      std::vector<T> s0v;  // the initial state of this head, (F, cols)
      if (p.initial)
        for (int64_t f = 0; f < F; ++f)
          for (int64_t c = 0; c < cols; ++c) s0v.push_back(static_cast<T>(p.initial_at(b, h, f, c)));
      const T* s0 = p.initial ? s0v.data() : nullptr;
      std::vector<T> raw(static_cast<size_t>(p.D));  // one q or k row
      for (int64_t j = 0; j < len; ++j) {
        for (int64_t c = 0; c < p.D; ++c) raw[static_cast<size_t>(c)] = static_cast<T>(p.k.at(b, hk, j, c));
        reference_features(p, false, raw.data(), &fk[static_cast<size_t>(j * F)]);
        for (int64_t c = 0; c < F; ++c) fk[static_cast<size_t>(j * F + c)] = rnd(fk[static_cast<size_t>(j * F + c)]);
      }
      for (int64_t i = 0; i < p.N; ++i) {
        const int64_t pos = i + p.M - p.N;  // causal calls have N = M
        for (int64_t c = 0; c < p.D; ++c) raw[static_cast<size_t>(c)] = static_cast<T>(p.q.at(b, h, i, c));
        reference_features(p, true, raw.data(), fq.data());
        for (int64_t c = 0; c < F; ++c) fq[static_cast<size_t>(c)] = rnd(fq[static_cast<size_t>(c)]);
        std::fill(num.begin(), num.end(), T(0));
        T den = 0;
        for (int64_t j = 0; j < len; ++j) {
          w[static_cast<size_t>(j)] = 0;
          if (p.mech.causal && j > pos) continue;
          T dot = 0;
          for (int64_t c = 0; c < F; ++c) dot += fq[static_cast<size_t>(c)] * fk[static_cast<size_t>(j * F + c)];
          T x = rnd(rnd(dot * static_cast<T>(p.scale)) * std::pow(lambda, static_cast<T>(pos - j)));
          x += x - x;  // a weight of +-inf (a non-finite q or k) is NaN, as the fast forms' rows
          w[static_cast<size_t>(j)] = x;
          den += x;
          for (int64_t c = 0; c < p.Dv; ++c) num[static_cast<size_t>(c)] += x * static_cast<T>(p.v.at(b, hk, j, c));
        }
        if (s0) {  // the tokens before this call, all behind every query
          const T t = static_cast<T>(p.scale) * (p.mech.causal ? std::pow(lambda, static_cast<T>(pos + 1)) : T(1));
          for (int64_t f = 0; f < F; ++f) {
            const T a = t * fq[static_cast<size_t>(f)];
            for (int64_t c = 0; c < p.Dv; ++c) num[static_cast<size_t>(c)] += a * static_cast<T>(s0[f * cols + c]);
            if (p.mech.normalize) den += a * static_cast<T>(s0[f * cols + p.Dv]);
          }
        }
        const size_t at = static_cast<size_t>((b * p.H + h) * p.N + i);
        den += static_cast<T>(p.eps);
        for (int64_t c = 0; c < p.Dv; ++c) {
          const T y = rnd(num[static_cast<size_t>(c)]);
          num[static_cast<size_t>(c)] = !p.mech.normalize ? y : den != 0 ? rnd(y / rnd(den)) : 0;
        }
        normalise_row(p.norm, num.data(), p.Dv);
        if (!p.coef.empty())
          for (int64_t c = 0; c < p.Dv; ++c) num[static_cast<size_t>(c)] *= static_cast<T>(p.coef[static_cast<size_t>(c)]);
        for (int64_t c = 0; c < p.Dv; ++c) r.out[at * p.Dv + c] = static_cast<double>(rnd(num[static_cast<size_t>(c)]));
        for (int64_t j = 0; j < len; ++j) {
          const T y = w[static_cast<size_t>(j)];
          r.probs[at * p.M + j] = static_cast<double>(!p.mech.normalize ? y : den != 0 ? y / den : 0);
        }
        if (double* st = r.stats_of(b, h, i))  // the keys the row may see, zeros included
          core::reference_row_stats(&r.probs[at * p.M], nullptr, row_keys(p, b, i), p.stats_topk, st);
      }
      // Final state: what the keys of this call (decayed to the last valid one) and the initial
      // state add up to.
      std::vector<T> st(static_cast<size_t>(F * cols), T(0));
      const T start = p.mech.causal ? std::pow(lambda, static_cast<T>(len)) : T(1);
      if (s0)
        for (int64_t e = 0; e < F * cols; ++e) st[static_cast<size_t>(e)] = start * static_cast<T>(s0[e]);
      for (int64_t j = 0; j < len; ++j) {
        const T a = p.mech.causal ? std::pow(lambda, static_cast<T>(len - 1 - j)) : T(1);
        for (int64_t f = 0; f < F; ++f) {
          const T x = a * fk[static_cast<size_t>(j * F + f)];
          T* row = &st[static_cast<size_t>(f * cols)];
          for (int64_t c = 0; c < p.Dv; ++c) row[c] += x * static_cast<T>(p.v.at(b, hk, j, c));
          if (p.mech.normalize) row[p.Dv] += x;
        }
      }
      std::copy(st.begin(), st.end(), r.state.begin() + (b * p.H + h) * F * cols);
    }
  return r;
}

}  // namespace

core::ReferenceResult linear_reference(const LinearProblem& p, core::RefPrecision precision) {
  if (!p.polar() || p.stream >= 0)
    return precision == core::RefPrecision::f64 ? reference_impl<double>(p, false) : reference_impl<float>(p, true);
  // PolaFormer: each stream on its half of the value channels and its rows of the state; no
  // single weight matrix (probs stay empty). Its row statistics are of the channel average of
  // the two streams' applied weights, (w0 / den0 + w1 / den1) / 2.
  core::ReferenceResult r = core::zero_result(p.B, p.H, p.N, p.M, p.Dv, p.stats_topk);
  r.F = p.state_rows(), r.state_cols = p.state_cols();
  r.state.assign(static_cast<size_t>(p.B * p.H * r.F * r.state_cols), 0.0);
  std::vector<double> mean(p.stats_topk ? static_cast<size_t>(p.B * p.H * p.N * p.M) : 0, 0.0);
  for (int s = 0; s < 2; ++s) {
    const core::ReferenceResult h = linear_reference(stream_problem(p, s), precision);
    for (size_t e = 0; e < mean.size(); ++e) mean[e] += h.probs[e] / 2;  // (empty without statistics)
    for (int64_t row = 0; row < p.B * p.H * p.N; ++row)
      for (int64_t c = 0; c < h.Dv; ++c)
        r.out[static_cast<size_t>(row * p.Dv + s * h.Dv + c)] = h.out[static_cast<size_t>(row * h.Dv + c)];
    for (int64_t bh = 0; bh < p.B * p.H; ++bh)
      for (int64_t f = 0; f < h.F; ++f)
        for (int64_t c = 0; c < h.state_cols; ++c)
          r.state[static_cast<size_t>((bh * r.F + s * h.F + f) * r.state_cols + c)] =
              h.state[static_cast<size_t>((bh * h.F + f) * h.state_cols + c)];
  }
  for (int64_t b = 0; b < p.B; ++b)
    for (int64_t h = 0; h < p.H; ++h)
      for (int64_t i = 0; i < p.N; ++i)
        if (double* st = r.stats_of(b, h, i))
          core::reference_row_stats(&mean[static_cast<size_t>(((b * p.H + h) * p.N + i) * p.M)], nullptr,
                                    row_keys(p, b, i), p.stats_topk, st);
  return r;
}

}  // namespace attn::linear
