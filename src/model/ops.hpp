// The decoder's dense steps on float32 rows: products with weight matrices (through the kernel
// table, so every ISA path serves the model), RMSNorm and the activations.
#pragma once
#include <cmath>
#include <cstdint>
#include <vector>

#include "attn/isa.hpp"
#include "model/weights.hpp"

namespace attn::model {

// y[i][j] = sum_c x[i][c] * W[j][c] for i < n, j < W.rows; x (n, W.cols) and y (n, W.rows) packed.
// Work is split by blocks of W's rows, each summed in one fixed order: bitwise the same for any
// thread count.
void matmul(const float* x, int64_t n, const Matrix& w, float* y, int threads, Isa isa);
// dst[c] = W[r][c] for c < W.cols (an embedding lookup).
void matrix_row(const Matrix& w, int64_t r, float* dst, Isa isa);

// y[i] = x[i] / sqrt(mean(x^2) + eps) * weight, per row of `cols` values (n rows, stride ld).
void rms_norm(const float* x, int64_t n, int64_t cols, int64_t ld, const std::vector<float>& weight, double eps,
              float* y);

inline float silu(float x) { return x / (1.0f + std::exp(-x)); }
inline float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }

}  // namespace attn::model
