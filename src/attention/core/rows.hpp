// Rows of q, k or v as float, and a fixed-order dot product: what every family's fast forms read
// rows with (linear, GAU, efficient attention).
#pragma once
#include <algorithm>
#include <cstdint>

#include "attn/tensor.hpp"
#include "kernels/kernel_table.hpp"

namespace attn::core {

// dst[r * ld + c] = x[b, h, r0 + r, c] as float for r < n (rows r0 + r >= valid are zero: padded
// keys), c < x.dim().
inline void load_rows(const kernels::TileKernels& kern, const TensorView& x, int64_t b, int64_t h, int64_t r0,
                      int64_t n, int64_t valid, float* dst, int64_t ld) {
  const int64_t d = x.dim();
  for (int64_t r = 0; r < n; ++r) {
    float* row = dst + r * ld;
    if (r0 + r >= valid)
      std::fill(row, row + d, 0.0f);
    else
      kern.to_float(x.ptr(b, h, r0 + r), x.dtype, x.strides[3], d, row);
  }
}

// sum_i a[i] * b[i] in 16 interleaved partial sums (vectorisable; the order is fixed).
inline float dot(const float* a, const float* b, int64_t n) {
  float part[16] = {};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    for (int l = 0; l < 16; ++l) part[l] += a[i + l] * b[i + l];
  for (; i < n; ++i) part[i % 16] += a[i] * b[i];
  float sum = 0;
  for (float x : part) sum += x;
  return sum;
}

}  // namespace attn::core
