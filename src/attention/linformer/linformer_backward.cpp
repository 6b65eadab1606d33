// Linformer's backward. With K' = E K, V' = F V over the valid keys of each (batch entry, kv head)
// and O = softmax(scale Q K'^T) V' (formulas of the softmax part: attn/backward.hpp):
//   dK', dV', dQ    the softmax backward on the k projected rows
//   dK = E^T dK',   dV = F^T dV'                (keys past a batch entry's length: zero)
//   dE = sum_(b, kv head) dK' K^T,   dF = sum_(b, kv head) dV' V^T   (over the valid keys only)
// Forms: "projected" (float32: the forward's projections again, the softmax family's tiled
// backward on K', V' with the forward's lse, then the products above; bitwise the same for any
// thread count: dK, dV per (batch entry, kv head), dE, dF per block of rows summed over (b, kv
// head) in order) and "reference" (float64, the softmax written out plainly).
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "base/parallel.hpp"
#include "core/float32_copy.hpp"
#include "softmax/softmax_backward.hpp"
#include "softmax/softmax_family.hpp"
#include "linformer/linformer.hpp"

namespace attn::lowrank {
namespace {

// ---- reference: float64, or the plain same-dtype baseline ----------------------------------

template <class T>
void reference_impl(const LinformerProblem& p, const core::BackwardViews& g, bool plain) {
  const core::Rounding<T> rnd{p.q.dtype, plain};
  const int64_t K = p.K, D = p.D, Dv = p.Dv, M = p.M;
  auto at = [](int64_t r, int64_t w, int64_t c) { return static_cast<size_t>(r * w + c); };
  std::vector<T> kp(static_cast<size_t>(K * D)), vp(static_cast<size_t>(K * Dv)), dkp(kp.size()), dvp(vp.size()),
      s(static_cast<size_t>(K)), P(s.size()), dP(s.size()), dq(static_cast<size_t>(D)),
      dE(static_cast<size_t>(K * M)), dF(dE.size());
  const bool grads = g.dparams.contains("E");
  for (int64_t b = 0; b < p.B; ++b)
    for (int64_t hk = 0; hk < p.Hkv; ++hk) {
      const int64_t len = p.kv_len[static_cast<size_t>(b)];
      for (int64_t r = 0; r < K; ++r) {  // K' = E K, V' = F V over the valid keys
        for (int64_t c = 0; c < D; ++c) {
          T acc = 0;
          for (int64_t j = 0; j < len; ++j)
            acc += static_cast<T>(p.E[at(r, M, j)]) * static_cast<T>(p.k.at(b, hk, j, c));
          kp[at(r, D, c)] = rnd(acc);
        }
        for (int64_t c = 0; c < Dv; ++c) {
          T acc = 0;
          for (int64_t j = 0; j < len; ++j)
            acc += static_cast<T>(p.F[at(r, M, j)]) * static_cast<T>(p.v.at(b, hk, j, c));
          vp[at(r, Dv, c)] = rnd(acc);
        }
      }
      std::fill(dkp.begin(), dkp.end(), T(0));
      std::fill(dvp.begin(), dvp.end(), T(0));
      for (int64_t h = hk * p.group; h < (hk + 1) * p.group; ++h)
        for (int64_t i = 0; i < p.N; ++i) {
          // the weights over the k rows: P_r = exp(s_r - max) / sum, s_r = scale q_i . k'_r
          T mx = -std::numeric_limits<T>::infinity();
          for (int64_t r = 0; r < K; ++r) {
            T dot = 0;
            for (int64_t c = 0; c < D; ++c) dot += static_cast<T>(p.q.at(b, h, i, c)) * kp[at(r, D, c)];
            s[static_cast<size_t>(r)] = rnd(dot * static_cast<T>(p.scale));
            mx = std::max(mx, s[static_cast<size_t>(r)]);
          }
          T sum = 0;
          for (int64_t r = 0; r < K; ++r) sum += std::exp(s[static_cast<size_t>(r)] - mx);
          T Di = 0;  // D_i = sum_r P_r dP_r (= dO_i . O_i)
          for (int64_t r = 0; r < K; ++r) {
            P[static_cast<size_t>(r)] = rnd(std::exp(s[static_cast<size_t>(r)] - mx) / sum);
            T dov = 0;
            for (int64_t c = 0; c < Dv; ++c) dov += static_cast<T>(g.dout.at(b, h, i, c)) * vp[at(r, Dv, c)];
            dP[static_cast<size_t>(r)] = rnd(dov);
            Di += P[static_cast<size_t>(r)] * dP[static_cast<size_t>(r)];
          }
          const T dlse = g.dlse.empty() ? T(0) : static_cast<T>(g.dlse.at(b, h, i, 0));
          const T scale = static_cast<T>(p.scale);
          std::fill(dq.begin(), dq.end(), T(0));
          for (int64_t r = 0; r < K; ++r) {
            const T pr = P[static_cast<size_t>(r)];
            for (int64_t c = 0; c < Dv; ++c) dvp[at(r, Dv, c)] += pr * static_cast<T>(g.dout.at(b, h, i, c));
            const T dS = rnd(pr * (dP[static_cast<size_t>(r)] - rnd(Di) + dlse));
            for (int64_t c = 0; c < D; ++c) {
              dq[static_cast<size_t>(c)] += dS * scale * kp[at(r, D, c)];
              dkp[at(r, D, c)] += dS * scale * static_cast<T>(p.q.at(b, h, i, c));
            }
          }
          for (int64_t c = 0; c < D; ++c)
            store_from_float(g.dq.data, g.dq.dtype, g.dq.offset(b, h, i, c),
                             static_cast<float>(dq[static_cast<size_t>(c)]));
        }
      for (T& x : dkp) x = rnd(x);
      for (T& x : dvp) x = rnd(x);
      // dK = E^T dK', dV = F^T dV'; keys past the length: zero
      for (int64_t j = 0; j < M; ++j) {
        for (int64_t c = 0; c < D; ++c) {
          T acc = 0;
          for (int64_t r = 0; r < K && j < len; ++r) acc += static_cast<T>(p.E[at(r, M, j)]) * dkp[at(r, D, c)];
          store_from_float(g.dk.data, g.dk.dtype, g.dk.offset(b, hk, j, c), static_cast<float>(rnd(acc)));
        }
        for (int64_t c = 0; c < Dv; ++c) {
          T acc = 0;
          for (int64_t r = 0; r < K && j < len; ++r) acc += static_cast<T>(p.F[at(r, M, j)]) * dvp[at(r, Dv, c)];
          store_from_float(g.dv.data, g.dv.dtype, g.dv.offset(b, hk, j, c), static_cast<float>(rnd(acc)));
        }
      }
      if (grads)  // dE += dK' K^T, dF += dV' V^T over the valid keys
        for (int64_t r = 0; r < K; ++r)
          for (int64_t j = 0; j < len; ++j) {
            T e = 0, f = 0;
            for (int64_t c = 0; c < D; ++c) e += dkp[at(r, D, c)] * static_cast<T>(p.k.at(b, hk, j, c));
            for (int64_t c = 0; c < Dv; ++c) f += dvp[at(r, Dv, c)] * static_cast<T>(p.v.at(b, hk, j, c));
            dE[at(r, M, j)] += e;
            dF[at(r, M, j)] += f;
          }
    }
  if (!grads) return;
  const TensorView &gE = g.dparams.at("E"), &gF = g.dparams.at("F");
  for (int64_t r = 0; r < p.mech.k && r < K; ++r)
    for (int64_t j = 0; j < M; ++j) {
      store_from_float(gE.data, gE.dtype, gE.offset(0, 0, r, j), static_cast<float>(rnd(dE[at(r, M, j)])));
      store_from_float(gF.data, gF.dtype, gF.offset(0, 0, r, j), static_cast<float>(rnd(dF[at(r, M, j)])));
    }
}

// ---- projected: float32 --------------------------------------------------------------------

constexpr int64_t kParamRows = 16;  // rows of dE and dF per task

void run_projected(const LinformerProblem& p, const core::BackwardViews& g, const core::Context& ctx) {
  const kernels::TileKernels& kern = *ctx.kern;
  const int64_t K = p.K, M = p.M, D = p.D, Dv = p.Dv, items = p.B * p.Hkv;
  const bool grads = g.dparams.contains("E");
  // the forward's projections, again (the same float32 sums, so the forward's lse belongs to them)
  Tensor kp(DType::f32, {p.B, p.Hkv, K, D}), vp(DType::f32, {p.B, p.Hkv, K, Dv});
  Tensor dkp(DType::f32, {p.B, p.Hkv, K, D}), dvp(DType::f32, {p.B, p.Hkv, K, Dv});
  // dE, dF: the keys and values of every (b, kv head) transposed, (D, M) and (Dv, M) float32
  std::vector<float> kt(grads ? static_cast<size_t>(items * D * M) : 0);
  std::vector<float> vt(grads ? static_cast<size_t>(items * Dv * M) : 0);
  const int64_t width = std::max(D, Dv);
  int threads = resolve_threads(ctx.threads, items);
  std::vector<float> rows(static_cast<size_t>(threads * width)), back(static_cast<size_t>(threads * M * width));
  parallel_for(items, threads, [&](int64_t item, int thread) {
    const int64_t b = item / p.Hkv, h = item % p.Hkv;
    float* row = rows.data() + thread * width;
    linformer_project(p.E.data(), K, M, p.kv_len[b], p.k, b, h, reinterpret_cast<float*>(kp.view().ptr(b, h, 0)), row);
    linformer_project(p.F.data(), K, M, p.kv_len[b], p.v, b, h, reinterpret_cast<float*>(vp.view().ptr(b, h, 0)), row);
  });
  // the softmax backward on K', V': dQ (in q's dtype), dK', dV'
  AttendOptions inner;
  inner.threads = ctx.threads;
  inner.isa = kern.isa;
  inner.row_cache_bytes = ctx.row_cache_bytes;
  Softmax exact;
  exact.scale = p.scale;
  Tensor q32;
  if (p.q.dtype != DType::f32) q32 = core::float32_copy(kern, p.q);
  const TensorView q = p.q.dtype == DType::f32 ? p.q : q32.view();
  const exact::Problem sp =
      exact::SoftmaxFamily::validate(q, kp.view(), vp.view(), exact, inner, core::Outputs{&g.out, &g.lse});
  exact::softmax_backward_tiled(sp, core::BackwardViews{g.dout, g.out, g.lse, g.dq, dkp.view(), dvp.view(), g.dlse},
                                ctx);
  // dK = E^T dK', dV = F^T dV' per (b, kv head); the transposed rows for dE, dF
  parallel_for(items, threads, [&](int64_t item, int thread) {
    const int64_t b = item / p.Hkv, h = item % p.Hkv, len = p.kv_len[static_cast<size_t>(b)];
    float* out = back.data() + thread * M * width;
    for (int pass = 0; pass < 2; ++pass) {
      const std::vector<float>& P = pass == 0 ? p.E : p.F;
      const TensorView& dst = pass == 0 ? g.dk : g.dv;
      const int64_t d = pass == 0 ? D : Dv;
      const float* dy = reinterpret_cast<const float*>((pass == 0 ? dkp : dvp).view().ptr(b, h, 0));
      if (len > 0) kern.gemm(len, d, K, P.data(), 1, M, dy, d, out, d, false);  // A(j, r) = P[r][j]
      std::fill(out + len * d, out + M * d, 0.0f);
      for (int64_t j = 0; j < M; ++j) kern.from_float(out + j * d, dst.dtype, dst.strides[3], d, dst.ptr(b, h, j));
      if (grads) {
        float* t = (pass == 0 ? kt : vt).data() + item * d * M;
        const TensorView& x = pass == 0 ? p.k : p.v;
        for (int64_t j = 0; j < len; ++j) {
          kern.to_float(x.ptr(b, h, j), x.dtype, x.strides[3], d, out);
          for (int64_t c = 0; c < d; ++c) t[c * M + j] = out[c];
        }
      }
    }
  });
  if (!grads) return;
  // dE, dF by blocks of rows, each summed over (b, kv head) in order
  const TensorView &gE = g.dparams.at("E"), &gF = g.dparams.at("F");
  const int64_t blocks = (K + kParamRows - 1) / kParamRows;
  threads = resolve_threads(ctx.threads, blocks);
  parallel_for(blocks, threads, [&](int64_t blk, int) {
    const int64_t r0 = blk * kParamRows, n = std::min(kParamRows, K - r0);
    for (int pass = 0; pass < 2; ++pass) {
      const TensorView& dst = pass == 0 ? gE : gF;
      const int64_t d = pass == 0 ? D : Dv;
      float* acc = reinterpret_cast<float*>(dst.ptr(0, 0, r0));  // float32, contiguous (1, 1, k, M)
      std::fill(acc, acc + n * M, 0.0f);
      for (int64_t item = 0; item < items; ++item) {
        const int64_t b = item / p.Hkv, h = item % p.Hkv, len = p.kv_len[static_cast<size_t>(b)];
        if (len == 0) continue;
        const float* dy = reinterpret_cast<const float*>((pass == 0 ? dkp : dvp).view().ptr(b, h, r0));
        const float* t = (pass == 0 ? kt : vt).data() + item * d * M;
        kern.gemm(n, len, d, dy, d, 1, t, M, acc, M, true);
      }
    }
  });
}

}  // namespace

std::string LinformerFamily::backward_refusal(const LinformerProblem&) { return ""; }

std::vector<core::LearnedParam> LinformerFamily::learned_params(const LinformerProblem& p) {
  if (!p.learned) return {};
  return {{"E", {1, 1, p.mech.k, p.M}}, {"F", {1, 1, p.mech.k, p.M}}};
}

void LinformerFamily::backward_reference(const LinformerProblem& p, const core::BackwardViews& g,
                                         core::RefPrecision precision) {
  if (precision == core::RefPrecision::f64)
    reference_impl<double>(p, g, false);
  else
    reference_impl<float>(p, g, true);
}

const std::vector<core::BackwardForm<LinformerProblem>>& LinformerFamily::backward_forms() {
  static const std::vector<core::BackwardForm<LinformerProblem>> list = {
      {"projected", "float32: the projections again, the softmax tiled backward on K', V', then E^T dK', F^T dV'",
       core::refuse_nothing<LinformerProblem>, run_projected},
      {"reference", "float64 projections and softmax (slow, exact)", core::refuse_nothing<LinformerProblem>,
       [](const LinformerProblem& p, const core::BackwardViews& g, const core::Context&) {
         reference_impl<double>(p, g, false);
       }},
  };
  return list;
}

}  // namespace attn::lowrank
