// Integer dot products of 8-bit activation blocks with packed 16-row groups (q8_packed.hpp), for
// one instruction variant (compiled like q8_dot_isa.cpp, once per variant). Per group and block:
// the activations' 4-byte pieces are broadcast and multiplied with 4 bytes of each row at once,
// so the 16 (AVX2: 2 x 8) per-row sums stay in the lanes of one register; the block's scales are
// a vector too. Per row, the block terms are added in block order, as in q8_dot_isa.cpp.
//   Q8_0: the weights are stored plus 128 (unsigned), so dot = dot(w + 128, x) - 128 sum(x).
//   Q4_0: dot(n - 8, x) = dot(n, x) - 8 sum(x), exact in int32, then one scale.
//   Q4_1: d_w d_x dot(n, x) + m s_x.
//   Q5_0: the fifth bits or'ed into the nibbles in registers, then as Q4_0 with 16 for 8.
//   Q5_1: the same, then as Q4_1.
//   Q4_K: per 32-value sub-block j, (d dx) (s_j dot(n, x)) - (dmin m_j) s_x, s_j dot exact in int32;
//     Q5_K the same after or'ing in the fifth bits.
//   Q6_K: the top two bits or'ed into the nibbles; per activation block its two 16-value groups'
//     integer dots dot(q, x_h) - 32 sum(x_h) times their int8 scales, added in int32 (at most
//     2 * 128 * 16 * 127 * 95 < 2^31), then (d dx) times that sum.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>
#if defined(__AVX2__)
#include <immintrin.h>
#endif

#include "attn/dtype.hpp"
#include "quant/float16_at.hpp"
#include "quant/q8_dot.hpp"
#include "quant/q8_packed.hpp"

#if !defined(ATTN_Q8_VARIANT)
#error "compile with -DATTN_Q8_VARIANT=<variant> (see CMakeLists.txt)"
#endif

namespace attn::kernels::ATTN_Q8_VARIANT {
namespace {

constexpr bool five_bits(BlockQuant q) { return q == BlockQuant::q5_0 || q == BlockQuant::q5_1; }
constexpr bool has_minimums(BlockQuant q) { return q == BlockQuant::q4_1 || q == BlockQuant::q5_1; }
constexpr bool k_quant(BlockQuant q) { return q == BlockQuant::q4_k || q == BlockQuant::q5_k || q == BlockQuant::q6_k; }
constexpr int64_t value_bytes(BlockQuant q) { return q == BlockQuant::q8_0 ? 512 : five_bits(q) ? 320 : 256; }

#if defined(__AVX2__)

#if defined(__AVX512F__)
using VI = __m512i;
using VF = __m512;
constexpr int kLanes = 16;  // rows per register: the whole group
constexpr int kMaxRows = 4;  // activation rows sharing each weight load (32 registers)
inline VI load_i(const uint8_t* p) { return _mm512_loadu_si512(p); }
inline void store_i(uint8_t* p, VI v) { _mm512_storeu_si512(p, v); }
inline VI splat_i(int32_t v) { return _mm512_set1_epi32(v); }
inline VI splat_bytes(char v) { return _mm512_set1_epi8(v); }
inline VI zero_i() { return _mm512_setzero_si512(); }
inline VI and_i(VI a, VI b) { return _mm512_and_si512(a, b); }
inline VI shr4(VI a) { return _mm512_srli_epi16(a, 4); }
inline VI add32(VI a, VI b) { return _mm512_add_epi32(a, b); }
inline VI sub32(VI a, VI b) { return _mm512_sub_epi32(a, b); }
inline VI shl4_32(VI a) { return _mm512_slli_epi32(a, 4); }
inline VI shr1_32(VI a) { return _mm512_srli_epi32(a, 1); }
inline VI shr2_32(VI a) { return _mm512_srli_epi32(a, 2); }
inline VI or_i(VI a, VI b) { return _mm512_or_si512(a, b); }
inline VI mul32(VI a, VI b) { return _mm512_mullo_epi32(a, b); }
inline VI lane_u8(const uint8_t* p) {
  return _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
inline VI lane_i8(const uint8_t* p) {
  return _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
inline VF halves(const uint8_t* p) { return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }
inline VF to_float(VI a) { return _mm512_cvtepi32_ps(a); }
inline VF splat_f(float v) { return _mm512_set1_ps(v); }
inline VF zero_f() { return _mm512_setzero_ps(); }
inline VF mul_f(VF a, VF b) { return _mm512_mul_ps(a, b); }
inline VF fma_f(VF a, VF b, VF c) { return _mm512_fmadd_ps(a, b, c); }
inline VF fnma_f(VF a, VF b, VF c) { return _mm512_fnmadd_ps(a, b, c); }
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
inline void store_i(uint8_t* p, VI v) { _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), v); }
inline VI splat_i(int32_t v) { return _mm256_set1_epi32(v); }
inline VI splat_bytes(char v) { return _mm256_set1_epi8(v); }
inline VI zero_i() { return _mm256_setzero_si256(); }
inline VI and_i(VI a, VI b) { return _mm256_and_si256(a, b); }
inline VI shr4(VI a) { return _mm256_srli_epi16(a, 4); }
inline VI add32(VI a, VI b) { return _mm256_add_epi32(a, b); }
inline VI sub32(VI a, VI b) { return _mm256_sub_epi32(a, b); }
inline VI shl4_32(VI a) { return _mm256_slli_epi32(a, 4); }
inline VI shr1_32(VI a) { return _mm256_srli_epi32(a, 1); }
inline VI shr2_32(VI a) { return _mm256_srli_epi32(a, 2); }
inline VI or_i(VI a, VI b) { return _mm256_or_si256(a, b); }
inline VI mul32(VI a, VI b) { return _mm256_mullo_epi32(a, b); }
inline VI lane_u8(const uint8_t* p) {
  return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
}
inline VI lane_i8(const uint8_t* p) {
  return _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
}
inline VF halves(const uint8_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
inline VF to_float(VI a) { return _mm256_cvtepi32_ps(a); }
inline VF splat_f(float v) { return _mm256_set1_ps(v); }
inline VF zero_f() { return _mm256_setzero_ps(); }
inline VF mul_f(VF a, VF b) { return _mm256_mul_ps(a, b); }
inline VF fma_f(VF a, VF b, VF c) { return _mm256_fmadd_ps(a, b, c); }
inline VF fnma_f(VF a, VF b, VF c) { return _mm256_fnmadd_ps(a, b, c); }
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

// Q5_0, Q5_1: or's step t's fifth bits (q8_packed.hpp) into the nibbles lo (bit t of each byte of
// `high`) and hi (bit 4 + t), then moves `high` on to step t + 1.
inline void fifth_bits(VI& lo, VI& hi, VI& high) {
  const VI bit4 = splat_bytes(0x10);
  lo = or_i(lo, and_i(shl4_32(high), bit4));
  hi = or_i(hi, and_i(high, bit4));
  high = shr1_32(high);
}

// Per activation row r < NR, the int32 sums of block b's products for kLanes rows (`lane0` the
// first row's byte offset within each 64-byte step): Q8_0 and Q4_0 with their offsets applied.
// Bytes (VNNI only): Q4_0 .. Q5_1 values already unpacked to bytes in Q8_0's 8 steps (unpack_group).
//   VNNI: unsigned weight bytes x signed activation bytes, four per int32 lane (exact).
//   Otherwise pairs in int16: the 4-bit values (Q8_0's bytes split into two nibbles) times |x| <= 127
//   make pairs of at most 2 * 15 * 127 = 3810, and the 8 pairs a lane adds at most 30480 < 2^15;
//   Q5_0's and Q5_1's 5-bit values pairs of at most 7874, four of them in each of s0, s1 (widened apart).
template <BlockQuant Q, int NR, bool Bytes = false>
inline void block_sums(const uint8_t* values, int64_t lane0, const Q8Block* const* xb, VI* isum) {
  const VI low = splat_bytes(0x0F);
#if defined(ATTN_PACKED_VNNI)
  VI s0[NR], s1[NR];
  for (int r = 0; r < NR; ++r) s0[r] = zero_i(), s1[r] = zero_i();
  if constexpr (Bytes) {
    for (int t = 0; t < 8; t += 2) {
      const VI w0 = load_i(values + 64 * t + lane0), w1 = load_i(values + 64 * (t + 1) + lane0);
      for (int r = 0; r < NR; ++r) {
        s0[r] = dot4(s0[r], w0, splat_i(four_bytes(xb[r]->q + 4 * t)));
        s1[r] = dot4(s1[r], w1, splat_i(four_bytes(xb[r]->q + 4 * t + 4)));
      }
    }
    for (int r = 0; r < NR; ++r) {
      isum[r] = add32(s0[r], s1[r]);
      if constexpr (Q == BlockQuant::q4_0) isum[r] = sub32(isum[r], splat_i(8 * xb[r]->sum));
      if constexpr (Q == BlockQuant::q5_0) isum[r] = sub32(isum[r], splat_i(16 * xb[r]->sum));
    }
  } else if constexpr (Q == BlockQuant::q8_0) {
    for (int t = 0; t < 8; t += 2) {
      const VI w0 = load_i(values + 64 * t + lane0), w1 = load_i(values + 64 * (t + 1) + lane0);
      for (int r = 0; r < NR; ++r) {
        s0[r] = dot4(s0[r], w0, splat_i(four_bytes(xb[r]->q + 4 * t)));
        s1[r] = dot4(s1[r], w1, splat_i(four_bytes(xb[r]->q + 4 * t + 4)));
      }
    }
    for (int r = 0; r < NR; ++r) isum[r] = sub32(add32(s0[r], s1[r]), splat_i(128 * xb[r]->sum));
  } else {
    VI high = five_bits(Q) ? load_i(values + 256 + lane0) : zero_i();
    for (int t = 0; t < 4; ++t) {
      const VI w = load_i(values + 64 * t + lane0);
      VI lo = and_i(w, low), hi = and_i(shr4(w), low);
      if constexpr (five_bits(Q)) fifth_bits(lo, hi, high);
      for (int r = 0; r < NR; ++r) {
        s0[r] = dot4(s0[r], lo, splat_i(four_bytes(xb[r]->q + 4 * t)));
        s1[r] = dot4(s1[r], hi, splat_i(four_bytes(xb[r]->q + 16 + 4 * t)));
      }
    }
    for (int r = 0; r < NR; ++r) {
      isum[r] = add32(s0[r], s1[r]);
      if constexpr (Q == BlockQuant::q4_0) isum[r] = sub32(isum[r], splat_i(8 * xb[r]->sum));
      if constexpr (Q == BlockQuant::q5_0) isum[r] = sub32(isum[r], splat_i(16 * xb[r]->sum));
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
    VI high = five_bits(Q) ? load_i(values + 256 + lane0) : zero_i();
    for (int t = 0; t < 4; ++t) {
      const VI w = load_i(values + 64 * t + lane0);
      VI lo = and_i(w, low), hi = and_i(shr4(w), low);
      if constexpr (five_bits(Q)) fifth_bits(lo, hi, high);
      for (int r = 0; r < NR; ++r) {
        s0[r] = add16(s0[r], pairs(lo, splat_i(four_bytes(xb[r]->q + 4 * t))));
        s1[r] = add16(s1[r], pairs(hi, splat_i(four_bytes(xb[r]->q + 16 + 4 * t))));
      }
    }
    for (int r = 0; r < NR; ++r) {
      if constexpr (five_bits(Q)) {
        isum[r] = add32(widen(s0[r]), widen(s1[r]));
        if constexpr (Q == BlockQuant::q5_0) isum[r] = sub32(isum[r], splat_i(16 * xb[r]->sum));
      } else {
        isum[r] = widen(add16(s0[r], s1[r]));
        if constexpr (Q == BlockQuant::q4_0) isum[r] = sub32(isum[r], splat_i(8 * xb[r]->sum));
      }
    }
  }
#endif
}

// out[r * ldo + i] = acc[r] lane i for i < valid.
template <int NR>
inline void store_rows(const VF* acc, int64_t valid, float* out, int64_t ldo) {
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

// out[r * ldo + i] = x_r . W_i for r < NR and the kLanes rows i of one group starting at lane
// `half` * kLanes; `valid` of them are written. `stream`: the group is read for the first time in
// this call (it comes from memory: its lines are prefetched); later rows of a prompt find it in cache.
template <BlockQuant Q, int NR, bool Bytes = false>
inline void group_rows(const Q8Block* x, int64_t blocks, const PackedView& w, const uint8_t* group, int half,
                       int64_t valid, float* out, int64_t ldo, bool stream) {
  VF acc[NR];
  for (int r = 0; r < NR; ++r) acc[r] = zero_f();
  const int64_t lane0 = half * kLanes * 4, scale0 = half * kLanes * 2;
  const uint8_t* values = group + w.header_bytes;
  const uint8_t* ahead = group + 16384;
  const int64_t ahead_step = (w.group_bytes / blocks + 63) / 64 * 64;
  for (int64_t b = 0; b < blocks; ++b, values += Bytes ? 512 : value_bytes(Q)) {
    // The groups stream from memory once: every line is asked for 16 KiB ahead, into L2
    // (prefetcht2), each block taking its share of the group's lines, header included. One line
    // per block and the hardware prefetcher read 11.5 GB/s on one Zen 4 thread, every value line
    // 4 KiB ahead into L1 16.5, 16 KiB ahead into L2 17-23 (31 for a plain read).
    if (stream)
      for (int64_t line = 0; line < ahead_step; line += 64) __builtin_prefetch(ahead + b * ahead_step + line, 0, 1);
    const Q8Block* xb[NR];
    for (int r = 0; r < NR; ++r) xb[r] = x + r * blocks + b;
    VI isum[NR];
    block_sums<Q, NR, Bytes>(values, lane0, xb, isum);
    const VF dw = halves(group + 32 * b + scale0);
    for (int r = 0; r < NR; ++r) {
      acc[r] = fma_f(to_float(isum[r]), mul_f(dw, splat_f(xb[r]->d)), acc[r]);
      if constexpr (has_minimums(Q))
        acc[r] = fma_f(halves(group + 32 * (blocks + b) + scale0), splat_f(xb[r]->s), acc[r]);
    }
  }
  store_rows<NR>(acc, valid, out, ldo);
}

#if defined(ATTN_PACKED_VNNI)
inline VI step_dot(VI acc, VI u, const int8_t* x) { return dot4(acc, u, splat_i(four_bytes(x))); }
#else
// pairs widened at once: Q6_K's 6-bit values make pairs of up to 2 * 63 * 127, too many for int16
inline VI step_dot(VI acc, VI u, const int8_t* x) { return add32(acc, widen(pairs(u, splat_i(four_bytes(x))))); }
#endif

// group_rows for the K-quants (Q4_K, Q5_K, Q6_K): one unit of 16 rows x 256 values at a time.
template <BlockQuant Q, int NR>
inline void super_rows(const Q8Block* x, int64_t blocks, const uint8_t* group, int half, int64_t valid, float* out,
                       int64_t ldo, bool stream) {
  VF acc[NR];
  for (int r = 0; r < NR; ++r) acc[r] = zero_f();
  const int64_t lane0 = half * kLanes * 4, scale0 = half * kLanes * 2, byte0 = half * kLanes;
  using L = std::conditional_t<Q == BlockQuant::q5_k, packed_q5_k, packed_q4_k>;  // Q4_K, Q5_K
  const int64_t unit = Q == BlockQuant::q6_k ? packed_q6_k::unit : L::unit;
  const VI low = splat_bytes(0x0F), top = splat_bytes(0x30);
  for (int64_t s = 0; s < blocks / 8; ++s) {
    const uint8_t* u = group + s * unit;
    if (stream)  // as group_rows
      for (int64_t line = 0; line < unit; line += 64) __builtin_prefetch(u + 16384 + line, 0, 1);
    const Q8Block* xs[NR];
    for (int r = 0; r < NR; ++r) xs[r] = x + r * blocks + 8 * s;
    if constexpr (Q != BlockQuant::q6_k) {
      const VF d = halves(u + L::d + scale0), dmin = halves(u + L::dmin + scale0);
      for (int k = 0; k < 4; ++k) {
        const uint8_t* values = u + L::values + L::pair * k + lane0;
        VI s0[NR], s1[NR];  // sub-blocks 2k (low nibbles) and 2k + 1 (high)
        for (int r = 0; r < NR; ++r) s0[r] = zero_i(), s1[r] = zero_i();
        VI high0 = zero_i(), high1 = zero_i();  // Q5_K: bit t of each byte, step t's fifth bits
        if constexpr (Q == BlockQuant::q5_k) high0 = load_i(values + 512), high1 = load_i(values + 576);
        for (int t = 0; t < 8; ++t) {
          const VI w = load_i(values + 64 * t);
          VI lo = and_i(w, low), hi = and_i(shr4(w), low);
          if constexpr (Q == BlockQuant::q5_k) {
            const VI bit4 = splat_bytes(0x10);
            lo = or_i(lo, and_i(shl4_32(high0), bit4)), hi = or_i(hi, and_i(shl4_32(high1), bit4));
            high0 = shr1_32(high0), high1 = shr1_32(high1);
          }
          for (int r = 0; r < NR; ++r) {
            s0[r] = step_dot(s0[r], lo, xs[r][2 * k].q + 4 * t);
            s1[r] = step_dot(s1[r], hi, xs[r][2 * k + 1].q + 4 * t);
          }
        }
        for (int h = 0; h < 2; ++h) {
          const int64_t j = 2 * k + h;
          const VI sc = lane_u8(u + L::scales + 16 * j + byte0);
          const VF mins = mul_f(to_float(lane_u8(u + L::mins + 16 * j + byte0)), dmin);
          for (int r = 0; r < NR; ++r) {
            const Q8Block& b = xs[r][j];
            acc[r] = fma_f(to_float(mul32(h ? s1[r] : s0[r], sc)), mul_f(d, splat_f(b.d)), acc[r]);
            acc[r] = fnma_f(mins, splat_f(b.s), acc[r]);
          }
        }
      }
    } else {
      const VF d = halves(u + packed_q6_k::d + scale0);
      for (int b = 0; b < 8; ++b) {
        const uint8_t* values = u + packed_q6_k::values + packed_q6_k::block * b + lane0;
        VI top0 = load_i(values + 256), top1 = load_i(values + 320);  // bits 2t, 2t+1: step t's top bits
        VI s0[NR], s1[NR];  // the 16-value groups 2b (values 0 .. 15) and 2b + 1
        for (int r = 0; r < NR; ++r) s0[r] = zero_i(), s1[r] = zero_i();
        for (int t = 0; t < 4; ++t) {
          const VI w = load_i(values + 64 * t);
          const VI lo = or_i(and_i(w, low), and_i(shl4_32(top0), top));
          const VI hi = or_i(and_i(shr4(w), low), and_i(shl4_32(top1), top));
          top0 = shr2_32(top0), top1 = shr2_32(top1);
          for (int r = 0; r < NR; ++r) {
            s0[r] = step_dot(s0[r], lo, xs[r][b].q + 4 * t);
            s1[r] = step_dot(s1[r], hi, xs[r][b].q + 16 + 4 * t);
          }
        }
        const VI sc0 = lane_i8(u + packed_q6_k::scales + 32 * b + byte0);
        const VI sc1 = lane_i8(u + packed_q6_k::scales + 32 * b + 16 + byte0);
        for (int r = 0; r < NR; ++r) {
          const Q8Block& xb = xs[r][b];
          const int32_t first = xb.low;
          const VI isum = add32(mul32(sub32(s0[r], splat_i(32 * first)), sc0),
                                mul32(sub32(s1[r], splat_i(32 * (xb.sum - first))), sc1));
          acc[r] = fma_f(to_float(isum), mul_f(d, splat_f(xb.d)), acc[r]);
        }
      }
    }
  }
  store_rows<NR>(acc, valid, out, ldo);
}

template <BlockQuant Q, int NR>
void groups_of(const Q8Block* x, const PackedView& w, int64_t g0, int64_t n, float* y, int64_t ldy, bool stream) {
  for (int64_t j = 0; j < n; j += kPackedRows) {
    const uint8_t* group = w.data + (g0 + j / kPackedRows) * w.group_bytes;
    for (int half = 0; half * kLanes < kPackedRows; ++half) {
      const int64_t first = j + half * kLanes;
      if (first >= n) break;
      const int64_t valid = std::min<int64_t>(kLanes, n - first);
      if constexpr (k_quant(Q))
        super_rows<Q, NR>(x, w.blocks, group, half, valid, y + first, ldy, stream);
      else
        group_rows<Q, NR>(x, w.blocks, w, group, half, valid, y + first, ldy, stream);
    }
  }
}

#if defined(ATTN_PACKED_VNNI)
// Prompts (many activation rows against each group): a group's 4- and 5-bit values unpacked once to
// bytes in Q8_0's steps (step t: values 4t .. 4t+3 of each row), its header copied, so every further
// group of rows multiplies without unpacking (about half the instructions per product for Q5_0).
// The integer sums are the same, so every bit of the outputs is.
constexpr int64_t kUnpackedBytes = 40 * 1024;  // on the stack: groups of up to 72 blocks (2304 columns)
constexpr int64_t kUnpackFromRows = 8;          // activation rows from which unpacking pays
constexpr bool unpacks(BlockQuant q) {
  return q == BlockQuant::q4_0 || q == BlockQuant::q4_1 || q == BlockQuant::q5_0 || q == BlockQuant::q5_1;
}

template <BlockQuant Q>
void unpack_group(const PackedView& w, const uint8_t* group, uint8_t* out) {
  std::memcpy(out, group, static_cast<size_t>(w.header_bytes));
  const VI low = splat_bytes(0x0F);
  for (int64_t b = 0; b < w.blocks; ++b) {
    const uint8_t* values = group + w.header_bytes + b * value_bytes(Q);
    uint8_t* bytes = out + w.header_bytes + b * 512;
    for (int64_t lane0 = 0; lane0 < 64; lane0 += static_cast<int64_t>(sizeof(VI))) {
      VI high = five_bits(Q) ? load_i(values + 256 + lane0) : zero_i();
      for (int t = 0; t < 4; ++t) {
        const VI v = load_i(values + 64 * t + lane0);
        VI lo = and_i(v, low), hi = and_i(shr4(v), low);
        if constexpr (five_bits(Q)) fifth_bits(lo, hi, high);
        store_i(bytes + 64 * t + lane0, lo);
        store_i(bytes + 64 * (4 + t) + lane0, hi);
      }
    }
  }
}

// rows_t with each group unpacked once (unpack_group), then every activation row against it.
template <BlockQuant Q>
void unpacked_rows(const Q8Block* x, int64_t R, const PackedView& w, int64_t g0, int64_t n, float* y, int64_t ldy) {
  alignas(64) uint8_t bytes[kUnpackedBytes];
  for (int64_t j = 0; j < n; j += kPackedRows) {
    unpack_group<Q>(w, w.data + (g0 + j / kPackedRows) * w.group_bytes, bytes);
    for (int half = 0; half * kLanes < kPackedRows; ++half) {
      const int64_t first = j + half * kLanes;
      if (first >= n) break;
      const int64_t valid = std::min<int64_t>(kLanes, n - first);
      int64_t r = 0;
      for (; r + kMaxRows <= R; r += kMaxRows)
        group_rows<Q, kMaxRows, true>(x + r * w.blocks, w.blocks, w, bytes, half, valid, y + r * ldy + first, ldy, false);
      for (; r < R; ++r)
        group_rows<Q, 1, true>(x + r * w.blocks, w.blocks, w, bytes, half, valid, y + r * ldy + first, ldy, false);
    }
  }
}
#endif

template <BlockQuant Q>
void rows_t(const Q8Block* x, int64_t R, const PackedView& w, int64_t g0, int64_t n, float* y, int64_t ldy) {
#if defined(ATTN_PACKED_VNNI)
  if constexpr (unpacks(Q))
    if (R >= kUnpackFromRows && w.header_bytes + 512 * w.blocks <= kUnpackedBytes)
      return unpacked_rows<Q>(x, R, w, g0, n, y, ldy);
#endif
  int64_t r = 0;
  for (; r + kMaxRows <= R; r += kMaxRows)
    groups_of<Q, kMaxRows>(x + r * w.blocks, w, g0, n, y + r * ldy, ldy, r == 0);
  for (; r < R; ++r) groups_of<Q, 1>(x + r * w.blocks, w, g0, n, y + r * ldy, ldy, r == 0);
}

#else  // plain C++: the same sums, one row at a time

inline float half_at(const uint8_t* p) { return float16_at(p); }

// x . W_i for row i of a K-quant group (one activation row of `blocks` Q8Blocks).
template <BlockQuant Q>
float super_row(const Q8Block* x, int64_t blocks, const uint8_t* group, int64_t i) {
  float acc = 0.0f;
  for (int64_t s = 0; s < blocks / 8; ++s) {
    const Q8Block* xs = x + 8 * s;
    if constexpr (Q != BlockQuant::q6_k) {
      using L = std::conditional_t<Q == BlockQuant::q5_k, packed_q5_k, packed_q4_k>;
      const uint8_t* u = group + s * L::unit;
      const float d = half_at(u + L::d + 2 * i), dmin = half_at(u + L::dmin + 2 * i);
      for (int j = 0; j < 8; ++j) {
        const uint8_t* values = u + L::values + L::pair * (j / 2) + 4 * i;
        int32_t sum = 0;
        for (int t = 0; t < 8; ++t)
          for (int k = 0; k < 4; ++k) {
            int32_t n = (values[64 * t + k] >> (4 * (j % 2))) & 0x0F;
            if constexpr (Q == BlockQuant::q5_k) n |= ((values[64 * (8 + j % 2) + k] >> t) & 1) << 4;
            sum += n * xs[j].q[4 * t + k];
          }
        acc += static_cast<float>(sum * int32_t{u[L::scales + 16 * j + i]}) * (d * xs[j].d);
        acc -= static_cast<float>(u[L::mins + 16 * j + i]) * dmin * xs[j].s;
      }
    } else {
      const uint8_t* u = group + s * packed_q6_k::unit;
      const float d = half_at(u + packed_q6_k::d + 2 * i);
      for (int b = 0; b < 8; ++b) {
        const uint8_t* values = u + packed_q6_k::values + packed_q6_k::block * b + 4 * i;
        int32_t sum[2] = {0, 0}, xsum[2] = {0, 0};
        for (int l = 0; l < 32; ++l) {  // value l: step l % 16 / 4, byte l % 4, nibble and top word l / 16
          const int t = l % 16 / 4, k = l % 4, h = l / 16;
          const int q = ((values[64 * t + k] >> (4 * h)) & 0x0F) | ((values[64 * (4 + h) + k] >> (2 * t)) & 3) << 4;
          sum[h] += q * xs[b].q[l], xsum[h] += xs[b].q[l];
        }
        const auto* sc = reinterpret_cast<const int8_t*>(u + packed_q6_k::scales + 32 * b + i);
        const int32_t isum = (sum[0] - 32 * xsum[0]) * sc[0] + (sum[1] - 32 * xsum[1]) * sc[16];
        acc += static_cast<float>(isum) * (d * xs[b].d);
      }
    }
  }
  return acc;
}

template <BlockQuant Q>
void rows_t(const Q8Block* x, int64_t R, const PackedView& w, int64_t g0, int64_t n, float* y, int64_t ldy) {
  for (int64_t r = 0; r < R; ++r)
    for (int64_t j = 0; j < n; ++j) {
      const int64_t i = j % kPackedRows;
      const uint8_t* group = w.data + (g0 + j / kPackedRows) * w.group_bytes;
      if constexpr (k_quant(Q)) {
        y[r * ldy + j] = super_row<Q>(x + r * w.blocks, w.blocks, group, i);
        continue;
      }
      float acc = 0.0f;
      for (int64_t b = 0; b < w.blocks; ++b) {
        const Q8Block& xb = x[r * w.blocks + b];
        const uint8_t* values = group + w.header_bytes + b * value_bytes(Q) + 4 * i;
        int32_t sum = 0;
        for (int t = 0; t < (Q == BlockQuant::q8_0 ? 8 : 4); ++t)
          for (int k = 0; k < 4; ++k) {
            const uint8_t v = values[64 * t + k];
            if constexpr (Q == BlockQuant::q8_0) {
              sum += (int32_t{v} - 128) * xb.q[4 * t + k];
            } else {
              int32_t lo = v & 0x0F, hi = v >> 4;
              if constexpr (five_bits(Q))  // fifth bits: byte k, bits t and 4 + t
                lo |= ((values[256 + k] >> t) & 1) << 4, hi |= ((values[256 + k] >> (4 + t)) & 1) << 4;
              sum += lo * xb.q[4 * t + k] + hi * xb.q[16 + 4 * t + k];
            }
          }
        if constexpr (Q == BlockQuant::q4_0) sum -= 8 * xb.sum;
        if constexpr (Q == BlockQuant::q5_0) sum -= 16 * xb.sum;
        acc += static_cast<float>(sum) * (half_at(group + 32 * b + 2 * i) * xb.d);
        if constexpr (has_minimums(Q)) acc += half_at(group + 32 * (w.blocks + b) + 2 * i) * xb.s;
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
    case BlockQuant::q5_0: return rows_t<BlockQuant::q5_0>(x, R, w, g0, n, y, ldy);
    case BlockQuant::q5_1: return rows_t<BlockQuant::q5_1>(x, R, w, g0, n, y, ldy);
    case BlockQuant::q4_k: return rows_t<BlockQuant::q4_k>(x, R, w, g0, n, y, ldy);
    case BlockQuant::q5_k: return rows_t<BlockQuant::q5_k>(x, R, w, g0, n, y, ldy);
    case BlockQuant::q6_k: return rows_t<BlockQuant::q6_k>(x, R, w, g0, n, y, ldy);
  }
}

}  // namespace attn::kernels::ATTN_Q8_VARIANT
