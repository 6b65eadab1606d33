// ggml's tensor encodings, decoded to float32 row by row: F32, F16, BF16 and the block-quantized
// Q4_0, Q4_1, Q8_0 (blocks of 32 values sharing a float16 scale d, and for Q4_1 a minimum m):
//   Q8_0 (34 bytes): d, 32 int8 q            x_i = q_i * d
//   Q4_0 (18 bytes): d, 16 bytes of nibbles  x_i = (nibble_i - 8) * d
//   Q4_1 (20 bytes): d, m, 16 bytes          x_i = nibble_i * d + m
// where byte j holds values j (low nibble) and j + 16 (high nibble) of its block. This is the
// plain reference the quantized kernels are checked against (and the --dtype f32 load path).
#pragma once
#include <cstdint>

namespace attn::model {

// Whether dequantize_row reads this ggml type.
bool can_dequantize(uint32_t ggml_type);
// dst[0..n) = the n values encoded at src (n a multiple of the type's block size).
void dequantize_row(uint32_t ggml_type, const uint8_t* src, int64_t n, float* dst);

}  // namespace attn::model
