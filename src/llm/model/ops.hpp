// The decoder's dense steps on float32 rows: products with weight matrices (through the kernel
// table, so every ISA path serves the model), RMSNorm and the activations.
#pragma once
#include <cmath>
#include <cstdint>
#include <vector>

#include "attn/isa.hpp"
#include "model/weights.hpp"

namespace attn::model {

// How a product with block-quantized weights multiplies. f32: float inputs against the weights
// dequantized (in registers for decode-sized products, fewer than 16 input rows; into float
// panels for prompts); q8: the inputs rounded to 8-bit blocks of 32 and integer dot products on
// the packed (or in-place) blocks (quant/q8_dot.hpp), as llama.cpp's decode does, for every
// product; q8_decode: q8 for decode-sized products, float panels for prompts.
enum class Activations { f32, q8, q8_decode };
// Input rows from which a product is prompt-sized (fewer: a decode step's).
constexpr int64_t kPromptRows = 16;

// y[i][j] = sum_c x[i][c] * W[j][c] for i < n, j < W.rows; x (n, W.cols) and y (n, W.rows) packed.
// Work is split by blocks of W's rows, each summed in one fixed order: bitwise the same for any
// thread count. `activations` applies to quantized W (float W: the float path).
// row_wise: every product takes the decode path whatever n is, so that each output row is the
// same bits whatever other rows the call holds (a serving step's sequences; slower for prompts
// of float matrices).
void matmul(const float* x, int64_t n, const Matrix& w, float* y, int threads, Isa isa,
            Activations activations = Activations::f32, bool row_wise = false);
// y_p = x W_p^T for every product p (each W_p with x's cols): matmul for each, but decode-sized
// products (n < 16) share one parallel region and, for q8 activations, one rounding of x. Each
// output row is summed as matmul sums it: the same bits.
struct Product {
  const Matrix* w;
  float* y;
};
void matmul_many(const float* x, int64_t n, const std::vector<Product>& products, int threads, Isa isa,
                 Activations activations = Activations::f32, bool row_wise = false);
// dst[c] = W[r][c] for c < W.cols (an embedding lookup).
void matrix_row(const Matrix& w, int64_t r, float* dst, Isa isa);

// y[i] = x[i] / sqrt(mean(x^2) + eps) * weight, per row of `cols` values (n rows, stride ld);
// rows split over `threads` (each row summed alone: the same bits for any count).
void rms_norm(const float* x, int64_t n, int64_t cols, int64_t ld, const std::vector<float>& weight, double eps,
              float* y, int threads = 1);

inline float silu(float x) { return x / (1.0f + std::exp(-x)); }
inline float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }

// A gated feed-forward's activation: SwiGLU's silu or GeGLU's tanh form of GELU.
enum class GateActivation { silu, gelu_tanh };
// gate[i] = act(gate[i]) * up[i] over `rows` rows of `width` values, vectorised (the kernel
// table's silu_gate and gelu_tanh_gate) one row at a time (a row's vector body and scalar tail
// fall on the same values whatever rows surround it: the same bits alone or in a batch), rows
// split over threads in groups of a fixed size (the same bits for any thread count).
void gated_activation(GateActivation act, float* gate, const float* up, int64_t rows, int64_t width, int threads,
                      Isa isa);

}  // namespace attn::model
