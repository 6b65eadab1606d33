// Rows of any ggml type attn decodes, written as Q8_0 blocks (34 bytes per 32 values: a float16
// d and 32 int8 q, x_i = q_i * d), the block type the integer kernels multiply fastest in place.
// The loader uses it for Q5_0, Q5_1, Q4_K, Q5_K and Q6_K when it does not pack them (packed, they
// are multiplied as stored: model/gguf_weights.cpp). Types whose
// values are a float16 times small integers convert exactly:
//   Q8_0  copied            Q4_0  q = nibble - 8        Q5_0  q = q5 - 16       (d kept)
// The others (Q4_1, Q5_1, the K-quants, F32/F16/BF16) have per-block offsets or finer scales that
// no single float16 d holds; they are decoded (ggml_blocks.hpp) and rounded as ggml rounds Q8_0:
//   amax = max |x| over the block, d = amax / 127, q = round-half-away(x * (1 / d)) (0 when d = 0),
//   d stored as float16
// so a value moves by at most about d / 2 (plus d's float16 rounding times |q| <= 127).
// A block holding a NaN or an infinity gets d = NaN: every value it stands for is NaN.
#pragma once
#include <cstdint>

namespace attn::model {

constexpr int64_t kQ8_0BlockBytes = 34;

// Whether to_q8_0_row keeps every value of this type exactly (Q8_0, Q4_0, Q5_0).
bool converts_exactly_to_q8_0(uint32_t ggml_type);

// dst = the n values at src (ggml type `ggml_type`, n a whole number of its blocks and of 32) as
// n / 32 Q8_0 blocks. An Error for a type dequantize_row does not read or a bad n.
void to_q8_0_row(uint32_t ggml_type, const uint8_t* src, int64_t n, uint8_t* dst);

}  // namespace attn::model
