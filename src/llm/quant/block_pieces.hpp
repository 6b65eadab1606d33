// Any block-quantized row (BlockQuant) as 32-value pieces of small integers with float scales,
// the form every ggml type's values share: value i of a piece is
//   x_i = scale[i / 16] * v_i + offset
// (v an int8; scale[0] = scale[1] except for Q6_K, whose 16-value groups have their own).
//   Q8_0: v = q, scale d          Q4_0: v = n - 8, scale d         Q4_1: v = n, scale d, offset m
//   Q5_0: v = q5 - 16, scale d     Q5_1: v = q5, scale d, offset m
//   Q4_K, Q5_K: v = n (q5), scale d * s_j, offset -(dmin * m_j)  (sub-block j of the super-block)
//   Q6_K: v = q6 - 32, scale[h] d * s of its 16-value group
// Each product scale * v and each scale is exact in float32 (float16 times integers of at most 8
// bits), so scale * v + offset rounds once, as the plain decoding (ggml_blocks.cpp) does: the
// same bits. The plain C++ paths that multiply rows in place (q8_dot_rows, qdot_rows,
// dequantize_rows for the types decode multiplies packed) and the tests' float64 oracle read rows
// this way; the packed kernels (q8_packed.hpp) have their own layout.
#pragma once
#include <cstdint>

#include "quant/quant_kernels.hpp"

namespace attn::kernels {

struct QuantPiece {
  float scale[2] = {0, 0};
  float offset = 0;
  bool has_offset = false;  // Q4_1, Q5_1, Q4_K, Q5_K: x = scale * v + offset; otherwise x = scale * v (keeps -0)
  int8_t v[32] = {};
};

// Values per ggml block of q (32; 256 for the K-quants), that block's bytes, and the bytes of a
// row of cols values (cols a multiple of the block's values).
int64_t ggml_block_values(BlockQuant q);
int64_t ggml_block_bytes(BlockQuant q);
int64_t ggml_row_bytes(BlockQuant q, int64_t cols);

// Piece p (values 32 p .. 32 p + 31) of the ggml row at `row`.
void quant_piece(BlockQuant q, const uint8_t* row, int64_t p, QuantPiece& out);

}  // namespace attn::kernels
