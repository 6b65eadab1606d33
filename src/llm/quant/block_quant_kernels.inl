// Products with block-quantized weight rows (ggml's Q4_0, Q4_1, Q8_0: blocks of 32 values with a
// float16 scale, see quant/ggml_blocks.hpp for the layouts), dequantized in registers: a block is
// read once, turned into 32 floats (value = q*d, (q-8)*d or q*d+m) and multiplied with up to four
// input rows. Q5_0, Q5_1 and the K-quants (which decode multiplies packed; here only when activations
// stay float, on rows rebuilt from the packing) go through their plain pieces (block_pieces.hpp)
// first, 32 values at a time. Included by quant_kernels_isa.cpp, inside an ISA namespace.

constexpr int kQuantBlock = 32;
// How far ahead of the block being multiplied its row is prefetched (rows are read once per
// product, from memory: the hardware prefetcher alone leaves the kernel waiting).
constexpr int64_t kQuantPrefetchBytes = 4096;

template <BlockQuant Q>
constexpr bool read_in_pieces() {
  return Q != BlockQuant::q4_0 && Q != BlockQuant::q4_1 && Q != BlockQuant::q8_0;
}

// Where in a row the block holding value c starts.
template <BlockQuant Q>
constexpr int64_t block_offset(int64_t c) {
  switch (Q) {
    case BlockQuant::q4_0: return c / 32 * 18;
    case BlockQuant::q4_1: return c / 32 * 20;
    case BlockQuant::q8_0: return c / 32 * 34;
    case BlockQuant::q5_0: return c / 32 * 22;
    case BlockQuant::q5_1: return c / 32 * 24;
    case BlockQuant::q4_k: return c / 256 * 144;
    case BlockQuant::q5_k: return c / 256 * 176;
    case BlockQuant::q6_k: return c / 256 * 210;
  }
  return 0;
}

// The 32 values of block `b`: w[t] holds values t*W .. t*W + W - 1. Byte j of a 4-bit block holds
// value j in its low nibble and value j + 16 in its high nibble.
template <BlockQuant Q>
inline void dequantize_block(const uint8_t* b, Vec* w) {
  constexpr int P = kQuantBlock / Vec::W, H = P / 2;
  const Vec d = Vec::set1_half(b);
  if constexpr (Q == BlockQuant::q8_0) {
    for (int t = 0; t < P; ++t) w[t] = Vec::from_i8(reinterpret_cast<const int8_t*>(b + 2) + t * Vec::W) * d;
  } else if constexpr (Q == BlockQuant::q4_0) {
    const Vec eight = Vec::set1(8.0f);
    for (int t = 0; t < H; ++t) {
      w[t] = (Vec::template nibbles<0>(b + 2 + t * Vec::W) - eight) * d;
      w[t + H] = (Vec::template nibbles<4>(b + 2 + t * Vec::W) - eight) * d;
    }
  } else {
    const Vec m = Vec::set1_half(b + 2);
    for (int t = 0; t < H; ++t) {
      w[t] = Vec::fma(Vec::template nibbles<0>(b + 4 + t * Vec::W), d, m);
      w[t + H] = Vec::fma(Vec::template nibbles<4>(b + 4 + t * Vec::W), d, m);
    }
  }
}

// Values 32 p .. 32 p + 31 of the row at `row` (w as dequantize_block's).
template <BlockQuant Q>
inline void dequantize_piece(const uint8_t* row, int64_t p, Vec* w) {
  if constexpr (read_in_pieces<Q>()) {
    QuantPiece piece;
    quant_piece(Q, row, p, piece);
    for (int t = 0; t < kQuantBlock / Vec::W; ++t) {  // scale * v exact, + offset rounds once
      w[t] = Vec::from_i8(piece.v + t * Vec::W) * Vec::set1(piece.scale[t * Vec::W / 16]);
      if (piece.has_offset) w[t] = w[t] + Vec::set1(piece.offset);
    }
  } else {
    dequantize_block<Q>(row + block_offset<Q>(32 * p), w);
  }
}

// out[r * ldo + j] = x_r . W_j for r < NR, j < NJ (NR * NJ accumulator chains; blocks in order).
template <BlockQuant Q, int NR, int NJ>
inline void qdot_tile(const float* x, int64_t cols, const void* const* w, float* out, int64_t ldo) {
  constexpr int P = kQuantBlock / Vec::W;
  Vec acc[NR][NJ];
  for (int r = 0; r < NR; ++r)
    for (int j = 0; j < NJ; ++j) acc[r][j] = Vec::zero();
  const uint8_t* wb[NJ];
  for (int j = 0; j < NJ; ++j) wb[j] = static_cast<const uint8_t*>(w[j]);
  for (int64_t c = 0; c < cols; c += kQuantBlock) {
    const int64_t off = block_offset<Q>(c);
    for (int j = 0; j < NJ; ++j) {
      __builtin_prefetch(wb[j] + off + kQuantPrefetchBytes);  // weights stream from memory once
      Vec wv[P];
      dequantize_piece<Q>(wb[j], c / kQuantBlock, wv);
      for (int r = 0; r < NR; ++r)
        for (int t = 0; t < P; ++t) acc[r][j] = Vec::fma(Vec::loadu(x + r * cols + c + t * Vec::W), wv[t], acc[r][j]);
    }
  }
  for (int r = 0; r < NR; ++r)
    for (int j = 0; j < NJ; ++j) out[r * ldo + j] = acc[r][j].reduce_add();
}

// Weight rows in groups of NJ (then one by one), for NR input rows.
template <BlockQuant Q, int NR>
inline void qdot_rows_of(const float* x, int64_t cols, const void* const* w, int64_t n, float* y, int64_t ldy) {
  constexpr int NJ = NR <= 2 ? 4 : 2;
  int64_t j = 0;
  for (; j + NJ <= n; j += NJ) qdot_tile<Q, NR, NJ>(x, cols, w + j, y + j, ldy);
  for (; j < n; ++j) qdot_tile<Q, NR, 1>(x, cols, w + j, y + j, ldy);
}

template <BlockQuant Q>
void qdot_rows_t(const float* x, int64_t R, int64_t cols, const void* const* w, int64_t n, float* y, int64_t ldy) {
  int64_t r = 0;
  for (; r + 4 <= R; r += 4) qdot_rows_of<Q, 4>(x + r * cols, cols, w, n, y + r * ldy, ldy);
  switch (R - r) {
    case 3: return qdot_rows_of<Q, 3>(x + r * cols, cols, w, n, y + r * ldy, ldy);
    case 2: return qdot_rows_of<Q, 2>(x + r * cols, cols, w, n, y + r * ldy, ldy);
    case 1: return qdot_rows_of<Q, 1>(x + r * cols, cols, w, n, y + r * ldy, ldy);
    default: return;
  }
}

void qdot_rows(const float* x, int64_t R, int64_t cols, const void* const* w, BlockQuant q, int64_t n, float* y,
               int64_t ldy) {
  switch (q) {
    case BlockQuant::q4_0: return qdot_rows_t<BlockQuant::q4_0>(x, R, cols, w, n, y, ldy);
    case BlockQuant::q4_1: return qdot_rows_t<BlockQuant::q4_1>(x, R, cols, w, n, y, ldy);
    case BlockQuant::q8_0: return qdot_rows_t<BlockQuant::q8_0>(x, R, cols, w, n, y, ldy);
    case BlockQuant::q5_0: return qdot_rows_t<BlockQuant::q5_0>(x, R, cols, w, n, y, ldy);
    case BlockQuant::q5_1: return qdot_rows_t<BlockQuant::q5_1>(x, R, cols, w, n, y, ldy);
    case BlockQuant::q4_k: return qdot_rows_t<BlockQuant::q4_k>(x, R, cols, w, n, y, ldy);
    case BlockQuant::q5_k: return qdot_rows_t<BlockQuant::q5_k>(x, R, cols, w, n, y, ldy);
    case BlockQuant::q6_k: return qdot_rows_t<BlockQuant::q6_k>(x, R, cols, w, n, y, ldy);
  }
}

template <BlockQuant Q>
void dequantize_rows_t(const void* const* rows, int64_t n, int64_t cols, float* dst, int64_t ldd) {
  constexpr int P = kQuantBlock / Vec::W;
  for (int64_t j = 0; j < n; ++j) {
    const uint8_t* row = static_cast<const uint8_t*>(rows[j]);
    for (int64_t c = 0; c < cols; c += kQuantBlock) {
      Vec wv[P];
      dequantize_piece<Q>(row, c / kQuantBlock, wv);
      for (int t = 0; t < P; ++t) wv[t].storeu(dst + j * ldd + c + t * Vec::W);
    }
  }
}

void dequantize_rows(const void* const* rows, BlockQuant q, int64_t n, int64_t cols, float* dst, int64_t ldd) {
  switch (q) {
    case BlockQuant::q4_0: return dequantize_rows_t<BlockQuant::q4_0>(rows, n, cols, dst, ldd);
    case BlockQuant::q4_1: return dequantize_rows_t<BlockQuant::q4_1>(rows, n, cols, dst, ldd);
    case BlockQuant::q8_0: return dequantize_rows_t<BlockQuant::q8_0>(rows, n, cols, dst, ldd);
    case BlockQuant::q5_0: return dequantize_rows_t<BlockQuant::q5_0>(rows, n, cols, dst, ldd);
    case BlockQuant::q5_1: return dequantize_rows_t<BlockQuant::q5_1>(rows, n, cols, dst, ldd);
    case BlockQuant::q4_k: return dequantize_rows_t<BlockQuant::q4_k>(rows, n, cols, dst, ldd);
    case BlockQuant::q5_k: return dequantize_rows_t<BlockQuant::q5_k>(rows, n, cols, dst, ldd);
    case BlockQuant::q6_k: return dequantize_rows_t<BlockQuant::q6_k>(rows, n, cols, dst, ldd);
  }
}
