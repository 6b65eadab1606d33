// DCA's fast backward, form "parts" (formulas: dca_backward_reference.cpp). The forward's three
// parts are exact softmax problems over rotated copies of q and k whose partials merge into one
// softmax; against the merged LSE and output each part's weights are the merged weights
// P_ij = exp(x_ij - lse_i) of its keys, and D_i = dO_i . O_i - dlse_i is the whole row's. So the
// softmax family's tiled backward (flash-style: P recomputed from the LSE, tile products, bitwise
// the same for any thread count), run on each part with the merged lse and out, gives that part's
// share of dV and of the gradients of the rotated rows, dq~ and dk~. Then
//   dq_i = sum_t R(pos_t(i))^T dq~_i^t   (rotated back per part, summed in part order)
//   dk_j = R(j mod s)^T sum_t dk~_j^t    dv_j = sum_t dv_j^t
// float32 throughout; the sums over parts and the rotations are elementwise per row, so the result
// does not depend on the thread count. Nothing of size N x M is kept.
#include <cmath>
#include <vector>

#include "base/parallel.hpp"
#include "dca/dca.hpp"
#include "mask/pattern.hpp"
#include "softmax/softmax_backward.hpp"

namespace attn::dca {
namespace {

// theta^(-2c / D) for pair c < D / 2, as the forward's rotation (rope.cpp) computes them.
std::vector<double> inverse_frequencies(const Dca& m, int64_t D) {
  std::vector<double> f(static_cast<size_t>(D / 2));
  for (int64_t c = 0; c < D / 2; ++c) f[static_cast<size_t>(c)] = std::pow(m.theta, -2.0 * static_cast<double>(c) / static_cast<double>(D));
  return f;
}

// row = R(pos)^T row (D floats): angles in float64, cos and sin rounded to float as the forward's.
void rotate_back(const Rope& r, const double* inv_freq, int64_t D, int64_t pos, float* row) {
  const int64_t half = D / 2;
  for (int64_t c = 0; c < half; ++c) {
    const double angle = static_cast<double>(pos) * inv_freq[c];
    const float co = static_cast<float>(std::cos(angle)), si = static_cast<float>(std::sin(angle));
    const int64_t ia = r.style == RopeStyle::half ? c : 2 * c, ib = r.style == RopeStyle::half ? c + half : 2 * c + 1;
    const float ga = row[ia], gb = row[ib];
    row[ia] = ga * co + gb * si;
    row[ib] = gb * co - ga * si;
  }
}

float* row_of(const Tensor& t, int64_t b, int64_t h, int64_t n) { return reinterpret_cast<float*>(t.view().ptr(b, h, n)); }

void run_parts(const DcaProblem& p, const core::BackwardViews& g, const core::Context& ctx) {
  if (p.B == 0 || p.H == 0 || p.N == 0) return;  // dk and dv are 0 (fresh tensors are zeroed)
  const kernels::TileKernels& kern = *ctx.kern;
  const Rope rope = dca_rope(p.dca);
  const std::vector<double> inv = inverse_frequencies(p.dca, p.D);
  const Tensor k = dca_rotated_keys(kern, p);
  // float32 sums over the parts (dq rotated back, dk still rotated) and one part's gradients
  const Tensor dq(DType::f32, {p.B, p.H, p.N, p.D}), dk(DType::f32, {p.B, p.Hkv, p.M, p.D}),
      dv(DType::f32, {p.B, p.Hkv, p.M, p.Dv});
  const Tensor pdq(DType::f32, {p.B, p.H, p.N, p.D}), pdk(DType::f32, {p.B, p.Hkv, p.M, p.D}),
      pdv(DType::f32, {p.B, p.Hkv, p.M, p.Dv});
  const int q_threads = resolve_threads(ctx.threads, p.B * p.H), kv_threads = resolve_threads(ctx.threads, p.B * p.Hkv);
  for (int t = 0; t < kDcaParts; ++t) {
    const Tensor q = dca_rotated_queries(kern, p, t);
    const exact::Problem part = dca_part_problem(p, t, q.view(), k.view());
    const core::BackwardViews pg{g.dout, g.out, g.lse, pdq.view(), pdk.view(), pdv.view(), g.dlse};
    exact::softmax_backward_tiled(part, pg, ctx);  // writes every row of pdq, pdk and pdv
    parallel_for(p.B * p.H, q_threads, [&](int64_t item, int) {
      const int64_t b = item / p.H, h = item % p.H;
      for (int64_t i = 0; i < p.N; ++i) {
        float* part_row = row_of(pdq, b, h, i);
        rotate_back(rope, inv.data(), p.D, dca_query_position(p.dca, kDcaPartSpecs[t].part, i + p.offset), part_row);
        float* sum = row_of(dq, b, h, i);
        for (int64_t c = 0; c < p.D; ++c) sum[c] += part_row[c];
      }
    });
    parallel_for(p.B * p.Hkv, kv_threads, [&](int64_t item, int) {
      const int64_t b = item / p.Hkv, hk = item % p.Hkv;
      for (int64_t j = 0; j < p.M; ++j) {
        const float *fk = row_of(pdk, b, hk, j), *fv = row_of(pdv, b, hk, j);
        float *sk = row_of(dk, b, hk, j), *sv = row_of(dv, b, hk, j);
        for (int64_t c = 0; c < p.D; ++c) sk[c] += fk[c];
        for (int64_t c = 0; c < p.Dv; ++c) sv[c] += fv[c];
      }
    });
  }
  parallel_for(p.B * p.H, q_threads, [&](int64_t item, int) {
    const int64_t b = item / p.H, h = item % p.H;
    for (int64_t i = 0; i < p.N; ++i) kern.from_float(row_of(dq, b, h, i), g.dq.dtype, g.dq.strides[3], p.D, g.dq.ptr(b, h, i));
  });
  parallel_for(p.B * p.Hkv, kv_threads, [&](int64_t item, int) {
    const int64_t b = item / p.Hkv, hk = item % p.Hkv;
    for (int64_t j = 0; j < p.M; ++j) {
      float* row = row_of(dk, b, hk, j);
      rotate_back(rope, inv.data(), p.D, mask::floor_mod(j, p.dca.chunk), row);
      kern.from_float(row, g.dk.dtype, g.dk.strides[3], p.D, g.dk.ptr(b, hk, j));
      kern.from_float(row_of(dv, b, hk, j), g.dv.dtype, g.dv.strides[3], p.Dv, g.dv.ptr(b, hk, j));
    }
  });
}

}  // namespace

std::string DcaFamily::backward_refusal(const DcaProblem&) { return ""; }

const std::vector<core::BackwardForm<DcaProblem>>& DcaFamily::backward_forms() {
  static const std::vector<core::BackwardForm<DcaProblem>> list = {
      {"parts", "float32, the softmax tiled backward on each part against the merged LSE, rotated back and summed",
       core::refuse_nothing<DcaProblem>, run_parts},
      {"reference", "float64, each pair's remapped position, one softmax (slow, exact)",
       core::refuse_nothing<DcaProblem>,
       [](const DcaProblem& p, const core::BackwardViews& g, const core::Context&) {
         DcaFamily::backward_reference(p, g, core::RefPrecision::f64);
       }},
  };
  return list;
}

}  // namespace attn::dca
