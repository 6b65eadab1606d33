// Attention-weight refinement (Liu et al. 2024, our reading [unverified]): the checks both forms
// share, the float form through the kernel table's gemm, and the public entry points (the double
// ones run the reference of refinement_reference.cpp).
#include "attn/refinement.hpp"

#include <algorithm>
#include <cstdio>
#include <cmath>
#include <limits>
#include <vector>

#include "attn/error.hpp"
#include "attn/isa.hpp"
#include "base/parallel.hpp"
#include "kernels/kernel_table.hpp"
#include "refinement/refinement_internal.hpp"

namespace attn {
namespace {

using refinement::elu1;
using refinement::reference_weights;
using refinement::softmax_row;

constexpr const char* kWhere = "refine_attention";
constexpr int64_t kBlockRows = 32;

std::string num(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6g", x);
  return buf;
}

template <class T>
void check(const char* where, const T* a, int64_t batch, int64_t n, int64_t dv, const MatrixRef<T>& w1,
           const MatrixRef<T>& w2, const RefineOptions& o) {
  const bool stoch = o.form == RefineForm::stochastic;
  const std::string n1 = stoch ? "w_mu" : "w1", n2 = stoch ? "w_sigma" : "w2";
  if (batch < 0) fail(where, "batch must be non-negative, got " + std::to_string(batch));
  if (n < 1) fail(where, "a must have at least one row (N >= 1), got N = " + std::to_string(n));
  if (dv < 0) fail(where, "v must have a non-negative number of columns, got " + std::to_string(dv));
  if (o.threads < 0 || o.threads > kMaxThreads)
    fail(where, "threads must be in [0, " + std::to_string(kMaxThreads) + "], got " + std::to_string(o.threads));
  if (!(o.gamma >= 0.0 && o.gamma <= 1.0)) fail(where, "gamma must be in [0, 1], got " + num(o.gamma));
  if (!(o.row_sum_tolerance >= 0.0))
    fail(where, "row_sum_tolerance must be non-negative, got " + num(o.row_sum_tolerance));
  if (w1.rows != n)
    fail(where, n1 + " must have N = " + std::to_string(n) + " rows (one per position of a), got " +
                    std::to_string(w1.rows));
  if (w1.cols < 1) fail(where, n1 + " must have at least one column (r >= 1), got " + std::to_string(w1.cols));
  if (w2.rows != n || w2.cols != w1.cols)
    fail(where, n2 + " must have the shape of " + n1 + ", (" + std::to_string(n) + ", " + std::to_string(w1.cols) +
                    "), got (" + std::to_string(w2.rows) + ", " + std::to_string(w2.cols) + ")");
  if (w1.data == nullptr || w2.data == nullptr) fail(where, "weights have no data");
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t i = 0; i < n; ++i) {
      const T* row = a + (b * n + i) * n;
      const std::string at = batch > 1 ? "a[" + std::to_string(b) + "][" : "a[";
      for (int64_t j = i + 1; j < n; ++j)
        if (row[j] != T(0))
          fail(where, "a must be causal (zero above the diagonal), got " + at + std::to_string(i) + "][" +
                          std::to_string(j) + "] = " + num(static_cast<double>(row[j])));
      double s = 0;
      bool finite = true;
      for (int64_t j = 0; j <= i; ++j) {
        finite &= std::isfinite(static_cast<double>(row[j]));
        s += static_cast<double>(row[j]);
      }
      if (finite && !(std::fabs(s - 1.0) <= o.row_sum_tolerance))
        fail(where, "every row of a must sum to 1 (within row_sum_tolerance " + num(o.row_sum_tolerance) +
                        "), got sum of " + at + std::to_string(i) + "] = " + num(s));
    }
  }
}

// ---- the float form ----

// C row ii = sum_{p <= i0 + ii} A[ii][p] B[p] for ii < nb (A: rows i0 .. i0 + nb - 1 of a causal
// matrix, row stride lda; B row p at bm + p ldb, ncols wide; C row stride ldc). Row i reads only
// B's rows p <= i, so a non-finite value at a later position cannot reach it (0 * inf would). The
// columns p < i0, which every row of the block sees, are one gemm; each row's own triangle is then
// accumulated onto it. The gemm sums over p in order per element, so a row is bitwise what
// gemm(1, ncols, i + 1) would give, whatever the blocks.
void causal_gemm(const kernels::TileKernels& kern, int64_t nb, int64_t i0, const float* arows, int64_t lda,
                 const float* bm, int64_t ldb, int64_t ncols, float* c, int64_t ldc) {
  if (i0 > 0) kern.gemm(nb, ncols, i0, arows, lda, 1, bm, ldb, c, ldc, false);
  for (int64_t ii = 0; ii < nb; ++ii)
    kern.gemm(1, ncols, ii + 1, arows + ii * lda + i0, lda, 1, bm + i0 * ldb, ldb, c + ii * ldc, ldc, i0 > 0);
}

void refine_fast(const float* a, const float* v, int64_t batch, int64_t n, int64_t dv, const MatrixRef<float>& w1,
                 const MatrixRef<float>& w2, float* out, const RefineOptions& o) {
  const kernels::TileKernels& kern = kernels::kernels_for(active_isa());
  const bool stoch = o.form == RefineForm::stochastic;
  const bool need_av = o.form == RefineForm::value_weighted || o.form == RefineForm::additive;
  const int64_t r = w1.cols;
  const int64_t rq = stoch ? 2 * r : r;  // width of the new queries (stochastic: [mu | sigma])
  const int64_t blocks = (n + kBlockRows - 1) / kBlockRows, items = batch * blocks;
  // new queries and keys (stochastic: both X = [mu | sigma]), the keys transposed (rq, n) per
  // entry, |x_j|^2 (stochastic), A V (value_weighted, additive)
  std::vector<float> q(static_cast<size_t>(batch * n * rq)), k(stoch ? 0 : q.size()), kt(q.size());
  std::vector<float> norms(stoch ? static_cast<size_t>(batch * n) : 0), av(need_av ? size_t(batch * n * dv) : 0);
  const int nt1 = resolve_threads(o.threads, items);
  parallel_for(items, nt1, [&](int64_t item, int) {
    const int64_t b = item / blocks, i0 = (item % blocks) * kBlockRows, nb = std::min(kBlockRows, n - i0);
    const float* ab = a + (b * n + i0) * n;
    if (stoch) {
      causal_gemm(kern, nb, i0, ab, n, w1.data, r, r, q.data() + (b * n + i0) * rq, rq);
      causal_gemm(kern, nb, i0, ab, n, w2.data, r, r, q.data() + (b * n + i0) * rq + r, rq);
      for (int64_t i = i0; i < i0 + nb; ++i) {
        float* sr = q.data() + (b * n + i) * rq + r;
        for (int64_t c = 0; c < r; ++c) sr[c] = elu1(sr[c]);
      }
    } else {
      causal_gemm(kern, nb, i0, ab, n, w1.data, r, r, q.data() + (b * n + i0) * r, r);
      causal_gemm(kern, nb, i0, ab, n, w2.data, r, r, k.data() + (b * n + i0) * r, r);
    }
    if (need_av && dv > 0) causal_gemm(kern, nb, i0, ab, n, v + b * n * dv, dv, dv, av.data() + (b * n + i0) * dv, dv);
  });
  const int ntb = resolve_threads(o.threads, batch);
  parallel_for(batch, ntb, [&](int64_t b, int) {
    const float* src = (stoch ? q.data() : k.data()) + b * n * rq;
    float* dst = kt.data() + b * n * rq;
    for (int64_t j = 0; j < n; ++j)
      for (int64_t c = 0; c < rq; ++c) dst[c * n + j] = src[j * rq + c];
    if (stoch)
      for (int64_t j = 0; j < n; ++j) {
        float s = 0;
        for (int64_t c = 0; c < rq; ++c) s += src[j * rq + c] * src[j * rq + c];
        norms[b * n + j] = s;
      }
  });
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(r)));
  const float g = static_cast<float>(o.gamma);
  const int nt2 = resolve_threads(o.threads, items);
  std::vector<float> scratch(static_cast<size_t>(nt2 * kBlockRows * n));
  parallel_for(items, nt2, [&](int64_t item, int t) {
    const int64_t b = item / blocks, i0 = (item % blocks) * kBlockRows, nb = std::min(kBlockRows, n - i0);
    const int64_t i1 = i0 + nb;
    float* s = scratch.data() + t * kBlockRows * n;  // (nb, i1)
    kern.gemm(nb, i1, rq, q.data() + (b * n + i0) * rq, rq, 1, kt.data() + b * n * rq, n, s, i1, false);
    for (int64_t ii = 0; ii < nb; ++ii) {
      const int64_t i = i0 + ii;
      float* row = s + ii * i1;
      if (stoch) {
        // -|x_i - x_j|^2 = 2 x_i.x_j - |x_j|^2 - |x_i|^2; the last term is the same for the whole
        // row and cancels in the softmax
        const float* nr = norms.data() + b * n;
        for (int64_t j = 0; j <= i; ++j) row[j] = 2.0f * row[j] - nr[j];
      } else {
        for (int64_t j = 0; j <= i; ++j) row[j] *= scale;
      }
      softmax_row<float, float>(row, i + 1);
    }
    float* ob = out + (b * n + i0) * dv;
    if (dv == 0) return;
    const float* vsrc = o.form == RefineForm::value_weighted ? av.data() + b * n * dv : v + b * n * dv;
    causal_gemm(kern, nb, i0, s, i1, vsrc, dv, dv, ob, dv);  // row i: keys j <= i only
    if (o.form == RefineForm::additive) {
      const float* avb = av.data() + (b * n + i0) * dv;
      for (int64_t e = 0; e < nb * dv; ++e) ob[e] = (1.0f - g) * avb[e] + g * ob[e];
    }
  });
}

template <class T>
void weights_impl(const T* a, int64_t batch, int64_t n, const MatrixRef<T>& w1, const MatrixRef<T>& w2, T* out,
                  const RefineOptions& o) {
  check("refined_weights", a, batch, n, 0, w1, w2, o);
  const int64_t r = w1.cols;
  const std::vector<double> d1(w1.data, w1.data + n * r), d2(w2.data, w2.data + n * r);
  std::vector<double> ad(static_cast<size_t>(n * n)), R(static_cast<size_t>(n * n));
  for (int64_t b = 0; b < batch; ++b) {
    std::copy(a + b * n * n, a + (b + 1) * n * n, ad.begin());
    reference_weights(ad.data(), n, d1.data(), d2.data(), r, o, R.data());
    for (int64_t e = 0; e < n * n; ++e) out[b * n * n + e] = static_cast<T>(R[e]);
  }
}

}  // namespace

namespace refinement {
template <class T>
void check_inputs(const char* where, const T* a, int64_t batch, int64_t n, int64_t dv, const MatrixRef<T>& w1,
                  const MatrixRef<T>& w2, const RefineOptions& o) {
  check(where, a, batch, n, dv, w1, w2, o);
}
template void check_inputs<float>(const char*, const float*, int64_t, int64_t, int64_t, const MatrixRef<float>&,
                                  const MatrixRef<float>&, const RefineOptions&);
template void check_inputs<double>(const char*, const double*, int64_t, int64_t, int64_t, const MatrixRef<double>&,
                                   const MatrixRef<double>&, const RefineOptions&);

void causal_gemm(const kernels::TileKernels& kern, int64_t nb, int64_t i0, const float* arows, int64_t lda,
                 const float* bm, int64_t ldb, int64_t ncols, float* c, int64_t ldc) {
  attn::causal_gemm(kern, nb, i0, arows, lda, bm, ldb, ncols, c, ldc);
}
}  // namespace refinement

std::string_view refine_form_name(RefineForm form) {
  switch (form) {
    case RefineForm::simple: return "simple";
    case RefineForm::value_weighted: return "value_weighted";
    case RefineForm::additive: return "additive";
    case RefineForm::stochastic: return "stochastic";
  }
  return "?";
}

RefineForm parse_refine_form(std::string_view text) {
  for (RefineForm f : {RefineForm::simple, RefineForm::value_weighted, RefineForm::additive, RefineForm::stochastic})
    if (text == refine_form_name(f)) return f;
  fail(kWhere, "form must be one of simple, value_weighted, additive, stochastic, got \"" + std::string(text) + "\"");
}

void refine_attention(const float* a, const float* v, int64_t batch, int64_t n, int64_t dv, MatrixRef<float> w1,
                      MatrixRef<float> w2, float* out, const RefineOptions& options) {
  check(kWhere, a, batch, n, dv, w1, w2, options);
  if (batch == 0) return;
  refine_fast(a, v, batch, n, dv, w1, w2, out, options);
}

void refine_attention(const double* a, const double* v, int64_t batch, int64_t n, int64_t dv,
                      MatrixRef<double> w1, MatrixRef<double> w2, double* out, const RefineOptions& options) {
  check(kWhere, a, batch, n, dv, w1, w2, options);
  std::vector<double> R(static_cast<size_t>(n * n));
  for (int64_t b = 0; b < batch; ++b) {
    reference_weights(a + b * n * n, n, w1.data, w2.data, w1.cols, options, R.data());
    for (int64_t i = 0; i < n; ++i)
      for (int64_t c = 0; c < dv; ++c) {
        double s = 0;
        for (int64_t j = 0; j <= i; ++j) s += R[i * n + j] * v[(b * n + j) * dv + c];  // R is causal
        out[(b * n + i) * dv + c] = s;
      }
  }
}

void refined_weights(const float* a, int64_t batch, int64_t n, MatrixRef<float> w1, MatrixRef<float> w2, float* out,
                     const RefineOptions& options) {
  weights_impl(a, batch, n, w1, w2, out, options);
}
void refined_weights(const double* a, int64_t batch, int64_t n, MatrixRef<double> w1, MatrixRef<double> w2,
                     double* out, const RefineOptions& options) {
  weights_impl(a, batch, n, w1, w2, out, options);
}

}  // namespace attn
