// ggml's tensor encodings, decoded to float32 row by row: F32, F16, BF16 and the block-quantized
// types below. Scales (d, dmin) and minimums (m) are float16; q are unsigned integers unless said.
//
// Blocks of 32 values; byte j of the 16 nibble bytes holds values j (low nibble) and j + 16 (high):
//   Q8_0 (34 bytes): d, 32 int8 q                    x_i = q_i * d
//   Q4_0 (18 bytes): d, 16 nibble bytes              x_i = (nibble_i - 8) * d
//   Q4_1 (20 bytes): d, m, 16 nibble bytes           x_i = nibble_i * d + m
//   Q5_0 (22 bytes): d, qh (4 bytes), 16 nibbles     x_i = (q_i - 16) * d
//   Q5_1 (24 bytes): d, m, qh (4 bytes), 16 nibbles  x_i = q_i * d + m
// where for Q5 the 5-bit q_i = nibble_i + 16 * (bit i of qh read as a little-endian uint32).
//
// K-quants: super-blocks of 256 values.
//   Q4_K (144 bytes): d, dmin, 12 scale bytes, 128 nibble bytes. Eight sub-blocks of 32 values,
//     each with a 6-bit scale s_j and a 6-bit min m_j:   x = (d * s_j) * q - dmin * m_j
//     Sub-blocks 2k and 2k + 1 share nibble bytes 32k .. 32k + 31: value l of sub-block 2k is the
//     low nibble of byte 32k + l, value l of sub-block 2k + 1 its high nibble.
//     The 12 scale bytes b hold the sixteen 6-bit numbers: for j < 4, s_j = b[j] & 63 and
//     m_j = b[j + 4] & 63; for j >= 4, the low four bits of s_j are b[j + 4] & 15 and those of m_j
//     are b[j + 4] >> 4, and their top two bits are the top two bits of b[j - 4] (for s_j) and of
//     b[j] (for m_j).
//   Q5_K (176 bytes): d, dmin, 12 scale bytes (as Q4_K), 32 bytes qh, 128 nibble bytes (as Q4_K).
//     q = nibble + 16 * (bit j of qh[l]) for value l of sub-block j; x as Q4_K.
//   Q6_K (210 bytes): 128 bytes ql, 64 bytes qh, 16 int8 scales s, then d (at byte 208).
//     Sixteen groups of 16 values; value i is in group i / 16:  x_i = (d * s_{i/16}) * (q_i - 32)
//     The 6-bit q_i: the two halves h = i / 128 of the block use ql[64h ..] and qh[32h ..]; with
//     r = i % 128, its low four bits are nibble r / 64 (0 low, 1 high) of ql[64h + r % 64], its
//     top two bits are bits 2 * (r / 32) and 2 * (r / 32) + 1 of qh[32h + r % 32].
//
// Every product above is exact in float32 (a float16 times small integers); a formula with a sum
// rounds once there, so these decodings are the correctly rounded values. This is the plain
// reference the quantized kernels are checked against (and the --dtype f32 load path).
#pragma once
#include <cstdint>

namespace attn::model {

// Whether dequantize_row reads this ggml type.
bool can_dequantize(uint32_t ggml_type);
// dst[0..n) = the n values encoded at src. n must be a whole number of the type's blocks (an Error
// otherwise). A float16 scale that is inf or NaN gives inf or NaN values as IEEE arithmetic does
// (inf * 0 = NaN): nothing is clamped.
void dequantize_row(uint32_t ggml_type, const uint8_t* src, int64_t n, float* dst);

}  // namespace attn::model
