// Block-quantized matrices (ggml's Q4_0, Q4_1, Q8_0, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K) repacked once,
// at load, for decode's integer dot products: 16 weight rows side by side, so that one instruction
// multiplies the same 4 activation bytes (broadcast) with 4 bytes of each of the 16 rows and keeps
// 16 per-row sums. The per-row layout (q8_dot.hpp) needs a horizontal sum and a scalar scale per
// block and row; this one needs neither: about a sixth of the instructions per weight byte.
//
// Layout, per group of 16 rows (the last group padded with zero rows); "lanes" are 16 entries, row
// i's at i; a "step" is 64 bytes holding 4 bytes per row (row i at 4 i).
// Q4_0, Q4_1, Q8_0, Q5_0, Q5_1: blocks of 32 values, `blocks` = cols / 32.
//   header (a multiple of 64 bytes):
//     scales   blocks x 16 float16: the 16 rows' d of block b at 32 b
//     minimums blocks x 16 float16 (Q4_1, Q5_1): the 16 rows' m of block b at 32 (blocks + b)
//   values, block b at header + b * value_bytes, in steps; step t holds:
//     Q4_0, Q4_1, Q5_0, Q5_1 (steps 0 .. 3): bytes 4t .. 4t+3 of the row's ggml nibble bytes:
//       low nibbles are values 4t .. 4t+3, high nibbles values 16+4t .. 16+4t+3
//     Q5_0, Q5_1 step 4: the values' fifth bits, byte k of a row holding in bit t value 4t+k's
//       and in bit 4+t value 16+4t+k's (so step t's bits are one shift and mask away)
//     Q8_0 (8 steps): values 4t .. 4t+3 plus 128, as unsigned bytes
// Q4_K, Q5_K, Q6_K: one unit per super-block of 256 values (cols / 256 of them, no header):
//   Q4_K (packed_q4_k): lanes of float16 d at 0 and dmin at 32; the 6-bit sub-block scales s_j and
//     mins m_j unpacked to bytes, lanes of s_j at 64 + 16 j and of m_j at 192 + 16 j; values at
//     320, sub-blocks 2k and 2k+1 in 8 steps at 320 + 512 k: step t holds bytes 4t .. 4t+3 of the
//     ggml nibble bytes 32k .. 32k+31 (low nibbles sub-block 2k, high nibbles 2k+1).
//   Q5_K (packed_q5_k): as Q4_K with 10 steps per pair, at 320 + 640 k: steps 8 and 9 the fifth
//     bits of sub-blocks 2k and 2k+1, byte k' of a row holding in bit t value 4t+k''s.
//   Q6_K (packed_q6_k): lanes of float16 d at 0 (32 bytes of zeros after); the 16 int8 group
//     scales, lanes of scale g at 64 + 16 g; values of sub-block b (32 values) in 6 steps at 320 + 384 b:
//     steps 0 .. 3 the low four bits as Q4_0's nibbles, steps 4 and 5 the top two bits of values
//     0 .. 15 and 16 .. 31: byte k of a row holding in bits 2t, 2t+1 those of value 4t+k (+16).
// Bytes per 16 rows and 256 values against ggml's 16 x (cols / 256) blocks: Q4_0, Q4_1, Q8_0, Q5_0
// and Q5_1 the same (plus the header's padding), Q4_K 2368 vs 2304 and Q5_K 2880 vs 2816 (the
// scales as bytes), Q6_K 3392 vs 3360 (d's lanes padded to 64 bytes).
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "quant/block_pieces.hpp"
#include "quant/quant_kernels.hpp"

namespace attn::kernels {

constexpr int64_t kPackedRows = 16;

// Where the parts of a K-quant unit are (bytes from its start) and its size.
struct packed_q4_k {
  static constexpr int64_t d = 0, dmin = 32, scales = 64, mins = 192, values = 320, pair = 512, unit = 2368;
};
struct packed_q5_k : packed_q4_k {
  static constexpr int64_t pair = 640, unit = 2880;
};
struct packed_q6_k {
  static constexpr int64_t d = 0, scales = 64, values = 320, block = 384, unit = 3392;
};

// Where a packed matrix's groups are (what the kernels read).
struct PackedView {
  const uint8_t* data = nullptr;  // group g at data + g * group_bytes (64-byte aligned)
  BlockQuant q = BlockQuant::q4_0;
  int64_t blocks = 0, header_bytes = 0, group_bytes = 0;  // blocks of 32 values
};

// A packed copy of a block-quantized matrix, in memory of its own.
class PackedMatrix {
 public:
  // rows[r] (r < n_rows): the ggml row r of cols values (cols a whole number of q's blocks).
  PackedMatrix(const void* const* rows, BlockQuant q, int64_t n_rows, int64_t cols);
  const PackedView& view() const { return view_; }
  int64_t rows() const { return rows_; }
  int64_t cols() const { return view_.blocks * 32; }
  int64_t bytes() const { return groups() * view_.group_bytes; }
  int64_t groups() const { return (rows_ + kPackedRows - 1) / kPackedRows; }
  // Rows r0 .. r0+n-1 as ggml rows again, row_bytes apart at out (bit for bit what was packed).
  void ggml_rows(int64_t r0, int64_t n, uint8_t* out, int64_t row_bytes) const;
  // Rows r0 .. r0+n-1 as float32, ldd apart at dst: the plain decoding of the ggml rows
  // (ggml_blocks.hpp) bit for bit, read straight from the groups (packed_floats.cpp).
  void float_rows(int64_t r0, int64_t n, float* dst, int64_t ldd) const;

 private:
  struct Free {
    void operator()(uint8_t* p) const;
  };
  PackedView view_;
  int64_t rows_ = 0;
  std::unique_ptr<uint8_t, Free> data_;
};

}  // namespace attn::kernels
