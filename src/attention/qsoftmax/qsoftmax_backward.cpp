// qsoftmax's fast backward (formulas: qsoftmax_backward_reference.cpp), through the state instead
// of the weights. With a_i = softmax(q_i), S_i = S0 + sum_(j < end(i)) k_j v_j^T the state row i
// reads (o_i = scale S_i^T a_i) and the backward state
//   G_j = sum_(i sees j) scale a_i dO_i^T + dS       (D x Dv; dS: the final state's gradient)
// the gradients are
//   da_i = scale S_i dO_i,  dq_i = a_i o (da_i - a_i . da_i),
//   dK_j = G_j v_j,  dV_j = G_j^T k_j   (G summed over a kv head's query heads),
//   dS0 = scale sum_i a_i dO_i^T + dS   (every row reads S0).
// Forms: "right" (non-causal: every row reads one state S = S0 + K^T V and every key gets one
// G; per query head, blocks of 64 rows, every product one kernels.gemm call) and "recurrent"
// (causal: S_i carried forward token by token as the forward does, then G_j carried backward,
// O(D Dv) per token). One task per (batch entry, kv head) owns its dK, dV and its query heads' dQ
// and dS0, walked in a fixed order: bitwise the same for any thread count.
#include <algorithm>
#include <vector>

#include "base/parallel.hpp"
#include "core/params.hpp"
#include "core/rows.hpp"
#include "qsoftmax/feature_softmax.hpp"
#include "qsoftmax/qsoftmax.hpp"

namespace attn::qsoftmax {
namespace {

constexpr int64_t kRows = 64;  // query rows per block of the right form

// One thread's buffers, sized before the parallel region (which must not allocate).
struct Scratch {
  std::vector<float> K, V, dK, dV;  // the kv head's rows (M x D, M x Dv) and their gradients
  std::vector<float> KV, S, St, G, Gsum, GsumT;  // D x Dv (St, GsumT: Dv x D)
  std::vector<float> A, dO, dA, dq;              // rows x D, rows x Dv, rows x D, D
  Scratch(const QSoftmaxProblem& p, int64_t rows)
      : K(static_cast<size_t>(p.M * p.D)), V(static_cast<size_t>(p.M * p.Dv)), dK(K.size()), dV(V.size()),
        KV(static_cast<size_t>(p.D * p.Dv)), S(KV.size()), St(KV.size()), G(KV.size()), Gsum(KV.size()),
        GsumT(KV.size()), A(static_cast<size_t>(rows * p.D)), dO(static_cast<size_t>(rows * p.Dv)),
        dA(static_cast<size_t>(rows * p.D)), dq(static_cast<size_t>(p.D)) {}
};

void transpose(const float* x, int64_t rows, int64_t cols, float* out) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) out[c * rows + r] = x[r * cols + c];
}

// S = S0 of head (b, h), or 0.
void load_initial(const QSoftmaxProblem& p, int64_t b, int64_t h, float* S) {
  for (int64_t f = 0; f < p.D; ++f)
    for (int64_t c = 0; c < p.Dv; ++c) S[f * p.Dv + c] = p.initial ? core::element_at(*p.initial, b, h, f, c) : 0.0f;
}

// G = dS of head (b, h), or 0.
void load_dfinal(const QSoftmaxProblem& p, const core::BackwardViews& g, int64_t b, int64_t h, float* G) {
  for (int64_t f = 0; f < p.D; ++f)
    for (int64_t c = 0; c < p.Dv; ++c) G[f * p.Dv + c] = g.dfinal_state.empty() ? 0.0f : g.dfinal_state.at(b, h, f, c);
}

void store_d_initial(const QSoftmaxProblem& p, const core::BackwardViews& g, int64_t b, int64_t h, const float* G) {
  if (g.d_initial_state.empty()) return;
  for (int64_t f = 0; f < p.D; ++f)
    for (int64_t c = 0; c < p.Dv; ++c)
      store_from_float(g.d_initial_state.data, g.d_initial_state.dtype, g.d_initial_state.offset(b, h, f, c), G[f * p.Dv + c]);
}

// a = softmax(q_i) of row i of head (b, h).
void features(const kernels::TileKernels& kern, const QSoftmaxProblem& p, int64_t b, int64_t h, int64_t i, float* a) {
  core::load_rows(kern, p.q, b, h, i, 1, p.N, a, p.D);
  softmax_features(a, p.D);
}

// dq_i from a_i and da_i (scaled), written to g.dq.
void write_dq(const kernels::TileKernels& kern, const QSoftmaxProblem& p, const core::BackwardViews& g, int64_t b,
              int64_t h, int64_t i, const float* a, const float* da, float* dq) {
  softmax_features_backward(a, da, p.D, dq);
  kern.from_float(dq, g.dq.dtype, g.dq.strides[3], p.D, g.dq.ptr(b, h, i));
}

// The kv head's dK and dV rows from the task's sums (keys past the valid length: 0).
void write_kv(const kernels::TileKernels& kern, const QSoftmaxProblem& p, const core::BackwardViews& g, int64_t b,
              int64_t hk, int64_t len, Scratch& s) {
  std::fill(s.dK.begin() + len * p.D, s.dK.end(), 0.0f);
  std::fill(s.dV.begin() + len * p.Dv, s.dV.end(), 0.0f);
  for (int64_t j = 0; j < p.M; ++j) {
    kern.from_float(s.dK.data() + j * p.D, g.dk.dtype, g.dk.strides[3], p.D, g.dk.ptr(b, hk, j));
    kern.from_float(s.dV.data() + j * p.Dv, g.dv.dtype, g.dv.strides[3], p.Dv, g.dv.ptr(b, hk, j));
  }
}

// ---- right: non-causal, one state and one G per query head ---------------------------------------

void right_task(const kernels::TileKernels& kern, const QSoftmaxProblem& p, const core::BackwardViews& g, int64_t b,
                int64_t hk, Scratch& s) {
  const int64_t D = p.D, Dv = p.Dv, DDv = D * Dv, len = p.kv_len[static_cast<size_t>(b)];
  const float scale = static_cast<float>(p.scale);
  core::load_rows(kern, p.k, b, hk, 0, len, len, s.K.data(), D);
  core::load_rows(kern, p.v, b, hk, 0, len, len, s.V.data(), Dv);
  std::fill(s.KV.begin(), s.KV.end(), 0.0f);
  if (len > 0) kern.gemm(D, Dv, len, s.K.data(), 1, D, s.V.data(), Dv, s.KV.data(), Dv, false);  // K^T V
  std::fill(s.Gsum.begin(), s.Gsum.end(), 0.0f);
  for (int64_t h = hk * p.group; h < (hk + 1) * p.group; ++h) {
    load_initial(p, b, h, s.S.data());
    for (int64_t e = 0; e < DDv; ++e) s.S[static_cast<size_t>(e)] += s.KV[static_cast<size_t>(e)];
    transpose(s.S.data(), D, Dv, s.St.data());
    std::fill(s.G.begin(), s.G.end(), 0.0f);
    for (int64_t i0 = 0; i0 < p.N; i0 += kRows) {
      const int64_t n = std::min(kRows, p.N - i0);
      for (int64_t r = 0; r < n; ++r) features(kern, p, b, h, i0 + r, s.A.data() + r * D);
      core::load_rows(kern, g.dout, b, h, i0, n, p.N, s.dO.data(), Dv);
      kern.gemm(n, D, Dv, s.dO.data(), Dv, 1, s.St.data(), D, s.dA.data(), D, false);  // dA = dO S^T
      for (int64_t r = 0; r < n; ++r) {
        float* da = s.dA.data() + r * D;
        for (int64_t f = 0; f < D; ++f) da[f] *= scale;
        write_dq(kern, p, g, b, h, i0 + r, s.A.data() + r * D, da, s.dq.data());
      }
      kern.gemm(D, Dv, n, s.A.data(), 1, D, s.dO.data(), Dv, s.G.data(), Dv, true);  // G += A^T dO
    }
    load_dfinal(p, g, b, h, s.S.data());  // S is free now: dS
    for (int64_t e = 0; e < DDv; ++e) s.G[static_cast<size_t>(e)] = s.G[static_cast<size_t>(e)] * scale + s.S[static_cast<size_t>(e)];
    store_d_initial(p, g, b, h, s.G.data());
    for (int64_t e = 0; e < DDv; ++e) s.Gsum[static_cast<size_t>(e)] += s.G[static_cast<size_t>(e)];
  }
  if (len > 0) {
    transpose(s.Gsum.data(), D, Dv, s.GsumT.data());
    kern.gemm(len, D, Dv, s.V.data(), Dv, 1, s.GsumT.data(), D, s.dK.data(), D, false);  // dK = V G^T
    kern.gemm(len, Dv, D, s.K.data(), D, 1, s.Gsum.data(), Dv, s.dV.data(), Dv, false);  // dV = K G
  }
  write_kv(kern, p, g, b, hk, len, s);
}

// ---- recurrent: causal, S_i forward, G_j backward ------------------------------------------------

void recurrent_task(const kernels::TileKernels& kern, const QSoftmaxProblem& p, const core::BackwardViews& g, int64_t b,
                    int64_t hk, Scratch& s) {
  const int64_t D = p.D, Dv = p.Dv, len = p.kv_len[static_cast<size_t>(b)];
  const float scale = static_cast<float>(p.scale);
  core::load_rows(kern, p.k, b, hk, 0, len, len, s.K.data(), D);
  core::load_rows(kern, p.v, b, hk, 0, len, len, s.V.data(), Dv);
  std::fill(s.dK.begin(), s.dK.end(), 0.0f);
  std::fill(s.dV.begin(), s.dV.end(), 0.0f);
  float *S = s.S.data(), *G = s.G.data(), *dO = s.dO.data(), *da = s.dA.data();
  for (int64_t h = hk * p.group; h < (hk + 1) * p.group; ++h) {
    load_initial(p, b, h, S);
    for (int64_t i = 0; i < p.N; ++i) {  // forward: S_i, then dq_i
      if (i < len) {
        const float *k = s.K.data() + i * D, *v = s.V.data() + i * Dv;
        for (int64_t f = 0; f < D; ++f)
          for (int64_t c = 0; c < Dv; ++c) S[f * Dv + c] += k[f] * v[c];
      }
      float* a = s.A.data() + i * D;
      features(kern, p, b, h, i, a);
      core::load_rows(kern, g.dout, b, h, i, 1, p.N, dO, Dv);
      for (int64_t f = 0; f < D; ++f) da[f] = scale * core::dot(S + f * Dv, dO, Dv);
      write_dq(kern, p, g, b, h, i, a, da, s.dq.data());
    }
    load_dfinal(p, g, b, h, G);
    for (int64_t i = p.N - 1; i >= 0; --i) {  // backward: G_i = G_(i+1) + scale a_i dO_i^T
      const float* a = s.A.data() + i * D;
      core::load_rows(kern, g.dout, b, h, i, 1, p.N, dO, Dv);
      for (int64_t f = 0; f < D; ++f) {
        const float sa = scale * a[f];
        for (int64_t c = 0; c < Dv; ++c) G[f * Dv + c] += sa * dO[c];
      }
      if (i >= len) continue;
      const float *k = s.K.data() + i * D, *v = s.V.data() + i * Dv;
      float *dk = s.dK.data() + i * D, *dv = s.dV.data() + i * Dv;
      for (int64_t f = 0; f < D; ++f) {
        dk[f] += core::dot(G + f * Dv, v, Dv);
        for (int64_t c = 0; c < Dv; ++c) dv[c] += k[f] * G[f * Dv + c];
      }
    }
    store_d_initial(p, g, b, h, G);
  }
  write_kv(kern, p, g, b, hk, len, s);
}

template <void (*Task)(const kernels::TileKernels&, const QSoftmaxProblem&, const core::BackwardViews&, int64_t,
                       int64_t, Scratch&)>
void run_tasks(const QSoftmaxProblem& p, const core::BackwardViews& g, const core::Context& ctx, int64_t rows) {
  const int64_t tasks = p.B * p.Hkv;
  const int threads = resolve_threads(ctx.threads, tasks);
  std::vector<Scratch> scratch = per_thread<Scratch>(threads, p, rows);
  parallel_for(tasks, threads, [&](int64_t task, int thread) {
    Task(*ctx.kern, p, g, task / p.Hkv, task % p.Hkv, scratch[static_cast<size_t>(thread)]);
  });
}

void refuse_right(const QSoftmaxProblem& p, const core::Outputs&, core::Reasons& why) {
  if (p.mech.causal) why.push_back("causal (each query reads the state up to its own key: recurrent)");
}

void refuse_recurrent(const QSoftmaxProblem& p, const core::Outputs&, core::Reasons& why) {
  if (!p.mech.causal) why.push_back("not causal (one state for every query: right)");
}

}  // namespace

std::string QSoftmaxFamily::backward_refusal(const QSoftmaxProblem&) { return ""; }

const std::vector<core::BackwardForm<QSoftmaxProblem>>& QSoftmaxFamily::backward_forms() {
  static const std::vector<core::BackwardForm<QSoftmaxProblem>> list = {
      {"right", "non-causal: one state and one backward state per head, 64 rows per gemm, float32", refuse_right,
       [](const QSoftmaxProblem& p, const core::BackwardViews& g, const core::Context& c) {
         run_tasks<right_task>(p, g, c, std::min<int64_t>(kRows, std::max<int64_t>(p.N, 1)));
       }},
      {"recurrent", "causal: the state carried forward, its gradient carried backward, O(D Dv) per token, float32",
       refuse_recurrent,
       [](const QSoftmaxProblem& p, const core::BackwardViews& g, const core::Context& c) {
         run_tasks<recurrent_task>(p, g, c, std::max<int64_t>(p.N, 1));
       }},
      {"reference", "float64 weights row by row (quadratic, exact)", core::refuse_nothing<QSoftmaxProblem>,
       [](const QSoftmaxProblem& p, const core::BackwardViews& g, const core::Context&) {
         QSoftmaxFamily::backward_reference(p, g, core::RefPrecision::f64);
       }},
  };
  return list;
}

}  // namespace attn::qsoftmax
