// SANA's attention block pieces (Xie et al. 2024, NVlabs/Sana), on tokens (B, N, C)
// that lay out an H x W image row-major (N = H W, token n = y W + x):
//   lite_la     LiteLA: q, k, v = x W_qkv^T (no bias), heads of head_dim (32) channels, ReLU
//               linear attention, non-causal: o_i = sum_j (relu(q_i).relu(k_j)) v_j /
//               (sum_j relu(q_i).relu(k_j) + eps), eps = 1e-15, no 1/sqrt(d); then x W_proj^T + b.
//               The float form runs the library's `sana` mechanism (linear family, right product
//               relu(K)^T [V 1] once per head); a row with relu(q_i) = 0 gives 0, never NaN.
//   mix_ffn     Mix-FFN (GLUMBConv): u = silu(x W_in^T + b_in) (2h channels), u <- DWConv3x3(u) +
//               b_dw (groups 2h, zero padding 1), u = [a | g] by channels, y = (a * silu(g)) W_out^T
//               (no bias). h = floor(2.5 C) in SANA; any h here (the weights say).
//   sana_block  the two composed with pre-norm residuals (the pieces fix none; our choice, as
//               SANA's block without its timestep modulation and cross-attention):
//               y = x + lite_la(LN(x)); out = y + mix_ffn(LN(y)), LN over C without affine,
//               eps 1e-6 (SANA's norm1/norm2).
// Weights use torch's layouts (nn.Linear (out, in); 1x1 convs (out, in) with the trailing 1x1
// dropped; the depthwise kernel (2h, 9) = (2h, 1, 3, 3) flattened). float: products through the
// kernel table's gemm; double: the plain reference. Results do not depend on `threads`.
#pragma once
#include <cstdint>
#include <span>

#include "attn/output_softmax.hpp"  // MatrixRef

namespace attn {

template <class T>
struct LiteLaWeights {
  MatrixRef<T> qkv;           // (3C, C): the rows of q, then k, then v (channel c: head c / head_dim)
  MatrixRef<T> proj;          // (C, C)
  std::span<const T> proj_bias;  // C values, or empty for none
  int64_t head_dim = 32;      // must divide C
  double eps = 1e-15;
};

template <class T>
struct MixFfnWeights {
  MatrixRef<T> inverted;      // (2h, C)  inverted_conv 1x1
  std::span<const T> inverted_bias;  // 2h
  MatrixRef<T> depth;         // (2h, 9)  depthwise 3x3, taps row-major (ky, kx)
  std::span<const T> depth_bias;     // 2h
  MatrixRef<T> point;         // (C, h)   point_conv 1x1, no bias
};

// x, out: (batch, tokens, channels) row-major; out must not overlap x.
void lite_la(const float* x, int64_t batch, int64_t tokens, int64_t channels, const LiteLaWeights<float>& w,
             float* out, int threads = 0);
void lite_la(const double* x, int64_t batch, int64_t tokens, int64_t channels, const LiteLaWeights<double>& w,
             double* out, int threads = 0);

// tokens must equal height * width.
void mix_ffn(const float* x, int64_t batch, int64_t tokens, int64_t channels, int64_t height, int64_t width,
             const MixFfnWeights<float>& w, float* out, int threads = 0);
void mix_ffn(const double* x, int64_t batch, int64_t tokens, int64_t channels, int64_t height, int64_t width,
             const MixFfnWeights<double>& w, double* out, int threads = 0);

void sana_block(const float* x, int64_t batch, int64_t tokens, int64_t channels, int64_t height, int64_t width,
                const LiteLaWeights<float>& attention, const MixFfnWeights<float>& ffn, float* out,
                int threads = 0, double norm_eps = 1e-6);
void sana_block(const double* x, int64_t batch, int64_t tokens, int64_t channels, int64_t height, int64_t width,
                const LiteLaWeights<double>& attention, const MixFfnWeights<double>& ffn, double* out,
                int threads = 0, double norm_eps = 1e-6);

}  // namespace attn
