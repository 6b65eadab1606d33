// Internals of SANA's pieces (src/sana/): SiLU and the float64 references (sana_reference.cpp).
#pragma once
#include <cmath>
#include <cstdint>

#include <span>
#include <vector>

#include "attn/sana.hpp"
#include "attn/tensor.hpp"
#include "kernels/kernel_table.hpp"

namespace attn::sana {

template <class T>
T silu(T x) {
  return x / (T(1) + std::exp(-x));
}

// d silu / dx = s (1 + x (1 - s)), s = sigmoid(x)
template <class T>
T silu_grad(T x) {
  const T s = T(1) / (T(1) + std::exp(-x));
  return s * (T(1) + x * (T(1) - s));
}

// attn/sana.hpp's formulas, sums in double; x and out (batch, tokens, C), weights checked.
void lite_la_reference(const double* x, int64_t batch, int64_t tokens, int64_t C, const LiteLaWeights<double>& w,
                       double* out);
// h: the hidden width (w.inverted has 2h rows); tokens = H * W.
void mix_ffn_reference(const double* x, int64_t batch, int64_t tokens, int64_t C, int64_t H, int64_t W, int64_t h,
                       const MixFfnWeights<double>& w, double* out);

// The forwards' checks (sana.cpp), `where` naming the function: x's sizes, threads, the weights.
template <class T>
void check_lite_la_inputs(const char* where, int64_t batch, int64_t tokens, int64_t C, int threads,
                          const LiteLaWeights<T>& w);
// returns the hidden width h
template <class T>
int64_t check_mix_ffn_inputs(const char* where, int64_t batch, int64_t tokens, int64_t C, int64_t H, int64_t W,
                             int threads, const MixFfnWeights<T>& w);

// The (batch, heads, tokens, hd) float32 view of rows `row_stride` floats apart starting at base:
// head h owns channels [h hd, (h + 1) hd) of each row (LiteLA's q, k, v in the (B, N, 3C) rows,
// its output in (B, N, C)).
inline TensorView head_view(const float* base, int64_t batch, int64_t heads, int64_t tokens, int64_t hd,
                            int64_t row_stride) {
  TensorView t;
  t.data = const_cast<float*>(base);
  t.dtype = DType::f32;
  t.shape = {batch, heads, tokens, hd};
  t.strides = {tokens * row_stride, hd, row_stride, 1};
  return t;
}

// a (rows, cols) transposed to (cols, rows), row-major (sana.cpp)
std::vector<float> transposed_float(const MatrixRef<float>& a);
// out rows = x rows (rows, in) times wt (in, outc) plus bias (empty: none), in blocks of rows
// through the kernel table's gemm, parallel (sana.cpp)
void linear_rows(const kernels::TileKernels& kern, const float* x, int64_t rows, int64_t in, const float* wt,
                 int64_t outc, std::span<const float> bias, float* out, int threads);

// The backwards written plainly in T (sana_backward_reference.cpp): T = double is the reference,
// T = float the plain float32 implementation the tests measure the fast forms against. Every
// gradient is set (proj_bias when the weights have one).
template <class T>
void lite_la_backward_plain(const T* dout, const T* x, int64_t batch, int64_t tokens, int64_t C,
                            const LiteLaWeights<T>& w, const LiteLaGradients<T>& g);
template <class T>
void mix_ffn_backward_plain(const T* dout, const T* x, int64_t batch, int64_t tokens, int64_t C, int64_t H, int64_t W,
                            int64_t h, const MixFfnWeights<T>& w, const MixFfnGradients<T>& g);

}  // namespace attn::sana
