// The LLM's products with block-quantized weight rows, one set per instruction set, picked at run
// time in one place (quant_kernels_for) like the attention's tile kernels (kernels_for), whose
// vector types they share. Two kinds: float activations against rows dequantized in registers
// (qdot_rows), and activations rounded to 8 bits per block against the integer blocks (q8_*).
#pragma once
#include <cstdint>

#include "attn/isa.hpp"

namespace attn::kernels {

// Block-quantized weight rows (ggml's layouts, see quant/ggml_blocks.hpp): blocks of 32 values, or
// super-blocks of 256 for the K-quants (rows a multiple of 256). Q4_0, Q4_1 and Q8_0 are
// multiplied in place too; Q5_0, Q5_1, Q4_K, Q5_K and Q6_K are packed at load (q8_packed.hpp) and
// only the plain paths (quant/block_pieces.hpp) read them in place.
enum class BlockQuant : uint8_t { q4_0, q4_1, q8_0, q5_0, q5_1, q4_k, q5_k, q6_k };
// 32 activations rounded to 8 bits (quant/q8_dot.hpp).
struct Q8Block;
// A block-quantized matrix packed in 16-row groups (quant/q8_packed.hpp).
struct PackedView;

struct QuantKernels {
  Isa isa;
  // y[r * ldy + j] = sum_c x[r * cols + c] * W_j[c] for r < R, j < n, where W_j (row j of a
  // block-quantized matrix, at w[j]) is dequantized in registers; cols a whole number of blocks,
  // blocks summed in order. Q5_0, Q5_1 and the K-quants: decoded piece by piece (block_pieces.hpp) first.
  void (*qdot_rows)(const float* x, int64_t R, int64_t cols, const void* const* w, BlockQuant q, int64_t n, float* y,
                    int64_t ldy);
  // dst[j * ldd + c] = W_j[c] for j < n, c < cols (the same values qdot_rows multiplies with).
  void (*dequantize_rows)(const void* const* rows, BlockQuant q, int64_t n, int64_t cols, float* dst, int64_t ldd);
  // y[r * ldy + j] = x_r . W_j as qdot_rows, with x rounded to 8-bit blocks (quantize_q8_rows) and
  // integer dot products (quant/q8_dot.hpp): the best variant of this ISA level on this CPU
  // (AVX-512 VNNI over AVX-512, AVX-VNNI over AVX2), set by quant_kernels_for; q8_dot_name names it.
  void (*q8_dot_rows)(const Q8Block* x, int64_t R, int64_t blocks, const void* const* w, BlockQuant q, int64_t n,
                      float* y, int64_t ldy);
  const char* q8_dot_name;
  // The same with W packed in 16-row groups (q8_packed.hpp): y[r * ldy + j] = x_r . W_{16 g0 + j}
  // for j < n. The same variant as q8_dot_rows.
  void (*q8_packed_rows)(const Q8Block* x, int64_t R, const PackedView& w, int64_t g0, int64_t n, float* y,
                         int64_t ldy);
  // quantize_q8_rows (quant/q8_dot.hpp), vectorised where the variant can: the same bits.
  void (*quantize_q8_rows)(const float* x, int64_t R, int64_t cols, int64_t ld, Q8Block* out);
};

// The quant kernel set for `isa` (throws Error if this CPU cannot run it).
const QuantKernels& quant_kernels_for(Isa isa);

}  // namespace attn::kernels
