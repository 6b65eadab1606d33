// Internals of attention-weight refinement (src/refinement/): the row helpers both forms use and
// the float64 reference (refinement_reference.cpp).
#pragma once
#include <cmath>
#include <cstdint>
#include <limits>

#include "attn/refinement.hpp"
#include "kernels/kernel_table.hpp"

namespace attn::refinement {

// Softmax over x[0..n) in place. A NaN or an infinite maximum makes the row NaN (non-finite
// inputs propagate); the diagonal key is always allowed, so a row is never empty.
template <class T, class Acc>
void softmax_row(T* x, int64_t n) {
  Acc m = -std::numeric_limits<Acc>::infinity();
  bool nan = false;
  for (int64_t j = 0; j < n; ++j) {
    const Acc v = static_cast<Acc>(x[j]);
    nan |= std::isnan(v);
    m = v > m ? v : m;
  }
  if (nan || m == std::numeric_limits<Acc>::infinity() || m == -std::numeric_limits<Acc>::infinity()) {
    // +inf scores or NaN: no meaningful distribution; NaN propagates
    for (int64_t j = 0; j < n; ++j) x[j] = std::numeric_limits<T>::quiet_NaN();
    return;
  }
  Acc sum = 0;
  for (int64_t j = 0; j < n; ++j) {
    const Acc e = std::exp(static_cast<Acc>(x[j]) - m);
    x[j] = static_cast<T>(e);
    sum += e;
  }
  const Acc inv = Acc(1) / sum;
  for (int64_t j = 0; j < n; ++j) x[j] = static_cast<T>(static_cast<Acc>(x[j]) * inv);
}

template <class T>
T elu1(T x) {
  return x > 0 ? x + T(1) : std::exp(x);  // elu(x) + 1; NaN stays NaN
}

// R (n, n) of one batch entry: the refined weights of the form, every matrix written out, sums in
// double (a (n, n), w1 and w2 (n, r)).
void reference_weights(const double* a, int64_t n, const double* w1, const double* w2, int64_t r,
                       const RefineOptions& o, double* R);

// refine_attention's checks (refinement.cpp): `where` names the function in the messages.
template <class T>
void check_inputs(const char* where, const T* a, int64_t batch, int64_t n, int64_t dv, const MatrixRef<T>& w1,
                  const MatrixRef<T>& w2, const RefineOptions& o);

// C rows = the causal rows i0 .. i0 + nb - 1 of a times B, each row summing over p <= i in order
// (refinement.cpp; the float form's product, used by its backward too).
void causal_gemm(const kernels::TileKernels& kern, int64_t nb, int64_t i0, const float* arows, int64_t lda,
                 const float* bm, int64_t ldb, int64_t ncols, float* c, int64_t ldc);

// The backward's formulas (attn/refinement.hpp) written plainly in T, every matrix out
// (refinement_backward_reference.cpp): T = double is the reference; T = float is the plain float32
// implementation the tests measure the fast form's error against. Inputs checked; outputs set.
template <class T>
void backward_plain(const T* dout, const T* a, const T* v, int64_t batch, int64_t n, int64_t dv, const T* w1,
                    const T* w2, int64_t r, const RefineOptions& o, T* grad_a, T* grad_v, T* grad_w1, T* grad_w2);

}  // namespace attn::refinement
