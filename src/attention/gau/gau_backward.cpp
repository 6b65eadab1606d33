// GAU's backward: the gradients of o_i = sum_j a_ij v_j, a_ij = relu(x_ij)^2 / n with
// x_ij = scale q_i . k_j + bias over the keys j row i sees (n: the batch's valid key count):
//   dV_j = sum_i a_ij dO_i          dA_ij = dO_i . v_j          dX_ij = dA_ij 2 relu(x_ij) / n
//   dQ_i = scale sum_j dX_ij k_j    dK_j = scale sum_i dX_ij q_i
// No softmax, so nothing of the forward is needed but its inputs: no LSE, no output.
// Forms: "tiled" (64 queries x 64 keys per step, five gemm calls, float32; tasks of
// core::KvGradientTasks, bitwise the same for any thread count) and "reference" (float64).
// Non-finite inputs go to the reference, which visits exactly the pairs a row sees (0 * NaN in a
// tile product would reach gradients that do not depend on the poison).
#include <algorithm>
#include <cmath>
#include <vector>

#include "base/aligned_buffer.hpp"
#include "base/parallel.hpp"
#include "core/kv_gradient_tasks.hpp"
#include "core/nonfinite_rows.hpp"
#include "core/reference_result.hpp"
#include "gau/gau.hpp"

namespace attn::gau {
namespace {

constexpr int64_t kBlock = kernels::kQueryTile;

// The last key (exclusive) query i of batch b sees (as the forward's).
int64_t key_end(const GauProblem& p, int64_t b, int64_t i) {
  const int64_t len = p.kv_len[static_cast<size_t>(b)];
  return p.mech.causal ? std::clamp<int64_t>(i + p.M - p.N + 1, 0, len) : len;
}

void store(const TensorView& t, int64_t b, int64_t h, int64_t i, int64_t c, double x) {
  store_from_float(t.data, t.dtype, t.offset(b, h, i, c), static_cast<float>(x));
}

// T = double: the oracle; T = float with `plain`: every intermediate rounded to the storage dtype.
template <class T>
void reference_impl(const GauProblem& p, const core::BackwardViews& g, bool plain) {
  const core::Rounding<T> rnd{p.q.dtype, plain};
  std::vector<T> dk(static_cast<size_t>(p.M * p.D)), dv(static_cast<size_t>(p.M * p.Dv)), dq(static_cast<size_t>(p.D));
  const T scale = static_cast<T>(p.scale), bias = static_cast<T>(p.mech.bias);
  for (int64_t b = 0; b < p.B; ++b) {
    const T n = static_cast<T>(p.kv_len[static_cast<size_t>(b)]);
    for (int64_t hk = 0; hk < p.Hkv; ++hk) {
      std::fill(dk.begin(), dk.end(), T(0));
      std::fill(dv.begin(), dv.end(), T(0));
      for (int64_t h = hk * p.group; h < (hk + 1) * p.group; ++h)
        for (int64_t i = 0; i < p.N; ++i) {
          std::fill(dq.begin(), dq.end(), T(0));
          for (int64_t j = 0; j < key_end(p, b, i); ++j) {
            T dot = 0;
            for (int64_t c = 0; c < p.D; ++c) dot += static_cast<T>(p.q.at(b, h, i, c)) * static_cast<T>(p.k.at(b, hk, j, c));
            dot = rnd(dot);
            // + (dot - dot): a score of +-inf (a non-finite q or k) is NaN, as in the forward
            const T r = rnd(std::max((dot + (dot - dot)) * scale + bias, T(0)));
            const T a = rnd(r * r / n);
            T da = 0;
            for (int64_t c = 0; c < p.Dv; ++c) {
              const T d = static_cast<T>(g.dout.at(b, h, i, c));
              da += d * static_cast<T>(p.v.at(b, hk, j, c));
              dv[static_cast<size_t>(j * p.Dv + c)] += a * d;
            }
            const T dx = rnd(rnd(da) * 2 * r / n * scale);
            for (int64_t c = 0; c < p.D; ++c) {
              dq[static_cast<size_t>(c)] += dx * static_cast<T>(p.k.at(b, hk, j, c));
              dk[static_cast<size_t>(j * p.D + c)] += dx * static_cast<T>(p.q.at(b, h, i, c));
            }
          }
          for (int64_t c = 0; c < p.D; ++c) store(g.dq, b, h, i, c, static_cast<double>(dq[static_cast<size_t>(c)]));
        }
      for (int64_t j = 0; j < p.M; ++j) {
        for (int64_t c = 0; c < p.D; ++c) store(g.dk, b, hk, j, c, static_cast<double>(dk[static_cast<size_t>(j * p.D + c)]));
        for (int64_t c = 0; c < p.Dv; ++c) store(g.dv, b, hk, j, c, static_cast<double>(dv[static_cast<size_t>(j * p.Dv + c)]));
      }
    }
  }
}

struct Scratch {
  AlignedFloats q, dout, dq, kt, vt, s, da, kall, vall;
  AlignedFloats ones{kBlock};
  void reserve(const GauProblem& p) {
    q.resize(static_cast<size_t>(kBlock * p.D));
    dout.resize(static_cast<size_t>(kBlock * p.Dv));
    dq.resize(static_cast<size_t>(kBlock * p.D));
    kt.resize(static_cast<size_t>(p.D * kBlock));
    vt.resize(static_cast<size_t>(p.Dv * kBlock));
    s.resize(static_cast<size_t>(kBlock * kBlock));
    da.resize(static_cast<size_t>(kBlock * kBlock));
    kall.resize(static_cast<size_t>(p.M * p.D));
    vall.resize(static_cast<size_t>(p.M * p.Dv));
    std::fill(ones.data(), ones.data() + kBlock, 1.0f);
  }
};

// Rows [0, n) of head h of batch b of t as float32 rows of t's last dimension.
void load(const kernels::TileKernels& kern, const TensorView& t, int64_t b, int64_t h, int64_t i0, int64_t n, float* dst) {
  const int64_t dim = t.shape[3];
  for (int64_t i = 0; i < n; ++i) kern.to_float(t.ptr(b, h, i0 + i), t.dtype, t.strides[3], dim, dst + i * dim);
}

void task(const GauProblem& p, const core::BackwardViews& g, const kernels::TileKernels& kern, Scratch& sc, int64_t b,
          int64_t hk, int64_t qb0, int64_t qb1, float* dk, float* dv) {
  const int64_t len = p.kv_len[static_cast<size_t>(b)];
  float *k = sc.kall.data(), *v = sc.vall.data(), *q = sc.q.data(), *dout = sc.dout.data(), *dq = sc.dq.data();
  float *s = sc.s.data(), *da = sc.da.data();
  load(kern, p.k, b, hk, 0, len, k);
  load(kern, p.v, b, hk, 0, len, v);
  const float scale = static_cast<float>(p.scale), bias = static_cast<float>(p.mech.bias);
  const float inv_n = len > 0 ? 1.0f / static_cast<float>(len) : 0.0f;
  for (int64_t h = hk * p.group; h < (hk + 1) * p.group; ++h)
    for (int64_t qb = qb0; qb < qb1; ++qb) {
      const int64_t i0 = qb * kBlock, nq = std::min(kBlock, p.N - i0);
      load(kern, p.q, b, h, i0, nq, q);
      load(kern, g.dout, b, h, i0, nq, dout);
      std::fill(dq, dq + nq * p.D, 0.0f);
      const int64_t end = key_end(p, b, i0 + nq - 1);  // the block's last row sees the most keys
      for (int64_t j0 = 0; j0 < end; j0 += kBlock) {
        const int64_t nk = std::min(kBlock, end - j0);
        kern.pack_qt(k + j0 * p.D, p.D, static_cast<int>(nk), p.D, sc.ones.data(), sc.kt.data());
        kern.pack_qt(v + j0 * p.Dv, p.Dv, static_cast<int>(nk), p.Dv, sc.ones.data(), sc.vt.data());
        kern.gemm(nq, nk, p.D, q, p.D, 1, sc.kt.data(), kBlock, s, kBlock, false);          // q . k
        kern.gemm(nq, nk, p.Dv, dout, p.Dv, 1, sc.vt.data(), kBlock, da, kBlock, false);   // dO . v
        for (int64_t r = 0; r < nq; ++r) {  // s -> a, da -> dX scale; keys past a row's end: 0
          const int64_t seen = std::clamp<int64_t>(key_end(p, b, i0 + r) - j0, 0, nk);
          float* sr = s + r * kBlock;
          float* dr = da + r * kBlock;
          for (int64_t j = 0; j < seen; ++j) {
            const float x = std::max(sr[j] * scale + bias, 0.0f);
            sr[j] = x * x * inv_n;
            dr[j] *= 2.0f * x * inv_n * scale;
          }
          std::fill(sr + seen, sr + nk, 0.0f);
          std::fill(dr + seen, dr + nk, 0.0f);
        }
        kern.gemm(nk, p.Dv, nq, s, 1, kBlock, dout, p.Dv, dv + j0 * p.Dv, p.Dv, true);  // dV += A^T dO
        kern.gemm(nk, p.D, nq, da, 1, kBlock, q, p.D, dk + j0 * p.D, p.D, true);       // dK += dX^T Q
        kern.gemm(nq, p.D, nk, da, kBlock, 1, k + j0 * p.D, p.D, dq, p.D, true);       // dQ += dX K
      }
      for (int64_t r = 0; r < nq; ++r)
        kern.from_float(dq + r * p.D, g.dq.dtype, g.dq.strides[3], p.D, g.dq.ptr(b, h, i0 + r));
    }
}

void run_tiled(const GauProblem& p, const core::BackwardViews& g, const core::Context& ctx) {
  if (p.B == 0 || p.Hkv == 0 || p.N == 0) return;  // dk and dv are 0 (fresh tensors are zeroed)
  const int t = ctx.threads;
  if (!(core::all_finite(p.q, t) && core::all_finite(p.k, t, &p.kv_len) && core::all_finite(p.v, t, &p.kv_len) &&
        core::all_finite(g.dout, t)))
    return reference_impl<double>(p, g, false);
  const core::KvGradientTasks tasks(p, (p.N + kBlock - 1) / kBlock, ctx.threads);
  std::vector<Scratch> scratch(static_cast<size_t>(tasks.threads()));  // the parallel region allocates nothing
  for (Scratch& s : scratch) s.reserve(p);
  tasks.run(g, *ctx.kern, [&](int64_t b, int64_t hk, int64_t qb0, int64_t qb1, float* dk, float* dv, int tid) {
    task(p, g, *ctx.kern, scratch[static_cast<size_t>(tid)], b, hk, qb0, qb1, dk, dv);
  });
}

}  // namespace

void GauFamily::backward_reference(const GauProblem& p, const core::BackwardViews& g, core::RefPrecision precision) {
  if (precision == core::RefPrecision::f64)
    reference_impl<double>(p, g, false);
  else
    reference_impl<float>(p, g, true);
}

std::string GauFamily::backward_refusal(const GauProblem&) { return ""; }

const std::vector<core::BackwardForm<GauProblem>>& GauFamily::backward_forms() {
  static const std::vector<core::BackwardForm<GauProblem>> list = {
      {"tiled", "float32, 64 queries x 64 keys per step, five GEMM-shaped products",
       core::refuse_nothing<GauProblem>, run_tiled},
      {"reference", "float64 weights row by row (slow, exact)", core::refuse_nothing<GauProblem>,
       [](const GauProblem& p, const core::BackwardViews& g, const core::Context&) {
         reference_impl<double>(p, g, false);
       }},
  };
  return list;
}

}  // namespace attn::gau
