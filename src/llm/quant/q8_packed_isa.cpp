// Integer dot products of 8-bit activation blocks with packed 16-row groups (q8_packed.hpp), for
// one instruction variant (compiled like q8_dot_isa.cpp, once per variant). Per group and block:
// the activations' 4-byte pieces are broadcast and multiplied with 4 bytes of each row at once,
// so the 16 (AVX2: 2 x 8) per-row sums stay in the lanes of one register; the block's scales are
// a vector too. Per row, the block terms are added in block order, as in q8_dot_isa.cpp.
//   Q8_0: the weights are stored plus 128 (unsigned), so dot = dot(w + 128, x) - 128 sum(x).
//   Q4_0: dot(n - 8, x) = dot(n, x) - 8 sum(x), exact in int32, then one scale.
//   Q4_1: d_w d_x dot(n, x) + m s_x.
#include <algorithm>
#include <cstdint>
#include <cstring>
#if defined(__AVX2__)
#include <immintrin.h>
#endif

#include "attn/dtype.hpp"
#include "quant/q8_dot.hpp"
#include "quant/q8_packed.hpp"

#if !defined(ATTN_Q8_VARIANT)
#error "compile with -DATTN_Q8_VARIANT=<variant> (see CMakeLists.txt)"
#endif

namespace attn::kernels::ATTN_Q8_VARIANT {
namespace {

constexpr int64_t value_bytes(BlockQuant q) { return q == BlockQuant::q8_0 ? 512 : 256; }

#if defined(__AVX2__)

#if defined(__AVX512F__)
using VI = __m512i;
using VF = __m512;
constexpr int kLanes = 16;  // rows per register: the whole group
constexpr int kMaxRows = 4;  // activation rows sharing each weight load (32 registers)
inline VI load_i(const uint8_t* p) { return _mm512_loadu_si512(p); }
inline VI splat_i(int32_t v) { return _mm512_set1_epi32(v); }
inline VI splat_bytes(char v) { return _mm512_set1_epi8(v); }
inline VI zero_i() { return _mm512_setzero_si512(); }
inline VI and_i(VI a, VI b) { return _mm512_and_si512(a, b); }
inline VI shr4(VI a) { return _mm512_srli_epi16(a, 4); }
inline VI add32(VI a, VI b) { return _mm512_add_epi32(a, b); }
inline VI sub32(VI a, VI b) { return _mm512_sub_epi32(a, b); }
inline VI shl4_32(VI a) { return _mm512_slli_epi32(a, 4); }
inline VF halves(const uint8_t* p) { return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }
inline VF to_float(VI a) { return _mm512_cvtepi32_ps(a); }
inline VF splat_f(float v) { return _mm512_set1_ps(v); }
inline VF zero_f() { return _mm512_setzero_ps(); }
inline VF mul_f(VF a, VF b) { return _mm512_mul_ps(a, b); }
inline VF fma_f(VF a, VF b, VF c) { return _mm512_fmadd_ps(a, b, c); }
inline void store_f(float* p, VF v) { _mm512_storeu_ps(p, v); }
#if defined(__AVX512VNNI__)
#define ATTN_PACKED_VNNI 1
inline VI dot4(VI acc, VI u, VI s) { return _mm512_dpbusd_epi32(acc, u, s); }
#else
inline VI add16(VI a, VI b) { return _mm512_add_epi16(a, b); }
inline VI pairs(VI u, VI s) { return _mm512_maddubs_epi16(u, s); }
inline VI widen(VI a) { return _mm512_madd_epi16(a, _mm512_set1_epi16(1)); }
#endif
#else
using VI = __m256i;
using VF = __m256;
constexpr int kLanes = 8;  // rows per register: half a group
constexpr int kMaxRows = 2;  // 16 registers
inline VI load_i(const uint8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
inline VI splat_i(int32_t v) { return _mm256_set1_epi32(v); }
inline VI splat_bytes(char v) { return _mm256_set1_epi8(v); }
inline VI zero_i() { return _mm256_setzero_si256(); }
inline VI and_i(VI a, VI b) { return _mm256_and_si256(a, b); }
inline VI shr4(VI a) { return _mm256_srli_epi16(a, 4); }
inline VI add32(VI a, VI b) { return _mm256_add_epi32(a, b); }
inline VI sub32(VI a, VI b) { return _mm256_sub_epi32(a, b); }
inline VI shl4_32(VI a) { return _mm256_slli_epi32(a, 4); }
inline VF halves(const uint8_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
inline VF to_float(VI a) { return _mm256_cvtepi32_ps(a); }
inline VF splat_f(float v) { return _mm256_set1_ps(v); }
inline VF zero_f() { return _mm256_setzero_ps(); }
inline VF mul_f(VF a, VF b) { return _mm256_mul_ps(a, b); }
inline VF fma_f(VF a, VF b, VF c) { return _mm256_fmadd_ps(a, b, c); }
inline void store_f(float* p, VF v) { _mm256_storeu_ps(p, v); }
#if defined(__AVXVNNI__)
#define ATTN_PACKED_VNNI 1
inline VI dot4(VI acc, VI u, VI s) { return _mm256_dpbusd_avx_epi32(acc, u, s); }
#else
inline VI add16(VI a, VI b) { return _mm256_add_epi16(a, b); }
inline VI pairs(VI u, VI s) { return _mm256_maddubs_epi16(u, s); }
inline VI widen(VI a) { return _mm256_madd_epi16(a, _mm256_set1_epi16(1)); }
#endif
#endif

inline int32_t four_bytes(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// Per activation row r < NR, the int32 sums of block b's products for kLanes rows (`lane0` the
// first row's byte offset within each 64-byte step): Q8_0 and Q4_0 with their offsets applied.
//   VNNI: unsigned weight bytes x signed activation bytes, four per int32 lane (exact).
//   Otherwise pairs in int16: the 4-bit values (Q8_0's bytes split into two nibbles) times |x| <= 127
//   make pairs of at most 2 * 15 * 127 = 3810, and the 8 pairs a lane adds at most 30480 < 2^15.
template <BlockQuant Q, int NR>
inline void block_sums(const uint8_t* values, int64_t lane0, const Q8Block* const* xb, VI* isum) {
  const VI low = splat_bytes(0x0F);
#if defined(ATTN_PACKED_VNNI)
  VI s0[NR], s1[NR];
  for (int r = 0; r < NR; ++r) s0[r] = zero_i(), s1[r] = zero_i();
  if constexpr (Q == BlockQuant::q8_0) {
    for (int t = 0; t < 8; t += 2) {
      const VI w0 = load_i(values + 64 * t + lane0), w1 = load_i(values + 64 * (t + 1) + lane0);
      for (int r = 0; r < NR; ++r) {
        s0[r] = dot4(s0[r], w0, splat_i(four_bytes(xb[r]->q + 4 * t)));
        s1[r] = dot4(s1[r], w1, splat_i(four_bytes(xb[r]->q + 4 * t + 4)));
      }
    }
    for (int r = 0; r < NR; ++r) isum[r] = sub32(add32(s0[r], s1[r]), splat_i(128 * xb[r]->sum));
  } else {
    for (int t = 0; t < 4; ++t) {
      const VI w = load_i(values + 64 * t + lane0);
      const VI lo = and_i(w, low), hi = and_i(shr4(w), low);
      for (int r = 0; r < NR; ++r) {
        s0[r] = dot4(s0[r], lo, splat_i(four_bytes(xb[r]->q + 4 * t)));
        s1[r] = dot4(s1[r], hi, splat_i(four_bytes(xb[r]->q + 16 + 4 * t)));
      }
    }
    for (int r = 0; r < NR; ++r) {
      isum[r] = add32(s0[r], s1[r]);
      if constexpr (Q == BlockQuant::q4_0) isum[r] = sub32(isum[r], splat_i(8 * xb[r]->sum));
    }
  }
#else
  VI s0[NR], s1[NR];  // int16 pair sums
  for (int r = 0; r < NR; ++r) s0[r] = zero_i(), s1[r] = zero_i();
  if constexpr (Q == BlockQuant::q8_0) {  // s0: low nibbles, s1: high nibbles (weight 16)
    for (int t = 0; t < 8; ++t) {
      const VI w = load_i(values + 64 * t + lane0);
      const VI lo = and_i(w, low), hi = and_i(shr4(w), low);
      for (int r = 0; r < NR; ++r) {
        const VI x = splat_i(four_bytes(xb[r]->q + 4 * t));
        s0[r] = add16(s0[r], pairs(lo, x)), s1[r] = add16(s1[r], pairs(hi, x));
      }
    }
    for (int r = 0; r < NR; ++r)
      isum[r] = sub32(add32(widen(s0[r]), shl4_32(widen(s1[r]))), splat_i(128 * xb[r]->sum));
  } else {
    for (int t = 0; t < 4; ++t) {
      const VI w = load_i(values + 64 * t + lane0);
      const VI lo = and_i(w, low), hi = and_i(shr4(w), low);
      for (int r = 0; r < NR; ++r) {
        s0[r] = add16(s0[r], pairs(lo, splat_i(four_bytes(xb[r]->q + 4 * t))));
        s1[r] = add16(s1[r], pairs(hi, splat_i(four_bytes(xb[r]->q + 16 + 4 * t))));
      }
    }
    for (int r = 0; r < NR; ++r) {
      isum[r] = widen(add16(s0[r], s1[r]));
      if constexpr (Q == BlockQuant::q4_0) isum[r] = sub32(isum[r], splat_i(8 * xb[r]->sum));
    }
  }
#endif
}

// out[r * ldo + i] = x_r . W_i for r < NR and the kLanes rows i of one group starting at lane
// `half` * kLanes; `valid` of them are written.
template <BlockQuant Q, int NR>
inline void group_rows(const Q8Block* x, int64_t blocks, const PackedView& w, const uint8_t* group, int half,
                       int64_t valid, float* out, int64_t ldo) {
  VF acc[NR];
  for (int r = 0; r < NR; ++r) acc[r] = zero_f();
  const int64_t lane0 = half * kLanes * 4, scale0 = half * kLanes * 2;
  const uint8_t* values = group + w.header_bytes;
  const uint8_t* ahead = group + 16384;
  const int64_t ahead_step = (w.group_bytes / blocks + 63) / 64 * 64;
  for (int64_t b = 0; b < blocks; ++b, values += value_bytes(Q)) {
    // The groups stream from memory once: every line is asked for 16 KiB ahead, into L2
    // (prefetcht2), each block taking its share of the group's lines, header included. One line
    // per block and the hardware prefetcher read 11.5 GB/s on one Zen 4 thread, every value line
    // 4 KiB ahead into L1 16.5, 16 KiB ahead into L2 17-23 (31 for a plain read).
    for (int64_t line = 0; line < ahead_step; line += 64) __builtin_prefetch(ahead + b * ahead_step + line, 0, 1);
    const Q8Block* xb[NR];
    for (int r = 0; r < NR; ++r) xb[r] = x + r * blocks + b;
    VI isum[NR];
    block_sums<Q, NR>(values, lane0, xb, isum);
    const VF dw = halves(group + 32 * b + scale0);
    for (int r = 0; r < NR; ++r) {
      acc[r] = fma_f(to_float(isum[r]), mul_f(dw, splat_f(xb[r]->d)), acc[r]);
      if constexpr (Q == BlockQuant::q4_1) acc[r] = fma_f(halves(group + 32 * (blocks + b) + scale0), splat_f(xb[r]->s), acc[r]);
    }
  }
  for (int r = 0; r < NR; ++r) {
    if (valid == kLanes) {
      store_f(out + r * ldo, acc[r]);
    } else {
      alignas(64) float tmp[kLanes];
      store_f(tmp, acc[r]);
      for (int64_t i = 0; i < valid; ++i) out[r * ldo + i] = tmp[i];
    }
  }
}

template <BlockQuant Q, int NR>
void groups_of(const Q8Block* x, const PackedView& w, int64_t g0, int64_t n, float* y, int64_t ldy) {
  for (int64_t j = 0; j < n; j += kPackedRows) {
    const uint8_t* group = w.data + (g0 + j / kPackedRows) * w.group_bytes;
    for (int half = 0; half * kLanes < kPackedRows; ++half) {
      const int64_t first = j + half * kLanes;
      if (first >= n) break;
      group_rows<Q, NR>(x, w.blocks, w, group, half, std::min<int64_t>(kLanes, n - first), y + first, ldy);
    }
  }
}

template <BlockQuant Q>
void rows_t(const Q8Block* x, int64_t R, const PackedView& w, int64_t g0, int64_t n, float* y, int64_t ldy) {
  int64_t r = 0;
  for (; r + kMaxRows <= R; r += kMaxRows) groups_of<Q, kMaxRows>(x + r * w.blocks, w, g0, n, y + r * ldy, ldy);
  for (; r < R; ++r) groups_of<Q, 1>(x + r * w.blocks, w, g0, n, y + r * ldy, ldy);
}

#else  // plain C++: the same sums, one row at a time

template <BlockQuant Q>
void rows_t(const Q8Block* x, int64_t R, const PackedView& w, int64_t g0, int64_t n, float* y, int64_t ldy) {
  for (int64_t r = 0; r < R; ++r)
    for (int64_t j = 0; j < n; ++j) {
      const int64_t i = j % kPackedRows;
      const uint8_t* group = w.data + (g0 + j / kPackedRows) * w.group_bytes;
      float acc = 0.0f;
      for (int64_t b = 0; b < w.blocks; ++b) {
        const Q8Block& xb = x[r * w.blocks + b];
        const uint8_t* values = group + w.header_bytes + b * value_bytes(Q) + 4 * i;
        int32_t sum = 0;
        for (int t = 0; t < value_bytes(Q) / 64; ++t)
          for (int k = 0; k < 4; ++k) {
            const uint8_t v = values[64 * t + k];
            if constexpr (Q == BlockQuant::q8_0) {
              sum += (int32_t{v} - 128) * xb.q[4 * t + k];
            } else {
              sum += int32_t{v & 0x0F} * xb.q[4 * t + k] + int32_t{v >> 4} * xb.q[16 + 4 * t + k];
            }
          }
        if constexpr (Q == BlockQuant::q4_0) sum -= 8 * xb.sum;
        uint16_t h;
        std::memcpy(&h, group + 32 * b + 2 * i, 2);
        acc += static_cast<float>(sum) * (f16_to_float(h) * xb.d);
        if constexpr (Q == BlockQuant::q4_1) {
          std::memcpy(&h, group + 32 * (w.blocks + b) + 2 * i, 2);
          acc += f16_to_float(h) * xb.s;
        }
      }
      y[r * ldy + j] = acc;
    }
}

#endif

}  // namespace

void q8_packed_rows(const Q8Block* x, int64_t R, const PackedView& w, int64_t g0, int64_t n, float* y, int64_t ldy) {
  switch (w.q) {
    case BlockQuant::q4_0: return rows_t<BlockQuant::q4_0>(x, R, w, g0, n, y, ldy);
    case BlockQuant::q4_1: return rows_t<BlockQuant::q4_1>(x, R, w, g0, n, y, ldy);
    case BlockQuant::q8_0: return rows_t<BlockQuant::q8_0>(x, R, w, g0, n, y, ldy);
  }
}

}  // namespace attn::kernels::ATTN_Q8_VARIANT
