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

// ---- training: gradients of lite_la and mix_ffn (sana_block's are their composition: python's
// attn.blocks.sana_block differentiates it through these two and torch's layer norm) ----
//
// Given dout = dL/dout (batch, tokens, channels), each backward writes the gradient of x and of
// every weight and bias, in the weights' layouts. Pointers must not be null (proj_bias: only when
// the weights have a bias) and must not overlap the inputs. float: the fast form (products by the
// kernel table's gemm, LiteLA's attention by the `sana` mechanism's backward; every element is
// summed by one task in a fixed order, the weights' gradients over all rows in row order, so the
// results are bitwise the same for any thread count); double: the plain reference (the forward
// written out, differentiated by hand). Checks as the forwards, naming the function.
//
// lite_la:  o_i = sum_j w_ij v_j / (z_i + eps), w_ij = relu(q_i).relu(k_j), z_i = sum_j w_ij:
//   d proj = dout^T o, d proj_bias = sum over rows of dout, do = dout proj,
//   dv_j = sum_i w_ij do_i / (z_i + eps), dw_ij = (do_i . (v_j - o_i)) / (z_i + eps),
//   dq_i = [q_i > 0] sum_j dw_ij relu(k_j), dk_j = [k_j > 0] sum_i dw_ij relu(q_i) (per head),
//   d qkv = dqkv^T x, dx = dqkv qkv (dqkv = [dq | dk | dv] by channels).
// mix_ffn:  the chain back through point, the gate a * silu(g), the depthwise conv (its
//   transpose: each tap's weight times the output it fed; zero padding), silu and inverted.
template <class T>
struct LiteLaGradients {
  T* x = nullptr;          // (batch, tokens, C)
  T* qkv = nullptr;        // (3C, C)
  T* proj = nullptr;       // (C, C)
  T* proj_bias = nullptr;  // C values (when the weights have a bias)
};

template <class T>
struct MixFfnGradients {
  T* x = nullptr;              // (batch, tokens, C)
  T* inverted = nullptr;       // (2h, C)
  T* inverted_bias = nullptr;  // 2h
  T* depth = nullptr;          // (2h, 9)
  T* depth_bias = nullptr;     // 2h
  T* point = nullptr;          // (C, h)
};

void lite_la_backward(const float* dout, const float* x, int64_t batch, int64_t tokens, int64_t channels,
                      const LiteLaWeights<float>& w, const LiteLaGradients<float>& grads, int threads = 0);
void lite_la_backward(const double* dout, const double* x, int64_t batch, int64_t tokens, int64_t channels,
                      const LiteLaWeights<double>& w, const LiteLaGradients<double>& grads, int threads = 0);

void mix_ffn_backward(const float* dout, const float* x, int64_t batch, int64_t tokens, int64_t channels,
                      int64_t height, int64_t width, const MixFfnWeights<float>& w, const MixFfnGradients<float>& grads,
                      int threads = 0);
void mix_ffn_backward(const double* dout, const double* x, int64_t batch, int64_t tokens, int64_t channels,
                      int64_t height, int64_t width, const MixFfnWeights<double>& w,
                      const MixFfnGradients<double>& grads, int threads = 0);

}  // namespace attn
