// The softmax family's backward (formulas: include/attn/backward.hpp): a float64 reference that
// recomputes everything from q, k, v and dO (every score kind: dot, cosine, additive, with the
// additive score's parameter gradients), and the fast "rows" form, flash-style (the forward's
// LSE and output, float32 accumulation; dot scores).
#include "softmax/softmax_backward.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "attn/error.hpp"
#include "base/parallel.hpp"
#include "softmax/softmax_family.hpp"
#include "softmax/softmax_tiled.hpp"

namespace attn::exact {
namespace {

// The score of (i, j) before softcap (s) and after softcap and bias (t), in T.
template <class T>
struct Score {
  T s, t;
};

template <class T>
Score<T> score_of(const Problem& p, int64_t b, int64_t h, int64_t i, int64_t j, T dot) {
  const T s = dot * static_cast<T>(p.row_scale(b, h, i));
  T t = s;
  if (p.mech.softcap > 0) {
    const T cap = static_cast<T>(p.mech.softcap);
    t = cap * std::tanh(s / cap);
  }
  if (p.has_bias()) t += static_cast<T>(p.additive_bias(b, h, i, j));
  return {s, t};
}

// d t / d s: 1, or 1 - tanh^2(s / cap) under softcap.
template <class T>
T softcap_slope(const Problem& p, T s) {
  if (p.mech.softcap <= 0) return T(1);
  const T th = std::tanh(s / static_cast<T>(p.mech.softcap));
  return T(1) - th * th;
}

// keep / (1 - dropout), or 0 for a dropped weight; 1 without dropout.
template <class T>
T dropout_factor(const Problem& p, int64_t b, int64_t h, int64_t i, int64_t j) {
  if (p.mech.dropout <= 0) return T(1);
  return dropout_keep(p.mech.seed, p.mech.dropout, b, h, i, j) ? T(1) / static_cast<T>(1 - p.mech.dropout) : T(0);
}

}  // namespace

// ---- reference: full rows, its own LSE and D, in float64 (or plain float) ------------------

namespace {

// The raw score r_ij of query row q against key j (before the row's scale) and its gradients,
// written out plainly for the reference:
//   dot       r = q . k
//   cosine    r = q . k / (|q| |k|)   (|x| = sqrt(max(x . x, 1e-30)), as the forward's)
//   additive  r = sum_a w_a tanh(u_a),  u = Wq q + Wk k
template <class T>
struct RawScore {
  const Problem& p;
  std::vector<T> th;  // additive: tanh(u_a) of the last pair scored

  explicit RawScore(const Problem& problem) : p(problem), th(static_cast<size_t>(problem.A)) {}

  T norm(const T* x) const {
    T n = 0;
    for (int64_t c = 0; c < p.D; ++c) n += x[c] * x[c];
    return n;
  }
  static T safe_sqrt(T n) { return std::sqrt(std::max(n, static_cast<T>(1e-30))); }

  T operator()(const T* q, const T* k) {
    T r = 0;
    if (p.mech.score == ScoreKind::additive) {
      for (int64_t a = 0; a < p.A; ++a) {
        T u = 0;
        for (int64_t c = 0; c < p.D; ++c)
          u += static_cast<T>(p.wq[a * p.D + c]) * q[c] + static_cast<T>(p.wk[a * p.D + c]) * k[c];
        th[a] = std::tanh(u) + (u - u);  // a non-finite u gives NaN, as the forward's
        r += static_cast<T>(p.w[a]) * th[a];
      }
      return r;
    }
    for (int64_t c = 0; c < p.D; ++c) r += q[c] * k[c];
    if (p.mech.score == ScoreKind::cosine) r /= safe_sqrt(norm(q)) * safe_sqrt(norm(k));
    return r;
  }

  // dR = dL/dr for the pair last scored (r its score): adds dL/dq to dq, dL/dk to dk and, for
  // additive scores, dL/dWq, dL/dWk, dL/dw to dwq (A x D), dwk (A x D), dw (A).
  void backward(const T* q, const T* k, T r, T dR, T* dq, T* dk, T* dwq, T* dwk, T* dw) const {
    if (p.mech.score == ScoreKind::additive) {
      for (int64_t a = 0; a < p.A; ++a) {
        const T du = dR * static_cast<T>(p.w[a]) * (1 - th[a] * th[a]);
        dw[a] += dR * th[a];
        for (int64_t c = 0; c < p.D; ++c) {
          dq[c] += du * static_cast<T>(p.wq[a * p.D + c]);
          dk[c] += du * static_cast<T>(p.wk[a * p.D + c]);
          dwq[a * p.D + c] += du * q[c];
          dwk[a * p.D + c] += du * k[c];
        }
      }
      return;
    }
    if (p.mech.score == ScoreKind::dot) {
      for (int64_t c = 0; c < p.D; ++c) dq[c] += dR * k[c], dk[c] += dR * q[c];
      return;
    }
    // cosine: dr/dq = k / (|q| |k|) - r q / |q|^2 (no second term where |q| is clamped), as for k
    const T nq2 = norm(q), nk2 = norm(k), tiny = static_cast<T>(1e-30);
    const T nqk = safe_sqrt(nq2) * safe_sqrt(nk2);
    const T cq = nq2 > tiny ? r / nq2 : T(0), ck = nk2 > tiny ? r / nk2 : T(0);
    for (int64_t c = 0; c < p.D; ++c) {
      dq[c] += dR * (k[c] / nqk - cq * q[c]);
      dk[c] += dR * (q[c] / nqk - ck * k[c]);
    }
  }
};

// T = double: the oracle. T = float with `plain`: the same algorithm in float with every
// intermediate (scores, P, dP, D, dS) rounded to the storage dtype, as a plain same-dtype
// implementation would (its error sets the tolerance of the fast form).
template <class T>
void reference_impl(const Problem& p, const BackwardViews& g, bool plain) {
  const core::Rounding<T> rnd{p.q.dtype, plain};
  const T neg_inf = -std::numeric_limits<T>::infinity();
  std::vector<T> t(static_cast<size_t>(p.M)), s(static_cast<size_t>(p.M)), P(static_cast<size_t>(p.M)),
      dP(static_cast<size_t>(p.M)), r(static_cast<size_t>(p.M));
  std::vector<uint8_t> seen(static_cast<size_t>(p.M));
  std::vector<T> dk(static_cast<size_t>(p.M * p.D)), dv(static_cast<size_t>(p.M * p.Dv)), dq(static_cast<size_t>(p.D));
  // the rows of q and k as T, and the additive score's parameter gradients (summed over everything)
  std::vector<T> qrow(static_cast<size_t>(p.D)), kall(static_cast<size_t>(p.M * p.D));
  std::vector<T> dwq(static_cast<size_t>(p.A * p.D)), dwk(dwq.size()), dw(static_cast<size_t>(p.A));
  RawScore<T> raw(p);
  for (int64_t b = 0; b < p.B; ++b)
    for (int64_t hk = 0; hk < p.Hkv; ++hk) {
      const core::KvRows keys = p.keys(b, hk), values = p.values(b, hk);
      std::fill(dk.begin(), dk.end(), T(0));
      std::fill(dv.begin(), dv.end(), T(0));
      for (int64_t j = 0; j < p.M; ++j)
        for (int64_t c = 0; c < p.D; ++c) kall[j * p.D + c] = keys.at(j, c);
      for (int64_t h = hk * p.group; h < (hk + 1) * p.group; ++h)
        for (int64_t i = 0; i < p.N; ++i) {
          for (int64_t c = 0; c < p.D; ++c) qrow[c] = p.q.at(b, h, i, c);
          T mx = neg_inf;
          bool nan = false;
          for (int64_t j = 0; j < p.M; ++j) {
            t[j] = neg_inf;
            seen[j] = p.visible(b, h, i, j);
            if (!seen[j]) continue;
            r[j] = rnd(raw(qrow.data(), &kall[j * p.D]));
            const Score<T> sc = score_of<T>(p, b, h, i, j, r[j]);
            s[j] = rnd(sc.s), t[j] = rnd(sc.t);
            mx = std::max(mx, t[j]);
            nan |= std::isnan(t[j]);
          }
          std::fill(dq.begin(), dq.end(), T(0));
          if (mx == neg_inf && !nan) {  // no visible key: the output is 0 whatever q, k, v
            for (int64_t c = 0; c < p.D; ++c) store_from_float(g.dq.data, g.dq.dtype, g.dq.offset(b, h, i, c), 0.0f);
            continue;
          }
          T sum = 0;
          for (int64_t j = 0; j < p.M; ++j) sum += seen[j] ? std::exp(t[j] - mx) : T(0);
          T D = 0;  // D_i = sum_j P_ij dP_ij
          for (int64_t j = 0; j < p.M; ++j) {
            if (!seen[j]) {  // a hidden key gets no gradient, even in a NaN row
              P[j] = dP[j] = 0;
              continue;
            }
            P[j] = nan ? std::numeric_limits<T>::quiet_NaN() : rnd(std::exp(t[j] - mx) / sum);
            T dov = 0;
            for (int64_t c = 0; c < p.Dv; ++c) dov += static_cast<T>(g.dout.at(b, h, i, c)) * values.at(j, c);
            dP[j] = rnd(dropout_factor<T>(p, b, h, i, j) * rnd(dov));
            D += P[j] * dP[j];
          }
          const T scale = p.row_scale(b, h, i);
          const T dlse = g.dlse.empty() ? T(0) : static_cast<T>(g.dlse.at(b, h, i, 0));
          for (int64_t j = 0; j < p.M; ++j) {
            if (!seen[j]) continue;
            const T keep = dropout_factor<T>(p, b, h, i, j);
            for (int64_t c = 0; c < p.Dv; ++c) dv[j * p.Dv + c] += P[j] * keep * g.dout.at(b, h, i, c);
            const T dS = rnd(P[j] * (dP[j] - rnd(D) + dlse) * softcap_slope<T>(p, s[j]));
            if (p.mech.score == ScoreKind::additive) raw(qrow.data(), &kall[j * p.D]);  // its tanh(u) again
            raw.backward(qrow.data(), &kall[j * p.D], r[j], dS * scale, dq.data(), &dk[j * p.D], dwq.data(),
                         dwk.data(), dw.data());
          }
          for (int64_t c = 0; c < p.D; ++c)
            store_from_float(g.dq.data, g.dq.dtype, g.dq.offset(b, h, i, c), static_cast<float>(dq[c]));
        }
      for (int64_t j = 0; j < p.M; ++j) {
        for (int64_t c = 0; c < p.D; ++c)
          store_from_float(g.dk.data, g.dk.dtype, g.dk.offset(b, hk, j, c), static_cast<float>(dk[j * p.D + c]));
        for (int64_t c = 0; c < p.Dv; ++c)
          store_from_float(g.dv.data, g.dv.dtype, g.dv.offset(b, hk, j, c), static_cast<float>(dv[j * p.Dv + c]));
      }
    }
  // the additive score's parameter gradients, when the call asks for them (SoftmaxFamily::learned_params)
  if (g.dparams.contains("wq")) {
    const TensorView &gq = g.dparams.at("wq"), &gk = g.dparams.at("wk"), &gw = g.dparams.at("w");
    for (int64_t a = 0; a < p.A; ++a) {
      for (int64_t c = 0; c < p.D; ++c) {
        store_from_float(gq.data, gq.dtype, gq.offset(0, 0, a, c), static_cast<float>(dwq[a * p.D + c]));
        store_from_float(gk.data, gk.dtype, gk.offset(0, 0, a, c), static_cast<float>(dwk[a * p.D + c]));
      }
      store_from_float(gw.data, gw.dtype, gw.offset(0, 0, 0, a), static_cast<float>(dw[a]));
    }
  }
}

}  // namespace

void softmax_backward_reference(const Problem& p, const BackwardViews& g, core::RefPrecision precision) {
  if (precision == core::RefPrecision::f64)
    reference_impl<double>(p, g, false);
  else
    reference_impl<float>(p, g, true);
}

void SoftmaxFamily::backward_reference(const Problem& p, const BackwardViews& g, core::RefPrecision precision) {
  softmax_backward_reference(p, g, precision);
}

// ---- rows: float32, one task per (batch entry, kv head) ------------------------------------------
//
// A task owns its kv head's dK and dV and its group's dQ rows, and walks the group's query rows in
// a fixed order, so no two threads write one value and the sums do not depend on the thread count.
// The kv head's K and V are converted to float32 once per task; per row: the scores against the
// visible keys, P from the forward's LSE, D_i = dO_i . O_i.

namespace {

struct RowsScratch {
  int64_t M = 0, D = 0, Dv = 0;
  std::vector<float> k, v, dk, dv, s, pd, q, dout, dq;
  RowsScratch(int64_t m, int64_t d, int64_t dv_)
      : M(m), D(d), Dv(dv_), k(static_cast<size_t>(m * d)), v(static_cast<size_t>(m * dv_)),
        dk(static_cast<size_t>(m * d)), dv(static_cast<size_t>(m * dv_)), s(static_cast<size_t>(m)),
        pd(static_cast<size_t>(m)), q(static_cast<size_t>(d)), dout(static_cast<size_t>(dv_)), dq(static_cast<size_t>(d)) {}
};

float dotf(const float* a, const float* b, int64_t n) {
  float acc = 0;
  for (int64_t c = 0; c < n; ++c) acc += a[c] * b[c];
  return acc;
}

void rows_task(const Problem& p, const BackwardViews& g, int64_t b, int64_t hk, RowsScratch& w) {
  const core::KvRows keys = p.keys(b, hk), values = p.values(b, hk);
  const int64_t M = p.kv_len[b];
  for (int64_t j = 0; j < M; ++j) {
    for (int64_t c = 0; c < p.D; ++c) w.k[j * p.D + c] = keys.at(j, c);
    for (int64_t c = 0; c < p.Dv; ++c) w.v[j * p.Dv + c] = values.at(j, c);
  }
  std::fill(w.dk.begin(), w.dk.end(), 0.0f);
  std::fill(w.dv.begin(), w.dv.end(), 0.0f);
  const float neg_inf = -std::numeric_limits<float>::infinity();
  for (int64_t h = hk * p.group; h < (hk + 1) * p.group; ++h)
    for (int64_t i = 0; i < p.N; ++i) {
      std::fill(w.dq.begin(), w.dq.end(), 0.0f);
      const float lse = g.lse.at(b, h, i, 0);
      if (lse == neg_inf) {  // no visible key
        for (int64_t c = 0; c < p.D; ++c) store_from_float(g.dq.data, g.dq.dtype, g.dq.offset(b, h, i, c), 0.0f);
        continue;
      }
      for (int64_t c = 0; c < p.D; ++c) w.q[c] = p.q.at(b, h, i, c);
      float D = 0;  // dout_i . out_i, less the gradient through lse_i (d lse_i / d t_ij = P_ij)
      for (int64_t c = 0; c < p.Dv; ++c) {
        w.dout[c] = g.dout.at(b, h, i, c);
        D += w.dout[c] * g.out.at(b, h, i, c);
      }
      if (!g.dlse.empty()) D -= g.dlse.at(b, h, i, 0);
      const float scale = static_cast<float>(p.row_scale(b, h, i));
      for (int64_t j = 0; j < M; ++j) {
        if (!p.visible(b, h, i, j)) continue;
        const float* kj = &w.k[j * p.D];
        const Score<float> sc = score_of<float>(p, b, h, i, j, dotf(w.q.data(), kj, p.D));
        const float P = std::exp(sc.t - lse), keep = dropout_factor<float>(p, b, h, i, j);
        const float dP = keep * dotf(w.dout.data(), &w.v[j * p.Dv], p.Dv);
        const float dS = P * (dP - D) * softcap_slope<float>(p, sc.s) * scale;
        const float Pk = P * keep;
        float* dvj = &w.dv[j * p.Dv];
        for (int64_t c = 0; c < p.Dv; ++c) dvj[c] += Pk * w.dout[c];
        float* dkj = &w.dk[j * p.D];
        for (int64_t c = 0; c < p.D; ++c) {
          w.dq[c] += dS * kj[c];
          dkj[c] += dS * w.q[c];
        }
      }
      for (int64_t c = 0; c < p.D; ++c) store_from_float(g.dq.data, g.dq.dtype, g.dq.offset(b, h, i, c), w.dq[c]);
    }
  for (int64_t j = 0; j < p.M; ++j) {  // keys past kv_len get 0
    for (int64_t c = 0; c < p.D; ++c)
      store_from_float(g.dk.data, g.dk.dtype, g.dk.offset(b, hk, j, c), j < M ? w.dk[j * p.D + c] : 0.0f);
    for (int64_t c = 0; c < p.Dv; ++c)
      store_from_float(g.dv.data, g.dv.dtype, g.dv.offset(b, hk, j, c), j < M ? w.dv[j * p.Dv + c] : 0.0f);
  }
}

}  // namespace

void softmax_backward_rows(const Problem& p, const BackwardViews& g, int threads) {
  const int64_t tasks = p.B * p.Hkv;
  const int t = resolve_threads(threads, tasks);
  std::vector<RowsScratch> scratch = per_thread<RowsScratch>(t, p.M, p.D, p.Dv);  // sized here: the parallel region allocates nothing
  parallel_for(tasks, t, [&](int64_t task, int thread) {
    rows_task(p, g, task / p.Hkv, task % p.Hkv, scratch[static_cast<size_t>(thread)]);
  });
}

std::string SoftmaxFamily::backward_refusal(const Problem& p) {
  if (p.k_scale) return "int8 K/V rows (options.kv_scales) have no backward: pass float k and v";
  return "";
}

std::vector<core::LearnedParam> SoftmaxFamily::learned_params(const Problem& p) {
  if (p.mech.score != ScoreKind::additive) return {};
  return {{"wq", {1, 1, p.A, p.D}}, {"wk", {1, 1, p.A, p.D}}, {"w", {1, 1, 1, p.A}}};
}

namespace {

// The tile and row forms take dot scores; the scores form the others.
void refuse_other_scores(const Problem& p, core::Reasons& why) {
  if (p.mech.score != ScoreKind::dot)
    why.push_back([&] { return "score=" + to_string(p.mech.score) + " (dot only: the scores form takes it)"; });
}

// The backward computes in the forward's precision (AttendOptions::precision): bf16 products on
// tiled_bf16, float32 on the others.
void refuse_bf16(const Problem& p, const core::Outputs&, core::Reasons& why) {
  refuse_unless_bf16_products(p, why);
  refuse_other_scores(p, why);
}

void refuse_unless_float(const Problem& p, const core::Outputs&, core::Reasons& why) {
  if (p.precision == Precision::bf16) why.push_back("precision bf16 (tiled_bf16 computes in bf16)");
}

void refuse_unless_float_dot(const Problem& p, const core::Outputs& o, core::Reasons& why) {
  refuse_unless_float(p, o, why);
  refuse_other_scores(p, why);
}

void refuse_scores(const Problem& p, const core::Outputs& o, core::Reasons& why) {
  refuse_unless_float(p, o, why);
  if (p.mech.score == ScoreKind::dot) why.push_back("score=dot (the tiled and rows forms take it)");
}

}  // namespace

const std::vector<core::BackwardForm<Problem>>& SoftmaxFamily::backward_forms() {
  static const std::vector<core::BackwardForm<Problem>> list = {
      {"tiled_bf16", "the tiled backward with bf16 products (vdpbf16ps), float32 sums", refuse_bf16,
       softmax_backward_tiled_bf16},
      {"tiled", "float32, flash-style on the tile products: 64 query rows against the key tiles of the block mask",
       refuse_unless_float_dot, softmax_backward_tiled},
      {"rows", "float32, flash-style from the forward's LSE, one task per (batch entry, kv head)",
       refuse_unless_float_dot, [](const Problem& p, const BackwardViews& g, const core::Context& c) {
         softmax_backward_rows(p, g, c.threads);
       }},
      {"scores", "cosine and additive scores: float32, flash-style from the forward's LSE, pair by pair",
       refuse_scores, softmax_backward_scores},
      {"reference", "float64 full score rows (slow, exact)", refuse_unless_float,
       [](const Problem& p, const BackwardViews& g, const core::Context&) {
         softmax_backward_reference(p, g, core::RefPrecision::f64);
       }},
  };
  return list;
}

}  // namespace attn::exact
