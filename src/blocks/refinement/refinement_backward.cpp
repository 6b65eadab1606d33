// Attention-weight refinement's backward (attn/refinement.hpp): the float form and the entry points
// (the double one runs the plain reference of refinement_backward_reference.cpp).
//
// The float form recomputes the forward's P1, P2 (or X = [mu | sigma]) and U = A V, then in
// blocks of 32 rows writes A^ (stochastic: its scores by the differences x_i - x_j, more accurate
// than the forward's expanded form) and dS out (batch, n, n), and takes every product through the kernel
// table's gemm, which sums over its inner index in order per element; the transposed products
// (A^^T dO, dS^T P1, A^T dU, A^T dP) read the stored matrices in place, columns from the block's
// first row on (the rows above it hold exact zeros there). Each output element is written by one
// task, and dW1, dW2 sum over the batch inside that task in batch order: no reduction across
// threads, so the results are bitwise the same for any thread count. Every buffer is allocated
// before the parallel regions.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "attn/error.hpp"
#include "attn/isa.hpp"
#include "attn/refinement.hpp"
#include "base/parallel.hpp"
#include "kernels/kernel_table.hpp"
#include "refinement/refinement_internal.hpp"

namespace attn {
namespace {

using refinement::causal_gemm;
using refinement::elu1;
using refinement::softmax_row;

constexpr const char* kWhere = "refine_attention_backward";
constexpr int64_t kBlockRows = 32;

template <class T>
void check_buffers(const T* dout, const T* a, const T* v, int64_t batch, int64_t n, int64_t dv, const T* grad_a,
                   const T* grad_v, const T* grad_w1, const T* grad_w2) {
  const bool rows = batch * n > 0;
  if (rows && a == nullptr) fail(kWhere, "a is null");
  if (rows && dv > 0 && (v == nullptr || dout == nullptr))
    fail(kWhere, std::string(v == nullptr ? "v" : "dout") + " is null (batch * N * dv = " +
                     std::to_string(batch * n * dv) + " values expected)");
  if (rows && grad_a == nullptr) fail(kWhere, "grad_a is null (batch * N * N values expected)");
  if (rows && dv > 0 && grad_v == nullptr) fail(kWhere, "grad_v is null (batch * N * dv values expected)");
  if (grad_w1 == nullptr || grad_w2 == nullptr)
    fail(kWhere, std::string(grad_w1 == nullptr ? "grad_w1" : "grad_w2") + " is null (N * r values expected)");
}

// dst (cols, rows) = src (rows, cols, row stride ld) transposed
void transpose(const float* src, int64_t rows, int64_t cols, int64_t ld, float* dst) {
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t c = 0; c < cols; ++c) dst[c * rows + i] = src[i * ld + c];
}

void backward_fast(const float* dout, const float* a, const float* v, int64_t batch, int64_t n, int64_t dv,
                   const MatrixRef<float>& w1, const MatrixRef<float>& w2, float* ga, float* gv, float* gw1,
                   float* gw2, const RefineOptions& o) {
  const kernels::TileKernels& kern = kernels::kernels_for(active_isa());
  const bool stoch = o.form == RefineForm::stochastic;
  const bool vw = o.form == RefineForm::value_weighted, add = o.form == RefineForm::additive;
  const bool need_u = vw || add;
  const int64_t r = w1.cols, rq = stoch ? 2 * r : r;
  const float gamma = static_cast<float>(o.gamma), c = add ? gamma : 1.0f;
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(r)));
  const int64_t blocks = (n + kBlockRows - 1) / kBlockRows, items = batch * blocks;
  const auto sz = [](int64_t e) { return static_cast<size_t>(e); };
  // x: queries P1 (stochastic: X = [mu | sigma]); k: keys P2 and kt: them transposed per entry
  // (r, n) (not stochastic); vt, ut: V^T and U^T per entry (dv, n)
  std::vector<float> x(sz(batch * n * rq)), k(stoch ? 0 : sz(batch * n * r)), kt(stoch ? 0 : sz(batch * n * r));
  std::vector<float> u(need_u ? sz(batch * n * dv) : 0), du(need_u ? sz(batch * n * dv) : 0);
  std::vector<float> vt(sz(batch * dv * n)), ut(vw ? sz(batch * dv * n) : 0);
  std::vector<float> hat(sz(batch * n * n)), ds(sz(batch * n * n));
  std::vector<float> dp1(sz(batch * n * r)), dp2(sz(batch * n * r));
  std::vector<float> w1t(sz(r * n)), w2t(sz(r * n));
  transpose(w1.data, n, r, r, w1t.data());
  transpose(w2.data, n, r, r, w2t.data());
  const int nt = resolve_threads(o.threads, items);
  const int64_t per_thread = kBlockRows * n + rq;
  std::vector<float> scratch(sz(nt * per_thread));

  // 1. the forward's products: P1, P2 (X), U = A V; additive: dU = (1 - gamma) dO
  parallel_for(items, nt, [&](int64_t item, int) {
    const int64_t b = item / blocks, i0 = (item % blocks) * kBlockRows, nb = std::min(kBlockRows, n - i0);
    const float* ab = a + (b * n + i0) * n;
    if (stoch) {
      causal_gemm(kern, nb, i0, ab, n, w1.data, r, r, x.data() + (b * n + i0) * rq, rq);
      causal_gemm(kern, nb, i0, ab, n, w2.data, r, r, x.data() + (b * n + i0) * rq + r, rq);
      for (int64_t i = i0; i < i0 + nb; ++i) {
        float* sr = x.data() + (b * n + i) * rq + r;
        for (int64_t e = 0; e < r; ++e) sr[e] = elu1(sr[e]);
      }
    } else {
      causal_gemm(kern, nb, i0, ab, n, w1.data, r, r, x.data() + (b * n + i0) * r, r);
      causal_gemm(kern, nb, i0, ab, n, w2.data, r, r, k.data() + (b * n + i0) * r, r);
    }
    if (need_u && dv > 0) causal_gemm(kern, nb, i0, ab, n, v + b * n * dv, dv, dv, u.data() + (b * n + i0) * dv, dv);
    if (add)
      for (int64_t e = (b * n + i0) * dv; e < (b * n + i0 + nb) * dv; ++e) du[e] = (1.0f - gamma) * dout[e];
  });
  // 2. per entry: the keys transposed (not stochastic), V^T, U^T (value_weighted)
  parallel_for(batch, resolve_threads(o.threads, batch), [&](int64_t b, int) {
    if (!stoch) transpose(k.data() + b * n * r, n, r, r, kt.data() + b * n * r);
    transpose(v + b * n * dv, n, dv, dv, vt.data() + b * dv * n);
    if (vw) transpose(u.data() + b * n * dv, n, dv, dv, ut.data() + b * dv * n);
  });
  // 3. rows of A^ (as the forward) and dS = A^ (dA^ - rowdot), dA^ = c dO Vt^T; zero above the diagonal
  parallel_for(items, nt, [&](int64_t item, int t) {
    const int64_t b = item / blocks, i0 = (item % blocks) * kBlockRows, nb = std::min(kBlockRows, n - i0);
    const int64_t i1 = i0 + nb;
    float* h = hat.data() + (b * n + i0) * n;
    float* d = ds.data() + (b * n + i0) * n;
    float* dh = scratch.data() + t * per_thread;  // (nb, i1)
    if (!stoch) kern.gemm(nb, i1, r, x.data() + (b * n + i0) * r, r, 1, kt.data() + b * n * r, n, h, n, false);
    if (dv > 0)
      kern.gemm(nb, i1, dv, dout + (b * n + i0) * dv, dv, 1, (vw ? ut.data() : vt.data()) + b * dv * n, n, dh, i1,
                false);
    else
      std::fill(dh, dh + nb * i1, 0.0f);
    for (int64_t ii = 0; ii < nb; ++ii) {
      const int64_t i = i0 + ii;
      float* row = h + ii * n;
      if (stoch) {
        // -|x_i - x_j|^2 by the differences (the forward's 2 x_i.x_j - |x_j|^2 loses digits to
        // cancellation when |x| is large, and the gradients would carry that error)
        const float* xi = x.data() + (b * n + i) * rq;
        for (int64_t j = 0; j <= i; ++j) {
          const float* xj = x.data() + (b * n + j) * rq;
          float sum = 0;
          for (int64_t e = 0; e < rq; ++e) sum += (xi[e] - xj[e]) * (xi[e] - xj[e]);
          row[j] = -sum;
        }
      } else {
        for (int64_t j = 0; j <= i; ++j) row[j] *= scale;
      }
      softmax_row<float, float>(row, i + 1);
      std::fill(row + i + 1, row + n, 0.0f);
      const float* dhr = dh + ii * i1;
      float dot = 0;
      for (int64_t j = 0; j <= i; ++j) dot += row[j] * (c * dhr[j]);
      float* dsr = d + ii * n;
      for (int64_t j = 0; j <= i; ++j) dsr[j] = row[j] * (c * dhr[j] - dot);
      std::fill(dsr + i + 1, dsr + n, 0.0f);
    }
  });
  // 4. per block of rows j: dVt = c A^^T dO, dP1, dP2, dA = dP1 W1^T + dP2 W2^T + dU V^T
  parallel_for(items, nt, [&](int64_t item, int t) {
    const int64_t b = item / blocks, j0 = (item % blocks) * kBlockRows, nb = std::min(kBlockRows, n - j0);
    const int64_t tail = n - j0;  // rows i >= j0: the only ones whose entries in columns >= j0 may be nonzero
    const float* hb = hat.data() + b * n * n + j0 * n + j0;  // (A^^T)(jj, p) = hb[p n + jj]
    const float* dsb = ds.data() + b * n * n + j0 * n + j0;
    const float* ab = a + b * n * n + j0 * n + j0;
    if (dv > 0) {
      float* dst = vw ? du.data() + (b * n + j0) * dv : gv + (b * n + j0) * dv;
      kern.gemm(nb, dv, tail, hb, 1, n, dout + (b * n + j0) * dv, dv, dst, dv, false);
      if (add)
        for (int64_t e = 0; e < nb * dv; ++e) dst[e] *= c;
      if (add) kern.gemm(nb, dv, tail, ab, 1, n, du.data() + (b * n + j0) * dv, dv, dst, dv, true);  // + A^T dU
    }
    float* d1 = dp1.data() + (b * n + j0) * r;
    float* d2 = dp2.data() + (b * n + j0) * r;
    if (!stoch) {
      causal_gemm(kern, nb, j0, ds.data() + (b * n + j0) * n, n, k.data() + b * n * r, r, r, d1, r);
      kern.gemm(nb, r, tail, dsb, 1, n, x.data() + (b * n + j0) * r, r, d2, r, false);
      for (int64_t e = 0; e < nb * r; ++e) {
        d1[e] *= scale;
        d2[e] *= scale;
      }
    } else {
      // dX_j = 2 (sum_i<=j dS_ji (x_i - x_j) + sum_i>=j dS_ij (x_i - x_j)), by the differences (the
      // expanded (dS + dS^T) X - (rowsum + colsum) X cancels digits away)
      float* acc = scratch.data() + t * per_thread + kBlockRows * n;  // rq values
      const float* xb = x.data() + b * n * rq;
      const float* dsb_full = ds.data() + b * n * n;
      for (int64_t jj = 0; jj < nb; ++jj) {
        const int64_t j = j0 + jj;
        const float* xj = xb + j * rq;
        std::fill(acc, acc + rq, 0.0f);
        for (int64_t i = 0; i < n; ++i) {
          const float gij = i <= j ? dsb_full[j * n + i] : dsb_full[i * n + j];  // the nonzero one of dS_ji, dS_ij
          const float* xi = xb + i * rq;
          for (int64_t e = 0; e < rq; ++e) acc[e] += gij * (xi[e] - xj[e]);
        }
        for (int64_t e = 0; e < r; ++e) d1[jj * r + e] = 2.0f * acc[e];
        for (int64_t e = 0; e < r; ++e) {
          const float sig = xj[r + e];
          d2[jj * r + e] = 2.0f * acc[r + e] * (sig > 1.0f ? 1.0f : sig);  // elu'(p) = 1 for p > 0, else exp(p) = sigma
        }
      }
    }
    float* gar = ga + (b * n + j0) * n;
    kern.gemm(nb, n, r, d1, r, 1, w1t.data(), n, gar, n, false);
    kern.gemm(nb, n, r, d2, r, 1, w2t.data(), n, gar, n, true);
    if (need_u && dv > 0)
      kern.gemm(nb, n, dv, du.data() + (b * n + j0) * dv, dv, 1, vt.data() + b * dv * n, n, gar, n, true);
  });
  // 5. value_weighted: dV = A^T dU (dU complete now)
  if (vw && dv > 0)
    parallel_for(items, nt, [&](int64_t item, int) {
      const int64_t b = item / blocks, j0 = (item % blocks) * kBlockRows, nb = std::min(kBlockRows, n - j0);
      kern.gemm(nb, dv, n - j0, a + b * n * n + j0 * n + j0, 1, n, du.data() + (b * n + j0) * dv, dv,
                gv + (b * n + j0) * dv, dv, false);
    });
  // 6. dW = sum over the batch, in batch order, of A^T dP (rows p of W per task)
  parallel_for(blocks, resolve_threads(o.threads, blocks), [&](int64_t blk, int) {
    const int64_t p0 = blk * kBlockRows, nb = std::min(kBlockRows, n - p0);
    for (int64_t b = 0; b < batch; ++b) {
      const float* ab = a + b * n * n + p0 * n + p0;
      kern.gemm(nb, r, n - p0, ab, 1, n, dp1.data() + (b * n + p0) * r, r, gw1 + p0 * r, r, b > 0);
      kern.gemm(nb, r, n - p0, ab, 1, n, dp2.data() + (b * n + p0) * r, r, gw2 + p0 * r, r, b > 0);
    }
  });
}

}  // namespace

void refine_attention_backward(const float* dout, const float* a, const float* v, int64_t batch, int64_t n,
                               int64_t dv, MatrixRef<float> w1, MatrixRef<float> w2, float* grad_a, float* grad_v,
                               float* grad_w1, float* grad_w2, const RefineOptions& options) {
  refinement::check_inputs(kWhere, a, batch, n, dv, w1, w2, options);
  check_buffers(dout, a, v, batch, n, dv, grad_a, grad_v, grad_w1, grad_w2);
  if (batch == 0) {
    std::fill(grad_w1, grad_w1 + n * w1.cols, 0.0f);
    std::fill(grad_w2, grad_w2 + n * w1.cols, 0.0f);
    return;
  }
  backward_fast(dout, a, v, batch, n, dv, w1, w2, grad_a, grad_v, grad_w1, grad_w2, options);
}

void refine_attention_backward(const double* dout, const double* a, const double* v, int64_t batch, int64_t n,
                               int64_t dv, MatrixRef<double> w1, MatrixRef<double> w2, double* grad_a,
                               double* grad_v, double* grad_w1, double* grad_w2, const RefineOptions& options) {
  refinement::check_inputs(kWhere, a, batch, n, dv, w1, w2, options);
  check_buffers(dout, a, v, batch, n, dv, grad_a, grad_v, grad_w1, grad_w2);
  refinement::backward_plain(dout, a, v, batch, n, dv, w1.data, w2.data, w1.cols, options, grad_a, grad_v, grad_w1,
                             grad_w2);
}

}  // namespace attn
