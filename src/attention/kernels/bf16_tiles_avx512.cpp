// The bf16 tile primitives on AVX512-BF16 (bf16_tiles.hpp). Compiled with the avx512 level's
// flags and -mavx512bf16; kernel_table.cpp hands them out only when the CPU has the extension.
// Micro-tiles mirror the float32 kernels': NR keys (QK) or value channels (PV) against MV
// vectors of 16 query lanes, 24 accumulators at most.
#include <immintrin.h>

#include <cstring>

#include "kernels/bf16_tiles.hpp"
#include "kernels/kernel_table.hpp"

namespace attn::kernels::avx512_bf16 {
namespace {

constexpr int kLanes = kQueryTile;
constexpr int NR = 6;

inline __m512bh as_bh(__m512i x) { return reinterpret_cast<__m512bh&>(x); }
inline __m512i pair_at(const uint16_t* p) {  // a row's values p[0], p[1] as one 32-bit word, broadcast
  uint32_t w;
  std::memcpy(&w, p, sizeof w);
  return _mm512_set1_epi32(static_cast<int>(w));
}
// 16 words (a[i], b[i]) from 16 floats each, rounded to bf16 (nearest even).
inline __m512i pairs_of(__m512 a, __m512 b) {
  const __m512i idx = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6, 21,
                                       5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  const __m512bh ab = _mm512_cvtne2ps_pbh(b, a);  // a in the low 16 halves, b in the high
  return _mm512_permutexvar_epi16(idx, reinterpret_cast<const __m512i&>(ab));
}

template <int N, int MV>
void qk_micro(const uint32_t* qt2, int64_t d, const uint16_t* k, int64_t k_stride, const float* scale, float* st,
              int lane0) {
  __m512 acc[N][MV];
#pragma GCC unroll 8
  for (int n = 0; n < N; ++n)
#pragma GCC unroll 8
    for (int m = 0; m < MV; ++m) acc[n][m] = _mm512_setzero_ps();
  const int64_t pairs = d / 2;
  const uint32_t* q = qt2 + lane0;
  for (int64_t t = 0; t < pairs; ++t, q += kLanes) {
    __m512bh qv[MV];
#pragma GCC unroll 8
    for (int m = 0; m < MV; ++m) qv[m] = as_bh(_mm512_load_si512(q + m * 16));
#pragma GCC unroll 8
    for (int n = 0; n < N; ++n) {
      const __m512bh kb = as_bh(pair_at(k + n * k_stride + 2 * t));
#pragma GCC unroll 8
      for (int m = 0; m < MV; ++m) acc[n][m] = _mm512_dpbf16_ps(acc[n][m], qv[m], kb);
    }
  }
  if (d & 1) {  // the last value alone (its pair's high half is 0 in Qt2); never read past the row
    __m512bh qv[MV];
#pragma GCC unroll 8
    for (int m = 0; m < MV; ++m) qv[m] = as_bh(_mm512_load_si512(q + m * 16));
#pragma GCC unroll 8
    for (int n = 0; n < N; ++n) {
      const __m512bh kb = as_bh(_mm512_set1_epi32(k[n * k_stride + d - 1]));
#pragma GCC unroll 8
      for (int m = 0; m < MV; ++m) acc[n][m] = _mm512_dpbf16_ps(acc[n][m], qv[m], kb);
    }
  }
#pragma GCC unroll 8
  for (int m = 0; m < MV; ++m) {
    const __m512 s = _mm512_load_ps(scale + lane0 + m * 16);
#pragma GCC unroll 8
    for (int n = 0; n < N; ++n) {
      const __m512 x = _mm512_mul_ps(acc[n][m], s);
      _mm512_store_ps(st + n * kLanes + lane0 + m * 16, _mm512_add_ps(x, _mm512_sub_ps(x, x)));  // +-inf: NaN
    }
  }
}

template <int N>
void qk_keys(const uint32_t* qt2, int64_t d, const uint16_t* k, int64_t k_stride, const float* scale, float* st,
             int lo, int hi) {
  int lane0 = lo;
  for (; lane0 + 64 <= hi; lane0 += 64) qk_micro<N, 4>(qt2, d, k, k_stride, scale, st, lane0);
  switch ((hi - lane0) / 16) {
    case 1: qk_micro<N, 1>(qt2, d, k, k_stride, scale, st, lane0); break;
    case 2: qk_micro<N, 2>(qt2, d, k, k_stride, scale, st, lane0); break;
    case 3: qk_micro<N, 3>(qt2, d, k, k_stride, scale, st, lane0); break;
    default: break;
  }
}

void qk(const uint32_t* qt2, int64_t d, const uint16_t* k, int64_t k_stride, int64_t bc, const float* scale, float* st,
        int lo, int hi) {
  int64_t j = 0;
  for (; j + NR <= bc; j += NR) qk_keys<NR>(qt2, d, k + j * k_stride, k_stride, scale, st + j * kLanes, lo, hi);
  const uint16_t* kr = k + j * k_stride;
  float* sr = st + j * kLanes;
  switch (bc - j) {
    case 1: qk_keys<1>(qt2, d, kr, k_stride, scale, sr, lo, hi); break;
    case 2: qk_keys<2>(qt2, d, kr, k_stride, scale, sr, lo, hi); break;
    case 3: qk_keys<3>(qt2, d, kr, k_stride, scale, sr, lo, hi); break;
    case 4: qk_keys<4>(qt2, d, kr, k_stride, scale, sr, lo, hi); break;
    case 5: qk_keys<5>(qt2, d, kr, k_stride, scale, sr, lo, hi); break;
    default: break;
  }
}

template <int N, int MV>
void pv_micro(const uint32_t* p2, int64_t pairs, const uint32_t* vp, int64_t dv, float* ot, const float* alpha,
              int lane0) {
  __m512 acc[N][MV];
#pragma GCC unroll 8
  for (int m = 0; m < MV; ++m) {
    const __m512 a = _mm512_load_ps(alpha + lane0 + m * 16);
#pragma GCC unroll 8
    for (int n = 0; n < N; ++n) acc[n][m] = _mm512_mul_ps(_mm512_load_ps(ot + n * kLanes + lane0 + m * 16), a);
  }
  const uint32_t* p = p2 + lane0;
  for (int64_t t = 0; t < pairs; ++t, p += kLanes, vp += dv) {
    __m512bh pv[MV];
#pragma GCC unroll 8
    for (int m = 0; m < MV; ++m) pv[m] = as_bh(_mm512_load_si512(p + m * 16));
#pragma GCC unroll 8
    for (int n = 0; n < N; ++n) {
      const __m512bh vb = as_bh(_mm512_set1_epi32(static_cast<int>(vp[n])));
#pragma GCC unroll 8
      for (int m = 0; m < MV; ++m) acc[n][m] = _mm512_dpbf16_ps(acc[n][m], pv[m], vb);
    }
  }
#pragma GCC unroll 8
  for (int n = 0; n < N; ++n)
#pragma GCC unroll 8
    for (int m = 0; m < MV; ++m) _mm512_store_ps(ot + n * kLanes + lane0 + m * 16, acc[n][m]);
}

template <int N>
void pv_channels(const uint32_t* p2, int64_t pairs, const uint32_t* vp, int64_t dv, float* ot, const float* alpha,
                 int lo, int hi) {
  int lane0 = lo;
  for (; lane0 + 64 <= hi; lane0 += 64) pv_micro<N, 4>(p2, pairs, vp, dv, ot, alpha, lane0);
  switch ((hi - lane0) / 16) {
    case 1: pv_micro<N, 1>(p2, pairs, vp, dv, ot, alpha, lane0); break;
    case 2: pv_micro<N, 2>(p2, pairs, vp, dv, ot, alpha, lane0); break;
    case 3: pv_micro<N, 3>(p2, pairs, vp, dv, ot, alpha, lane0); break;
    default: break;
  }
}

void pv(const float* pt, int64_t bc, const uint32_t* vp, int64_t dv, float* ot, const float* alpha, uint32_t* p2,
        int lo, int hi) {
  const int64_t pairs = (bc + 1) / 2;
  for (int64_t t = 0; t < pairs; ++t)
    for (int g = lo; g < hi; g += 16) {
      const __m512 a = _mm512_load_ps(pt + 2 * t * kLanes + g);
      const __m512 b = 2 * t + 1 < bc ? _mm512_load_ps(pt + (2 * t + 1) * kLanes + g) : _mm512_setzero_ps();
      _mm512_store_si512(p2 + t * kLanes + g, pairs_of(a, b));
    }
  int64_t c = 0;
  for (; c + NR <= dv; c += NR) pv_channels<NR>(p2, pairs, vp + c, dv, ot + c * kLanes, alpha, lo, hi);
  const uint32_t* vc = vp + c;
  float* oc = ot + c * kLanes;
  switch (dv - c) {
    case 1: pv_channels<1>(p2, pairs, vc, dv, oc, alpha, lo, hi); break;
    case 2: pv_channels<2>(p2, pairs, vc, dv, oc, alpha, lo, hi); break;
    case 3: pv_channels<3>(p2, pairs, vc, dv, oc, alpha, lo, hi); break;
    case 4: pv_channels<4>(p2, pairs, vc, dv, oc, alpha, lo, hi); break;
    case 5: pv_channels<5>(p2, pairs, vc, dv, oc, alpha, lo, hi); break;
    default: break;
  }
}

void pack_qt(const float* src, int64_t src_stride, int n, int64_t d, uint32_t* qt2) {
  const int64_t pairs = (d + 1) / 2;
  std::memset(qt2, 0, static_cast<size_t>(pairs * kLanes) * sizeof(uint32_t));
  alignas(64) uint16_t row16[2 * 2048 + 32];  // one row rounded (d <= 4096 here; larger d below)
  for (int i = 0; i < n; ++i) {
    const float* row = src + i * src_stride;
    if (d > 2 * 2048) {  // very wide heads: one pair at a time
      for (int64_t t = 0; t < pairs; ++t) {
        const uint32_t lo = float_to_bf16(row[2 * t]);
        const uint32_t hi = 2 * t + 1 < d ? float_to_bf16(row[2 * t + 1]) : 0u;
        qt2[t * kLanes + i] = lo | (hi << 16);
      }
      continue;
    }
    int64_t c = 0;
    for (; c + 16 <= d; c += 16) {
      const __m256bh b = _mm512_cvtneps_pbh(_mm512_loadu_ps(row + c));
      _mm256_store_si256(reinterpret_cast<__m256i*>(row16 + c), reinterpret_cast<const __m256i&>(b));
    }
    for (; c < d; ++c) row16[c] = float_to_bf16(row[c]);
    row16[d] = 0;  // the odd d's last high half
    for (int64_t t = 0; t < pairs; ++t) {
      uint32_t w;
      std::memcpy(&w, row16 + 2 * t, sizeof w);
      qt2[t * kLanes + i] = w;
    }
  }
}

void round_rows(const float* src, int64_t src_stride, int64_t rows, int64_t d, uint16_t* dst) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* s = src + r * src_stride;
    uint16_t* o = dst + r * d;
    int64_t c = 0;
    for (; c + 16 <= d; c += 16) {
      const __m256bh b = _mm512_cvtneps_pbh(_mm512_loadu_ps(s + c));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(o + c), reinterpret_cast<const __m256i&>(b));
    }
    for (; c < d; ++c) o[c] = float_to_bf16(s[c]);
  }
}

void pack_v(const void* v, DType vt, int64_t v_stride, int64_t bc, int64_t dv, uint32_t* vp) {
  const int64_t pairs = (bc + 1) / 2;
  for (int64_t t = 0; t < pairs; ++t) {
    const bool two = 2 * t + 1 < bc;
    uint32_t* out = vp + t * dv;
    int64_t c = 0;
    if (vt == DType::bf16) {
      const uint16_t* a = static_cast<const uint16_t*>(v) + 2 * t * v_stride;
      const uint16_t* b = a + v_stride;
      const __m512i lo_idx = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9, 40, 8, 39, 7, 38,
                                              6, 37, 5, 36, 4, 35, 3, 34, 2, 33, 1, 32, 0);
      const __m512i hi_idx = _mm512_add_epi16(lo_idx, _mm512_set1_epi16(16));
      for (; c + 32 <= dv; c += 32) {
        const __m512i x = _mm512_loadu_si512(a + c);
        const __m512i y = two ? _mm512_loadu_si512(b + c) : _mm512_setzero_si512();
        _mm512_storeu_si512(out + c, _mm512_permutex2var_epi16(x, lo_idx, y));
        _mm512_storeu_si512(out + c + 16, _mm512_permutex2var_epi16(x, hi_idx, y));
      }
      for (; c < dv; ++c) out[c] = a[c] | (two ? static_cast<uint32_t>(b[c]) << 16 : 0u);
    } else {
      const float* a = static_cast<const float*>(v) + 2 * t * v_stride;
      const float* b = a + v_stride;
      for (; c + 16 <= dv; c += 16)
        _mm512_storeu_si512(out + c, pairs_of(_mm512_loadu_ps(a + c), two ? _mm512_loadu_ps(b + c) : _mm512_setzero_ps()));
      for (; c < dv; ++c)
        out[c] = float_to_bf16(a[c]) | (two ? static_cast<uint32_t>(float_to_bf16(b[c])) << 16 : 0u);
    }
  }
}

// out rows [j0, j0 + N) x channels [c0, c0 + 16 MV) (the last vector masked by `tail`).
template <int N, int MV>
void rows_micro(const uint32_t* a2, int t0, int t1, const uint32_t* bp, int64_t n, float* out, int64_t ldo,
                int64_t c0, __mmask16 tail) {
  __m512 acc[N][MV];
#pragma GCC unroll 8
  for (int r = 0; r < N; ++r)
#pragma GCC unroll 8
    for (int m = 0; m < MV; ++m)
      acc[r][m] = _mm512_maskz_loadu_ps(m == MV - 1 ? tail : __mmask16(0xffff), out + r * ldo + c0 + m * 16);
  for (int t = t0; t < t1; ++t) {
    __m512bh b[MV];
#pragma GCC unroll 8
    for (int m = 0; m < MV; ++m)
      b[m] = as_bh(_mm512_maskz_loadu_epi32(m == MV - 1 ? tail : __mmask16(0xffff), bp + t * n + c0 + m * 16));
#pragma GCC unroll 8
    for (int r = 0; r < N; ++r) {
      const __m512bh a = as_bh(_mm512_set1_epi32(static_cast<int>(a2[r * 32 + t])));
#pragma GCC unroll 8
      for (int m = 0; m < MV; ++m) acc[r][m] = _mm512_dpbf16_ps(acc[r][m], a, b[m]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < N; ++r)
#pragma GCC unroll 8
    for (int m = 0; m < MV; ++m)
      _mm512_mask_storeu_ps(out + r * ldo + c0 + m * 16, m == MV - 1 ? tail : __mmask16(0xffff), acc[r][m]);
}

template <int N>
void rows_block(const uint32_t* a2, int t0, int t1, const uint32_t* bp, int64_t n, float* out, int64_t ldo) {
  int64_t c = 0;
  for (; c + 64 <= n; c += 64) rows_micro<N, 4>(a2, t0, t1, bp, n, out, ldo, c, 0xffff);
  const int64_t left = n - c;  // 0..63 channels: whole vectors, the last one masked
  if (left == 0) return;
  const int vecs = static_cast<int>((left + 15) / 16);
  const __mmask16 tail = static_cast<__mmask16>(left % 16 == 0 ? 0xffff : (1u << (left % 16)) - 1);
  switch (vecs) {
    case 1: rows_micro<N, 1>(a2, t0, t1, bp, n, out, ldo, c, tail); break;
    case 2: rows_micro<N, 2>(a2, t0, t1, bp, n, out, ldo, c, tail); break;
    case 3: rows_micro<N, 3>(a2, t0, t1, bp, n, out, ldo, c, tail); break;
    default: rows_micro<N, 4>(a2, t0, t1, bp, n, out, ldo, c, tail); break;
  }
}

void rows_gemm(const float* at, int64_t bc, const float* scale, int lo, int hi, const uint32_t* bp, int64_t n,
               float* out, int64_t ldo, uint32_t* a2) {
  // A's rows as lane pairs: 16 lanes of a row are 8 consecutive pairs once rounded
  for (int64_t j = 0; j < bc; ++j)
    for (int g = lo; g < hi; g += 16) {
      __m512 x = _mm512_load_ps(at + j * kLanes + g);
      if (scale) x = _mm512_mul_ps(x, _mm512_load_ps(scale + g));
      const __m256bh h = _mm512_cvtneps_pbh(x);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(a2 + j * 32 + g / 2), reinterpret_cast<const __m256i&>(h));
    }
  const int t0 = lo / 2, t1 = hi / 2;
  int64_t j = 0;
  for (; j + NR <= bc; j += NR) rows_block<NR>(a2 + j * 32, t0, t1, bp, n, out + j * ldo, ldo);
  const uint32_t* ar = a2 + j * 32;
  float* orow = out + j * ldo;
  switch (bc - j) {
    case 1: rows_block<1>(ar, t0, t1, bp, n, orow, ldo); break;
    case 2: rows_block<2>(ar, t0, t1, bp, n, orow, ldo); break;
    case 3: rows_block<3>(ar, t0, t1, bp, n, orow, ldo); break;
    case 4: rows_block<4>(ar, t0, t1, bp, n, orow, ldo); break;
    case 5: rows_block<5>(ar, t0, t1, bp, n, orow, ldo); break;
    default: break;
  }
}

}  // namespace

const Bf16TileKernels& kernel_table() {
  static const Bf16TileKernels table{"avx512-bf16", pack_qt, round_rows, qk, pack_v, pv, rows_gemm};
  return table;
}

}  // namespace attn::kernels::avx512_bf16
