// Integer dot products of block-quantized weight rows (ggml's Q4_0, Q4_1, Q8_0, Q5_0, Q5_1, Q4_K,
// Q5_K, Q6_K) with activations rounded to 8 bits per block of 32 values (for every type: the
// K-quants' 256 values are 8 such blocks, not ggml's Q8_K). Per block b of a row:
//   x ~ dx q_x (q_x int8 in [-127, 127], dx = max|x| / 127),  s = dx sum q_x,
//   Q8_0:  dw dx (q_w . q_x)      Q4_0: dw dx (n . q_x) - 8 dw s      Q4_1: dw dx (n . q_x) + m s
//   Q5_0:  dw dx (q5 . q_x) - 16 dw s                  Q5_1: dw dx (q5 . q_x) + m s
//   Q4_K:  (d dx) (s_j (n . q_x)) - (dmin m_j) s       (sub-block j's 6-bit scale s_j and min m_j;
//          Q5_K the same with the 5-bit q5 for n)
//   Q6_K:  (d dx) sum_h s_h (q6 . q_x,h - 32 sum q_x,h)  (h: the block's two 16-value groups)
// (n the 4-bit values 0..15, m Q4_1's minimum), the integer dots exact in int32, each block's term
// added in float32 in block order. Q5_0, Q5_1 and the K-quants are multiplied packed
// (q8_packed.hpp); in place (Q8DotRows) they take a plain C++ path. Variants by instruction (the
// one place that picks them is quant_kernels_for, quant_kernels.cpp): AVX-512 VNNI (vpdpbusd),
// AVX-VNNI (its VEX form), AVX2 (vpmaddubsw + vpmaddwd), and plain C++.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "attn/isa.hpp"
#include "quant/quant_kernels.hpp"
#include "quant/q8_packed.hpp"

namespace attn::kernels {

// One block of 32 activations rounded to 8 bits: x_i ~ d q_i, sum = sum_i q_i, s = d sum, low =
// the sum of q_0 .. q_15 (Q6_K's products take each half's sum apart; |sum| <= 32 * 127 fits 16 bits).
struct Q8Block {
  float d = 0, s = 0;
  int16_t sum = 0, low = 0;
  int8_t q[32] = {};
};
static_assert(sizeof(Q8Block) == 44);

// y[r * ldy + j] = x_r . W_j for r < R, j < n: x R rows of `blocks` Q8Blocks, W_j (at w[j]) a
// row of `blocks` ggml blocks of type q.
using Q8DotRows = void (*)(const Q8Block* x, int64_t R, int64_t blocks, const void* const* w, BlockQuant q, int64_t n,
                           float* y, int64_t ldy);

// y[r * ldy + j] = x_r . W_{16 g0 + j} for r < R, j < n: W a packed matrix (q8_packed.hpp), the
// same products as Q8DotRows on its ggml rows, rounded differently (block terms in vector lanes).
using Q8PackedRows = void (*)(const Q8Block* x, int64_t R, const PackedView& w, int64_t g0, int64_t n, float* y,
                              int64_t ldy);

// R rows of cols floats (cols a multiple of 32, row stride ld) into R * cols / 32 blocks: d =
// max|x| / 127 per block, q = x * (127 / max|x|) rounded to nearest even (0 where d is 0; a block
// whose max|x| is below 2^-100 is a zero block). A NaN or an infinity makes its block's d NaN, so
// every product with it is NaN. Plain C++, the oracle of the variants' vectorised forms (the same
// bits on every ISA).
void quantize_q8_rows(const float* x, int64_t R, int64_t cols, int64_t ld, Q8Block* out);

// The float64 value of one product the kernels compute (the exact integer dot, the block terms
// summed in double): the oracle of the tests. magnitude (if given): the sum of |d_w d_x q_w q_x|
// and of the offsets' |.|, the scale of a float32 evaluation's rounding error (SIMD lanes scale
// partial integer sums, which may cancel across lanes).
double q8_dot_reference(const Q8Block* x, int64_t blocks, const void* w, BlockQuant q, double* magnitude = nullptr);

// An integer-dot variant this CPU can run.
struct Q8DotVariant {
  const char* name;  // "avx512-vnni", "avx-vnni", "avx512", "avx2", "portable"
  Isa isa;           // the ISA level whose kernel table uses it when it is the best there
  Q8DotRows rows;
  Q8PackedRows packed;
  void (*quantize)(const float* x, int64_t R, int64_t cols, int64_t ld, Q8Block* out);  // quantize_q8_rows' bits
};
// Every variant this CPU can run, the best of each ISA level first (tests walk them all).
std::vector<Q8DotVariant> q8_dot_variants();

}  // namespace attn::kernels
