// The integer-dot kernels (q8_dot.hpp) for one instruction variant. CMake compiles this file once
// per variant with ATTN_Q8_VARIANT = q8_portable | q8_avx2 | q8_avx_vnni | q8_avx512 |
// q8_avx512_vnni (the namespace) and that variant's -m flags; the instruction that multiplies 32 unsigned by 32
// signed bytes into eight int32 sums is picked below from what the flags enable.
#include <cmath>
#include <cstdint>
#include <cstring>
#if defined(__AVX2__)
#include <immintrin.h>
#endif

#include "attn/dtype.hpp"
#include "quant/block_pieces.hpp"
#include "quant/q8_dot.hpp"

#if !defined(ATTN_Q8_VARIANT)
#error "compile with -DATTN_Q8_VARIANT=<variant> (see CMakeLists.txt)"
#endif

namespace attn::kernels::ATTN_Q8_VARIANT {
namespace {

constexpr int kBlock = 32;
constexpr float kTinyBlock = 0x1p-100f;  // as quantize_q8_rows: such a block rounds to zero

template <BlockQuant Q>
constexpr int64_t block_bytes() {
  return Q == BlockQuant::q8_0 ? 34 : Q == BlockQuant::q4_1 ? 20 : 18;
}

inline float half_at(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
#if defined(__F16C__)
  return _cvtsh_ss(h);
#else
  return f16_to_float(h);
#endif
}

#if defined(__AVX2__)

// Eight int32 sums of four u8 x s8 products each.
inline __m256i dot_u8s8(__m256i u, __m256i s) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
  return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s);
#elif defined(__AVXVNNI__)
  return _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), u, s);
#else
  // pairs of products in int16, then pairs of pairs: u <= 128 here (4-bit values are <= 15,
  // |q_w| <= 128), so a pair is at most 2 * 128 * 127 < 2^15 and never saturates
  return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
#endif
}

// The 32 values of a 4-bit block as bytes 0..15: byte j holds value j low, j + 16 high.
inline __m256i nibbles(const uint8_t* p) {
  const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  const __m128i low = _mm_set1_epi8(0x0F);
  return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(b, 4), low), _mm_and_si128(b, low));
}

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// out[r * ldo + j] = x_r . W_j for r < NR, j < NJ.
template <BlockQuant Q, int NR, int NJ>
inline void tile(const Q8Block* x, int64_t blocks, const void* const* w, float* out, int64_t ldo) {
  __m256 acc[NR][NJ];
  float extra[NR][NJ];
  for (int r = 0; r < NR; ++r)
    for (int j = 0; j < NJ; ++j) acc[r][j] = _mm256_setzero_ps(), extra[r][j] = 0.0f;
  const uint8_t* wb[NJ];
  for (int j = 0; j < NJ; ++j) wb[j] = static_cast<const uint8_t*>(w[j]);
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t off = b * block_bytes<Q>();
    __m256i u[NJ];
    __m256 dw[NJ];
    float m[NJ];
    for (int j = 0; j < NJ; ++j) {
      const uint8_t* p = wb[j] + off;
      __builtin_prefetch(p + 4096);  // weight rows stream from memory once
      dw[j] = _mm256_set1_ps(half_at(p));
      if constexpr (Q == BlockQuant::q8_0) {
        u[j] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 2));
      } else if constexpr (Q == BlockQuant::q4_0) {
        u[j] = nibbles(p + 2), m[j] = -8.0f * half_at(p);
      } else {
        u[j] = nibbles(p + 4), m[j] = half_at(p + 2);
      }
    }
    for (int r = 0; r < NR; ++r) {
      const Q8Block& xb = x[r * blocks + b];
      const __m256i xq = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb.q));
      const __m256 dx = _mm256_set1_ps(xb.d);
      for (int j = 0; j < NJ; ++j) {
        __m256i sum;
        if constexpr (Q == BlockQuant::q8_0)  // |q_w| times q_x with q_w's sign
          sum = dot_u8s8(_mm256_sign_epi8(u[j], u[j]), _mm256_sign_epi8(xq, u[j]));
        else
          sum = dot_u8s8(u[j], xq);
        acc[r][j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), _mm256_mul_ps(dw[j], dx), acc[r][j]);
        if constexpr (Q != BlockQuant::q8_0) extra[r][j] += m[j] * xb.s;
      }
    }
  }
  for (int r = 0; r < NR; ++r)
    for (int j = 0; j < NJ; ++j) out[r * ldo + j] = hsum(acc[r][j]) + extra[r][j];
}

#else  // plain C++

template <BlockQuant Q, int NR, int NJ>
inline void tile(const Q8Block* x, int64_t blocks, const void* const* w, float* out, int64_t ldo) {
  static_assert(NR == 1 && NJ == 1);
  const uint8_t* row = static_cast<const uint8_t*>(w[0]);
  float acc = 0.0f, extra = 0.0f;
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* p = row + b * block_bytes<Q>();
    const Q8Block& xb = x[b];
    int32_t sum = 0;
    if constexpr (Q == BlockQuant::q8_0) {
      const int8_t* qw = reinterpret_cast<const int8_t*>(p + 2);
      for (int i = 0; i < kBlock; ++i) sum += int32_t{qw[i]} * xb.q[i];
    } else {
      const uint8_t* nib = p + (Q == BlockQuant::q4_1 ? 4 : 2);
      for (int i = 0; i < kBlock / 2; ++i)
        sum += int32_t{nib[i] & 0x0F} * xb.q[i] + int32_t{nib[i] >> 4} * xb.q[i + kBlock / 2];
      extra += (Q == BlockQuant::q4_1 ? half_at(p + 2) : -8.0f * half_at(p)) * xb.s;
    }
    acc += static_cast<float>(sum) * (half_at(p) * xb.d);
  }
  out[0] = acc + extra;
  (void)ldo;
}

#endif

#if defined(__AVX2__)
// Four weight rows at a time for up to two input rows (AVX2's 16 vector registers), two rows
// of each beyond that; AVX-512's 32 registers hold four by four.
#if defined(__AVX512F__)
constexpr int kMaxRows = 4;
#else
constexpr int kMaxRows = 2;
#endif
template <BlockQuant Q, int NR>
void rows_of(const Q8Block* x, int64_t blocks, const void* const* w, int64_t n, float* y, int64_t ldy) {
  int64_t j = 0;
  for (; j + 4 <= n; j += 4) tile<Q, NR, 4>(x, blocks, w + j, y + j, ldy);
  for (; j < n; ++j) tile<Q, NR, 1>(x, blocks, w + j, y + j, ldy);
}
#else
constexpr int kMaxRows = 1;
template <BlockQuant Q, int NR>
void rows_of(const Q8Block* x, int64_t blocks, const void* const* w, int64_t n, float* y, int64_t ldy) {
  for (int64_t j = 0; j < n; ++j) tile<Q, 1, 1>(x, blocks, w + j, y + j, ldy);
}
#endif

template <BlockQuant Q>
void rows_t(const Q8Block* x, int64_t R, int64_t blocks, const void* const* w, int64_t n, float* y, int64_t ldy) {
  int64_t r = 0;
  for (; r + kMaxRows <= R; r += kMaxRows) rows_of<Q, kMaxRows>(x + r * blocks, blocks, w, n, y + r * ldy, ldy);
  for (; r < R; ++r) rows_of<Q, 1>(x + r * blocks, blocks, w, n, y + r * ldy, ldy);
}

// Q5_0, Q5_1 and the K-quants in place (decode multiplies them packed, q8_packed.hpp): plain C++ over their
// pieces (block_pieces.hpp), the same sums per 32-value block, in block order.
void piece_rows(const Q8Block* x, int64_t R, int64_t blocks, const void* const* w, BlockQuant q, int64_t n, float* y,
                int64_t ldy) {
  QuantPiece p;
  for (int64_t j = 0; j < n; ++j)
    for (int64_t r = 0; r < R; ++r) {
      float acc = 0.0f;
      for (int64_t b = 0; b < blocks; ++b) {
        quant_piece(q, static_cast<const uint8_t*>(w[j]), b, p);
        const Q8Block& xb = x[r * blocks + b];
        int32_t sum[2] = {0, 0};
        for (int i = 0; i < kBlock; ++i) sum[i / 16] += int32_t{p.v[i]} * xb.q[i];
        acc += static_cast<float>(sum[0]) * (p.scale[0] * xb.d) + static_cast<float>(sum[1]) * (p.scale[1] * xb.d);
        if (p.has_offset) acc += p.offset * xb.s;
      }
      y[r * ldy + j] = acc;
    }
}

}  // namespace

// quantize_q8_rows (q8_dot.cpp) with the same bits: the maximum is exact in any order, x * (127 /
// max) one float32 product either way, and vcvtps2dq rounds to nearest even like nearbyint.
void quantize_rows(const float* x, int64_t R, int64_t cols, int64_t ld, Q8Block* out) {
#if defined(__AVX512F__)
  const __m512 zero = _mm512_setzero_ps();
  for (int64_t r = 0; r < R; ++r)
    for (int64_t c0 = 0; c0 < cols; c0 += kBlock) {
      const float* v = x + r * ld + c0;
      Q8Block& b = *out++;
      const __m512 a0 = _mm512_loadu_ps(v), a1 = _mm512_loadu_ps(v + 16);
      // finite: a - a is 0 (inf - inf and NaN give NaN)
      const __mmask16 finite = _mm512_cmp_ps_mask(_mm512_sub_ps(a0, a0), zero, _CMP_EQ_OQ) &
                               _mm512_cmp_ps_mask(_mm512_sub_ps(a1, a1), zero, _CMP_EQ_OQ);
      if (finite != 0xFFFF) {
        b.d = NAN, b.s = NAN, b.sum = 0, b.low = 0;
        std::memset(b.q, 0, sizeof b.q);
        continue;
      }
      float most = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(a0), _mm512_abs_ps(a1)));
      if (most < kTinyBlock) most = 0.0f;
      b.d = most / 127.0f;
      const __m512 inv = _mm512_set1_ps(most > 0.0f ? 127.0f / most : 0.0f);
      const __m512i q0 = _mm512_cvtps_epi32(_mm512_mul_ps(a0, inv)), q1 = _mm512_cvtps_epi32(_mm512_mul_ps(a1, inv));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(b.q), _mm512_cvtepi32_epi8(q0));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(b.q + 16), _mm512_cvtepi32_epi8(q1));
      b.low = static_cast<int16_t>(_mm512_reduce_add_epi32(q0));
      b.sum = static_cast<int16_t>(b.low + _mm512_reduce_add_epi32(q1));
      b.s = b.d * static_cast<float>(b.sum);
    }
#else
  quantize_q8_rows(x, R, cols, ld, out);
#endif
}

void q8_dot_rows(const Q8Block* x, int64_t R, int64_t blocks, const void* const* w, BlockQuant q, int64_t n, float* y,
                 int64_t ldy) {
  switch (q) {
    case BlockQuant::q4_0: return rows_t<BlockQuant::q4_0>(x, R, blocks, w, n, y, ldy);
    case BlockQuant::q4_1: return rows_t<BlockQuant::q4_1>(x, R, blocks, w, n, y, ldy);
    case BlockQuant::q8_0: return rows_t<BlockQuant::q8_0>(x, R, blocks, w, n, y, ldy);
    case BlockQuant::q5_0:
    case BlockQuant::q5_1:
    case BlockQuant::q4_k:
    case BlockQuant::q5_k:
    case BlockQuant::q6_k: return piece_rows(x, R, blocks, w, q, n, y, ldy);
  }
}

}  // namespace attn::kernels::ATTN_Q8_VARIANT
