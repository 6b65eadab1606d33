// Block-quantized matrices (ggml's Q4_0, Q4_1, Q8_0) repacked once, at load, for decode's
// integer dot products: 16 weight rows side by side, so that one instruction multiplies the same
// 4 activation bytes (broadcast) with 4 bytes of each of the 16 rows and keeps 16 per-row sums.
// The per-row layout (q8_dot.hpp) needs a horizontal sum and a scalar scale per block and row;
// this one needs neither: about a sixth of the instructions per weight byte.
//
// Layout, per group of 16 rows (the last group padded with zero rows), `blocks` = cols / 32:
//   header (a multiple of 64 bytes):
//     scales   blocks x 16 float16: the 16 rows' d of block b at 32 b
//     minimums blocks x 16 float16 (Q4_1 only): the 16 rows' m of block b at 32 (blocks + b)
//   values, block b at header + b * value_bytes, in steps of 64 bytes; step t holds 4 bytes per
//   row (row i at 4 i):
//     Q4_0, Q4_1 (4 steps): bytes 4t .. 4t+3 of the row's ggml block: low nibbles are values
//       4t .. 4t+3, high nibbles values 16+4t .. 16+4t+3
//     Q8_0 (8 steps): values 4t .. 4t+3 plus 128, as unsigned bytes
// A group is the same size as its 16 ggml rows, plus the header's padding.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "quant/quant_kernels.hpp"

namespace attn::kernels {

constexpr int64_t kPackedRows = 16;

// Where a packed matrix's groups are (what the kernels read).
struct PackedView {
  const uint8_t* data = nullptr;  // group g at data + g * group_bytes (64-byte aligned)
  BlockQuant q = BlockQuant::q4_0;
  int64_t blocks = 0, header_bytes = 0, group_bytes = 0;
};

// A packed copy of a block-quantized matrix, in memory of its own.
class PackedMatrix {
 public:
  // rows[r] (r < n_rows): the ggml row r of cols values (cols a multiple of 32).
  PackedMatrix(const void* const* rows, BlockQuant q, int64_t n_rows, int64_t cols);
  const PackedView& view() const { return view_; }
  int64_t rows() const { return rows_; }
  int64_t cols() const { return view_.blocks * 32; }
  int64_t bytes() const { return groups() * view_.group_bytes; }
  int64_t groups() const { return (rows_ + kPackedRows - 1) / kPackedRows; }
  // Rows r0 .. r0+n-1 as ggml rows again, row_bytes apart at out (bit for bit what was packed).
  void ggml_rows(int64_t r0, int64_t n, uint8_t* out, int64_t row_bytes) const;

 private:
  struct Free {
    void operator()(uint8_t* p) const;
  };
  PackedView view_;
  int64_t rows_ = 0;
  std::unique_ptr<uint8_t, Free> data_;
};

// Bytes of one ggml block of 32 values.
int64_t ggml_block_bytes(BlockQuant q);

}  // namespace attn::kernels
