// 8-bit KV caches: rows of K or V rounded to int8 with one float32 scale per row, the storage
// attend() reads through AttendOptions::kv_scales (llama.cpp's q8_0 cache keeps a scale per 32
// values; one per row of head_dim values halves the scales' bytes and, at head_dim 64, loses
// little: docs/kv-cache.md#8-bit-rows).
//
//   scale = max_c |x_c| / 127,   q_c = round(x_c / scale)   (to nearest, ties to even; |q_c| <= 127)
//
// so |scale * q_c - x_c| <= scale / 2 (plus float32 rounding). A row of zeros has scale 0 and
// reads back as zeros; a row holding NaN or +-inf has scale NaN and zeros, so it reads back as
// NaN and a score or output that meets it is NaN (non-finite inputs propagate).
#pragma once
#include <cstdint>

#include "attn/tensor.hpp"

namespace attn {

// x (B, H, N, D) in a float dtype, any strides -> rows (B, H, N, D) int8 and scales (B, H, N, 1)
// float32, caller-owned views of those shapes (any strides). Checks everything before writing.
void quantize_rows(const TensorView& x, const TensorView& rows, const TensorView& scales);

struct QuantizedRows {
  Tensor rows;    // (B, H, N, D) int8, bhnd
  Tensor scales;  // (B, H, N, 1) float32
};
QuantizedRows quantize_rows(const TensorView& x);

// One row: n floats at x (unit stride) -> n int8 at q; returns the row's scale.
float quantize_row(const float* x, int64_t n, int8_t* q);

}  // namespace attn
