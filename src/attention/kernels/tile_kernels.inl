// The tile primitives, written once over `Vec` and compiled per ISA (see kernel_table.hpp
// for the tile layout). Included inside namespace attn::kernels::<isa> after the Vec header.

constexpr int kLanes = kQueryTile;
constexpr int kPanel = Vec::MR * Vec::W;  // query lanes per micro-tile
static_assert(kLanes % kPanel == 0, "query tile must be a whole number of micro-tiles");

#ifndef ATTN_PORTABLE_MATH
// exp(x) = 2^n * exp(r), n = round(x log2 e), r = x - n ln 2 (ln 2 split in two so r is
// exact), exp(r) by the Cephes expf polynomial: relative error ~1e-7 over the whole range.
// Results below FLT_MIN (x < -87.3) flush to exactly 0, so -inf -> 0 and a masked score
// contributes nothing; +inf -> inf; NaN -> NaN. The clamp at -87.3 keeps the scaling step's
// result normal too: a denormal there costs a microcode assist per lane (masked tiles ran 3x
// slower when the clamp was -88).
inline Vec vexp(Vec x) {
  const Vec xc = Vec::min(Vec::set1(88.7f), Vec::max(Vec::set1(-87.3f), x));  // NaN survives
  const Vec n = Vec::round(xc * Vec::set1(1.44269504088896341f));
  Vec r = Vec::fma(n, Vec::set1(-0.693359375f), xc);
  r = Vec::fma(n, Vec::set1(2.12194440e-4f), r);
  Vec p = Vec::set1(1.9875691500e-4f);
  p = Vec::fma(p, r, Vec::set1(1.3981999507e-3f));
  p = Vec::fma(p, r, Vec::set1(8.3334519073e-3f));
  p = Vec::fma(p, r, Vec::set1(4.1665795894e-2f));
  p = Vec::fma(p, r, Vec::set1(1.6666665459e-1f));
  p = Vec::fma(p, r, Vec::set1(5.0000001201e-1f));
  p = Vec::fma(p * r, r, r + Vec::set1(1.0f));
  return Vec::select_lt(x, Vec::set1(-87.3f), Vec::zero(), Vec::ldexp(p, n));
}

// tanh: odd Taylor series to x^15 for |x| < 1/2 (relative error < 1e-8 there, where the
// exp form would cancel), else sign(x) (1 - e) / (1 + e) with e = exp(-2|x|).
inline Vec vtanh(Vec x) {
  const Vec a = Vec::abs(x);
  const Vec e = vexp(Vec::set1(-2.0f) * a);
  const Vec big = Vec::copysign((Vec::set1(1.0f) - e) / (Vec::set1(1.0f) + e), x);
  const Vec x2 = x * x;
  Vec s = Vec::set1(-929569.0f / 638512875.0f);
  s = Vec::fma(s, x2, Vec::set1(21844.0f / 6081075.0f));
  s = Vec::fma(s, x2, Vec::set1(-1382.0f / 155925.0f));
  s = Vec::fma(s, x2, Vec::set1(62.0f / 2835.0f));
  s = Vec::fma(s, x2, Vec::set1(-17.0f / 315.0f));
  s = Vec::fma(s, x2, Vec::set1(2.0f / 15.0f));
  s = Vec::fma(s, x2, Vec::set1(-1.0f / 3.0f));
  const Vec small = Vec::fma(s * x2, x, x);
  return Vec::select_lt(a, Vec::set1(0.5f), small, big);
}
#endif

// ---- QK^T: St[j][lanes] = sum_c K[j][c] * Qt[c][lanes] --------------------------------------
template <int NR, int MV = Vec::MR>
inline void qk_micro(const float* qt, int64_t d, const float* k, int64_t k_stride, float* st,
                     int lane0) {
  Vec acc[NR][MV];
#pragma GCC unroll 8
  for (int n = 0; n < NR; ++n)
#pragma GCC unroll 8
    for (int m = 0; m < MV; ++m) acc[n][m] = Vec::zero();
  const float* krow[NR];
#pragma GCC unroll 8
  for (int n = 0; n < NR; ++n) krow[n] = k + n * k_stride;
  const float* q = qt + lane0;
  for (int64_t c = 0; c < d; ++c, q += kLanes) {
    Vec qv[MV];
#pragma GCC unroll 8
    for (int m = 0; m < MV; ++m) qv[m] = Vec::load(q + m * Vec::W);
#pragma GCC unroll 8
    for (int n = 0; n < NR; ++n) {
      const Vec kb = Vec::set1(krow[n][c]);
#pragma GCC unroll 8
      for (int m = 0; m < MV; ++m) acc[n][m] = Vec::fma(kb, qv[m], acc[n][m]);
    }
  }
#pragma GCC unroll 8
  for (int n = 0; n < NR; ++n)
#pragma GCC unroll 8
    for (int m = 0; m < MV; ++m) acc[n][m].store(st + n * kLanes + lane0 + m * Vec::W);
}

// Calls micro<MV>(lane0) over lanes [lo, hi) (multiples of kLaneGroup): whole micro-tiles of
// MR vectors, then the fewer vectors left.
template <class Micro>
inline void over_lanes(int lo, int hi, Micro&& micro) {
  int lane0 = lo;
  for (; lane0 + kPanel <= hi; lane0 += kPanel) micro(std::integral_constant<int, Vec::MR>{}, lane0);
  switch ((hi - lane0) / Vec::W) {
    case 1: if constexpr (Vec::MR > 1) micro(std::integral_constant<int, 1>{}, lane0); break;
    case 2: if constexpr (Vec::MR > 2) micro(std::integral_constant<int, 2>{}, lane0); break;
    case 3: if constexpr (Vec::MR > 3) micro(std::integral_constant<int, 3>{}, lane0); break;
    default: break;
  }
}

template <int NR>
inline void qk_block(const float* qt, int64_t d, const float* k, int64_t k_stride, float* st, int lo, int hi) {
  over_lanes(lo, hi, [&](auto mv, int lane0) { qk_micro<NR, decltype(mv)::value>(qt, d, k, k_stride, st, lane0); });
}

// x + (x - x): x where x is finite, NaN where it is not. A score of +-inf comes only from a
// non-finite input (or overflow), and must not pass for a masked key (-inf, weight 0) or win the
// row (+inf): it poisons its row, as NaN does (docs/reliability.md, "Non-finite inputs").
inline Vec poison_infinite(Vec x) { return x + (x - x); }
inline float poison_infinite(float x) { return x + (x - x); }

void qk_scores(const float* qt, int64_t d, const float* k, int64_t k_stride, int64_t bc, float* st, int lo, int hi);

void qk(const float* qt, int64_t d, const float* k, int64_t k_stride, int64_t bc, float* st, int lo, int hi) {
  qk_scores(qt, d, k, k_stride, bc, st, lo, hi);
  for (int64_t j = 0; j < bc; ++j)  // lanes [lo, hi) are whole vectors (multiples of kLaneGroup)
    for (int i = lo; i < hi; i += Vec::W) poison_infinite(Vec::load(st + j * kLanes + i)).store(st + j * kLanes + i);
}

void qk_scores(const float* qt, int64_t d, const float* k, int64_t k_stride, int64_t bc, float* st, int lo, int hi) {
  constexpr int NR = Vec::NR;
  int64_t j = 0;
  for (; j + NR <= bc; j += NR) qk_block<NR>(qt, d, k + j * k_stride, k_stride, st + j * kLanes, lo, hi);
  const float* kr = k + j * k_stride;
  float* sr = st + j * kLanes;
  switch (bc - j) {  // remaining keys, fewer than NR
    case 1: qk_block<1>(qt, d, kr, k_stride, sr, lo, hi); break;
    case 2: qk_block<2>(qt, d, kr, k_stride, sr, lo, hi); break;
    case 3: qk_block<3>(qt, d, kr, k_stride, sr, lo, hi); break;
    case 4: if constexpr (NR > 4) qk_block<4>(qt, d, kr, k_stride, sr, lo, hi); break;
    case 5: if constexpr (NR > 5) qk_block<5>(qt, d, kr, k_stride, sr, lo, hi); break;
    default: break;
  }
}

// ---- online softmax, down the rows of St ----------------------------------------------------
// The statistics terms of a vector of probabilities p = exp(x) (x = score - base <= 0):
// t += p * max(x, -87.3) and q += pz * pz with pz = (x < -43.6 ? 0 : p). The clamps keep every
// product normal (p >= e^-87.3 > FLT_MIN where it is not 0, pz^2 >= e^-87.2) and turn a masked
// score (x = -inf, p = 0) into 0 * -87.3 instead of 0 * -inf = NaN.
inline void stat_terms(Vec x, Vec p, Vec& q, Vec& t) {
  const Vec pz = Vec::select_lt(x, Vec::set1(-43.6f), Vec::zero(), p);
  q = Vec::fma(pz, pz, q);
  t = Vec::fma(p, Vec::max(x, Vec::set1(-87.3f)), t);
}

// One body for softmax_update (Stats = false: exactly the plain step) and softmax_update_stats.
template <bool Stats>
inline void softmax_update_t(float* st, int64_t bc, float* m, float* l, float* alpha, [[maybe_unused]] float* a2,
                             [[maybe_unused]] float* e, [[maybe_unused]] float* cnt, int lo, int hi) {
  const Vec neg_inf = Vec::set1(-__builtin_inff());
  for (int g = lo; g < hi; g += Vec::W) {
    const Vec m_old = Vec::load(m + g);
    Vec mx = m_old;
    for (int64_t j = 0; j < bc; ++j) mx = Vec::max(mx, Vec::load(st + j * kLanes + g));
    const Vec base = Vec::select_eq(mx, neg_inf, Vec::zero(), mx);
    const Vec a = vexp(m_old - base);
    Vec sum = Vec::zero();
    [[maybe_unused]] Vec q = Vec::zero(), t = Vec::zero(), c = Vec::zero();
    for (int64_t j = 0; j < bc; ++j) {
      const Vec s = Vec::load(st + j * kLanes + g);
      const Vec x = s - base;
      const Vec p = vexp(x);
      p.store(st + j * kLanes + g);
      sum = sum + p;
      if constexpr (Stats) {
        stat_terms(x, p, q, t);
        c = c + Vec::select_lt(neg_inf, s, Vec::set1(1.0f), Vec::zero());
      }
    }
    const Vec l_old = Vec::load(l + g);
    Vec::fma(l_old, a, sum).store(l + g);
    mx.store(m + g);
    a.store(alpha + g);
    if constexpr (Stats) {
      const Vec shift = m_old - base;  // <= 0; -inf when the lane had no term yet (then l_old = 0)
      const Vec az = Vec::select_lt(shift, Vec::set1(-43.6f), Vec::zero(), a);  // alpha^2 never denormal
      Vec::fma(az * az, Vec::load(a2 + g), q).store(a2 + g);
      const Vec old = a * Vec::fma(l_old, shift, Vec::load(e + g));  // NaN when l_old = 0: not picked
      (Vec::select_eq(l_old, Vec::zero(), Vec::zero(), old) + t).store(e + g);
      c.store(cnt + g);
    }
  }
}

void softmax_update(float* st, int64_t bc, float* m, float* l, float* alpha, int lo, int hi) {
  softmax_update_t<false>(st, bc, m, l, alpha, nullptr, nullptr, nullptr, lo, hi);
}

void softmax_update_stats(float* st, int64_t bc, float* m, float* l, float* alpha, float* a2, float* e, float* cnt,
                          int lo, int hi) {
  softmax_update_t<true>(st, bc, m, l, alpha, a2, e, cnt, lo, hi);
}

// bits[j] bit i = St[j][i] > thr[i] for lo <= i < hi (the other bits 0), j < bc.
// Per lane, a sorted list of the k largest scores merged with each row of St: a row enters only
// where some lane of the vector beats its k-th; then one compare-exchange pass down the list
// (max stays, min moves on), branch-free across lanes. The list of a lane group stays in registers
// across the rows (K is a compile-time constant, the loops unroll).
template <int K>
void topk_lanes_k(const float* st, int64_t bc, float* list, int lo, int hi) {
  for (int g = lo; g < hi; g += Vec::W) {
    Vec top[K];
    for (int t = 0; t < K; ++t) top[t] = Vec::load(list + t * kLanes + g);
    for (int64_t j = 0; j < bc; ++j) {
      Vec x = Vec::load(st + j * kLanes + g);
      if (!Vec::gt_bits(x, top[K - 1])) continue;
      for (int t = 0; t < K; ++t) {
        const Vec cur = top[t];
        top[t] = Vec::max(x, cur);
        x = Vec::min(x, cur);
      }
    }
    for (int t = 0; t < K; ++t) top[t].store(list + t * kLanes + g);
  }
}

template <int... Ks>
void topk_dispatch(std::integer_sequence<int, Ks...>, const float* st, int64_t bc, float* list, int k, int lo,
                   int hi) {
  ((k == Ks + 1 ? topk_lanes_k<Ks + 1>(st, bc, list, lo, hi) : void()), ...);
}

void topk_lanes(const float* st, int64_t bc, float* list, int k, int lo, int hi) {
  topk_dispatch(std::make_integer_sequence<int, kMaxTopkLanes>{}, st, bc, list, k, lo, hi);
}

void above_bits(const float* st, int64_t bc, const float* thr, int lo, int hi, uint64_t* bits) {
  for (int64_t j = 0; j < bc; ++j) {
    uint64_t w = 0;
    for (int g = lo; g < hi; g += Vec::W)
      w |= static_cast<uint64_t>(Vec::gt_bits(Vec::load(st + j * kLanes + g), Vec::load(thr + g))) << g;
    bits[j] = w;
  }
}

// ---- PV: Ot[c][lanes] = alpha * Ot[c][lanes] + sum_j V[j][c] * Pt[j][lanes] -----------------
template <int NR, int MV = Vec::MR>
inline void pv_micro(const float* pt, int64_t bc, const float* v, int64_t v_stride, float* ot,
                     const float* alpha, int lane0) {
  Vec a[MV];
  Vec acc[NR][MV];
#pragma GCC unroll 8
  for (int m = 0; m < MV; ++m) a[m] = Vec::load(alpha + lane0 + m * Vec::W);
#pragma GCC unroll 8
  for (int n = 0; n < NR; ++n)
#pragma GCC unroll 8
    for (int m = 0; m < MV; ++m)
      acc[n][m] = Vec::load(ot + n * kLanes + lane0 + m * Vec::W) * a[m];
  const float* p = pt + lane0;
  const float* vr = v;
  for (int64_t j = 0; j < bc; ++j, p += kLanes, vr += v_stride) {
    Vec pv[MV];
#pragma GCC unroll 8
    for (int m = 0; m < MV; ++m) pv[m] = Vec::load(p + m * Vec::W);
#pragma GCC unroll 8
    for (int n = 0; n < NR; ++n) {
      const Vec vb = Vec::set1(vr[n]);
#pragma GCC unroll 8
      for (int m = 0; m < MV; ++m) acc[n][m] = Vec::fma(vb, pv[m], acc[n][m]);
    }
  }
#pragma GCC unroll 8
  for (int n = 0; n < NR; ++n)
#pragma GCC unroll 8
    for (int m = 0; m < MV; ++m) acc[n][m].store(ot + n * kLanes + lane0 + m * Vec::W);
}

template <int NR>
inline void pv_block(const float* pt, int64_t bc, const float* v, int64_t v_stride, float* ot,
                     const float* alpha, int lo, int hi) {
  over_lanes(lo, hi, [&](auto mv, int lane0) {
    pv_micro<NR, decltype(mv)::value>(pt, bc, v, v_stride, ot, alpha, lane0);
  });
}

void pv(const float* pt, int64_t bc, const float* v, int64_t v_stride, int64_t dv, float* ot,
        const float* alpha, int lo, int hi) {
  constexpr int NR = Vec::NR;
  int64_t c = 0;
  for (; c + NR <= dv; c += NR) pv_block<NR>(pt, bc, v + c, v_stride, ot + c * kLanes, alpha, lo, hi);
  const float* vc = v + c;
  float* oc = ot + c * kLanes;
  switch (dv - c) {  // remaining value channels, fewer than NR
    case 1: pv_block<1>(pt, bc, vc, v_stride, oc, alpha, lo, hi); break;
    case 2: pv_block<2>(pt, bc, vc, v_stride, oc, alpha, lo, hi); break;
    case 3: pv_block<3>(pt, bc, vc, v_stride, oc, alpha, lo, hi); break;
    case 4: if constexpr (NR > 4) pv_block<4>(pt, bc, vc, v_stride, oc, alpha, lo, hi); break;
    case 5: if constexpr (NR > 5) pv_block<5>(pt, bc, vc, v_stride, oc, alpha, lo, hi); break;
    default: break;
  }
}

// ---- elementwise helpers --------------------------------------------------------------------
void softcap(float* x, int64_t n, float cap) {
  const Vec c = Vec::set1(cap), inv = Vec::set1(1.0f / cap);
  int64_t i = 0;
  // + (x - x): tanh saturates at +-inf, which must poison the row, not become +-cap
  for (; i + Vec::W <= n; i += Vec::W) {
    const Vec v = Vec::load(x + i);
    (c * vtanh(v * inv) + (v - v)).store(x + i);
  }
  for (; i < n; ++i) x[i] = cap * tanhf(x[i] / cap) + (x[i] - x[i]);
}

void exp_rows(float* x, int64_t n, const float* sub) {
  for (int64_t r = 0; r < n; r += kLanes)
    for (int g = 0; g < kLanes; g += Vec::W)
      vexp(Vec::load(x + r + g) - Vec::load(sub + g)).store(x + r + g);
}

void to_float(const void* src, DType dtype, int64_t stride, int64_t n, float* dst) {
  if (stride == 1) {
    if (dtype == DType::f32) {
      const float* s = static_cast<const float*>(src);
      for (int64_t c = 0; c < n; ++c) dst[c] = s[c];
    } else {
      to_float_unit(src, dtype, n, dst);
    }
    return;
  }
  for (int64_t c = 0; c < n; ++c) dst[c] = load_as_float(src, dtype, c * stride);
}

void from_float(const float* src, DType dtype, int64_t stride, int64_t n, void* dst) {
  if (stride == 1) {
    if (dtype == DType::f32) {
      float* d = static_cast<float*>(dst);
      for (int64_t c = 0; c < n; ++c) d[c] = src[c];
    } else {
      from_float_unit(src, dtype, n, dst);
    }
    return;
  }
  for (int64_t c = 0; c < n; ++c) store_from_float(dst, dtype, c * stride, src[c]);
}

// ---- row primitives (few queries, many keys) --------------------------------------------------
// K and V rows are read in their storage type and converted in registers.
template <DType T>
inline Vec load_elems(const void* p, int64_t c) {
  if constexpr (T == DType::bf16) return Vec::loadu_bf16(static_cast<const uint16_t*>(p) + c);
  else if constexpr (T == DType::f16) return Vec::loadu_f16(static_cast<const uint16_t*>(p) + c);
  else if constexpr (T == DType::i8) return Vec::from_i8(static_cast<const int8_t*>(p) + c);  // the integers
  else return Vec::loadu(static_cast<const float*>(p) + c);
}

// Each chunk of K (V) is loaded and converted once per block of rows (GQA: the group's query
// heads share it).
// Dot products of up to 4 query rows with one key row, accumulators in registers.
template <DType T, int NR>
inline void dot_block(const float* q, int64_t d, const void* k, float* out, int64_t out_stride = 1) {
  Vec acc[NR];
#pragma GCC unroll 4
  for (int r = 0; r < NR; ++r) acc[r] = Vec::zero();
  int64_t c = 0;
  for (; c + Vec::W <= d; c += Vec::W) {
    const Vec kv = load_elems<T>(k, c);
#pragma GCC unroll 4
    for (int r = 0; r < NR; ++r) acc[r] = Vec::fma(Vec::loadu(q + r * d + c), kv, acc[r]);
  }
  for (int r = 0; r < NR; ++r) {
    float s = acc[r].reduce_add();
    for (int64_t t = c; t < d; ++t) s += q[r * d + t] * load_as_float(k, T, t);
    out[r * out_stride] = s;
  }
}

template <DType T>
void axpy_rows_t(const float* p, int64_t R, const void* v, int64_t dv, float* acc) {
  int64_t c = 0;
  for (; c + Vec::W <= dv; c += Vec::W) {
    const Vec vv = load_elems<T>(v, c);
    for (int64_t r = 0; r < R; ++r) Vec::fma(Vec::set1(p[r]), vv, Vec::loadu(acc + r * dv + c)).storeu(acc + r * dv + c);
  }
  for (; c < dv; ++c) {
    const float x = load_as_float(v, T, c);
    for (int64_t r = 0; r < R; ++r) acc[r * dv + c] += p[r] * x;
  }
}

void axpy_rows(const float* p, int64_t R, const void* v, DType vt, int64_t dv, float* acc) {
  switch (vt) {
    case DType::bf16: return axpy_rows_t<DType::bf16>(p, R, v, dv, acc);
    case DType::f16: return axpy_rows_t<DType::f16>(p, R, v, dv, acc);
    case DType::i8: return axpy_rows_t<DType::i8>(p, R, v, dv, acc);
    default: return axpy_rows_t<DType::f32>(p, R, v, dv, acc);
  }
}

// Forms of the two for a block of keys given by row addresses (decode: K and V rows are read
// once from memory and reused from registers / L1 by every query row). Key rows are read one
// after the other, each from its start: rows read side by side (several keys per register tile)
// ran ~25% slower from memory here, the hardware prefetchers following such streams poorly;
// rows a few keys ahead are prefetched into L2 (+30% on one thread; 16 keys ahead beat 8 by
// 5-15% on bf16 GQA decode, 32 did not help further). Prefetching the next block's K rows while
// a block's values are summed was tried and ran ~15% slower.
constexpr int64_t kPrefetchKeys = 16;
// Short rows look further ahead, at least this many bytes: int8 rows (64 bytes) 32 keys, ~5 %
// faster than 16 at 8k keys on one Zen 4 thread (4096 bytes gained nothing more).
constexpr int64_t kPrefetchBytes = 2048;
constexpr int64_t kMaxPairedRows = 16;  // query rows per call whose channels qk_rows reorders

// Every cache line the row touches: a row need not start on a line (numpy's buffers are 16-byte
// aligned), and its last line, left out, was a miss per row that doubled decode times. Four
// lines per loop step: the line-by-line loop's branch and address arithmetic stood between
// the score tile's loads (f32 GQA decode from memory 9.7 -> 8.4 ms per 32768 keys here). Keep
// it a plain loop: a switch on the line count made GCC drop every prefetch.
inline void prefetch_row(const void* row, int64_t bytes) {
  const auto start = reinterpret_cast<uintptr_t>(row);
  const uintptr_t end = start + static_cast<uintptr_t>(bytes);
  uintptr_t p = start & ~uintptr_t{63};
  for (; p + 192 < end; p += 256) {
    __builtin_prefetch(reinterpret_cast<const void*>(p), 0, 2);
    __builtin_prefetch(reinterpret_cast<const void*>(p + 64), 0, 2);
    __builtin_prefetch(reinterpret_cast<const void*>(p + 128), 0, 2);
    __builtin_prefetch(reinterpret_cast<const void*>(p + 192), 0, 2);
  }
  for (; p < end; p += 64) __builtin_prefetch(reinterpret_cast<const void*>(p), 0, 2);
}

// Four query rows against two consecutive keys: each chunk of q is loaded once for both keys,
// and each key's four sums come out of one shared shuffle tree (Vec::reduce4).
template <DType T>
inline void dot4_keys2(const float* q, int64_t d, const void* k0, const void* k1, float* s, int64_t lds) {
  Vec a0[4], a1[4];
  for (int r = 0; r < 4; ++r) a0[r] = a1[r] = Vec::zero();
  int64_t c = 0;
  for (; c + Vec::W <= d; c += Vec::W) {
    const Vec x0 = load_elems<T>(k0, c), x1 = load_elems<T>(k1, c);
    for (int r = 0; r < 4; ++r) {
      const Vec qv = Vec::loadu(q + r * d + c);
      a0[r] = Vec::fma(qv, x0, a0[r]);
      a1[r] = Vec::fma(qv, x1, a1[r]);
    }
  }
  float t0[4], t1[4];
  Vec::reduce4(a0[0], a0[1], a0[2], a0[3], t0);
  Vec::reduce4(a1[0], a1[1], a1[2], a1[3], t1);
  for (int r = 0; r < 4; ++r) {
    for (int64_t t = c; t < d; ++t) {
      t0[r] += q[r * d + t] * load_as_float(k0, T, t);
      t1[r] += q[r * d + t] * load_as_float(k1, T, t);
    }
    s[r * lds] = t0[r];
    s[r * lds + 1] = t1[r];
  }
}

// s[r * lds + x] = the sum of a[x][r]'s lanes, by the vector type's 4x4 tree where it has one.
template <class V>
[[gnu::always_inline]] inline void sums4x4(const V (&a)[4][4], float* s, int64_t lds) {
  if constexpr (requires { V::sums4x4(a, s, lds); }) {
    V::sums4x4(a, s, lds);
  } else {
    for (int x = 0; x < 4; ++x) {
      float t[4];
      V::reduce4(a[x][0], a[x][1], a[x][2], a[x][3], t);
      for (int r = 0; r < 4; ++r) s[r * lds + x] = t[r];
    }
  }
}

// Four query rows against four consecutive keys, d a multiple of W: each chunk of q is loaded
// once for four keys (16 accumulators; half the q loads of the pair kernel per key). No scalar
// tail and always inlined: a tail's calls kept the accumulators in memory across the call, and
// the call itself cost as much (f32 decode arithmetic -30 % without either).
template <DType T>
[[gnu::always_inline]] inline void dot4_keys4(const float* q, int64_t d, const void* const* k, float* s, int64_t lds) {
  Vec a[4][4];
  for (int x = 0; x < 4; ++x)
    for (int r = 0; r < 4; ++r) a[x][r] = Vec::zero();
  for (int64_t c = 0; c < d; c += Vec::W) {
    Vec kx[4];
    for (int x = 0; x < 4; ++x) kx[x] = load_elems<T>(k[x], c);
    for (int r = 0; r < 4; ++r) {
      const Vec qv = Vec::loadu(q + r * d + c);
      for (int x = 0; x < 4; ++x) a[x][r] = Vec::fma(qv, kx[x], a[x][r]);
    }
  }
  sums4x4(a, s, lds);
}

// Fewer than four query rows (NR of them: an MHA decode's 1, SmolLM2's 3 per kv head) against
// four consecutive keys, d a multiple of W: each row's four sums share one shuffle tree
// (Vec::reduce4) instead of a horizontal sum per key and row.
template <DType T, int NR>
[[gnu::always_inline]] inline void dot_rows_keys4(const float* q, int64_t d, const void* const* k, float* s, int64_t lds) {
  Vec a[4][NR];
  for (int x = 0; x < 4; ++x)
    for (int r = 0; r < NR; ++r) a[x][r] = Vec::zero();
  for (int64_t c = 0; c < d; c += Vec::W) {
    Vec kx[4];
    for (int x = 0; x < 4; ++x) kx[x] = load_elems<T>(k[x], c);
    for (int r = 0; r < NR; ++r) {
      const Vec qv = Vec::loadu(q + r * d + c);
      for (int x = 0; x < 4; ++x) a[x][r] = Vec::fma(qv, kx[x], a[x][r]);
    }
  }
  for (int r = 0; r < NR; ++r) Vec::reduce4(a[0][r], a[1][r], a[2][r], a[3][r], s + r * lds);
}

// dot4_keys4 for bfloat16 keys, q's channels in pair order (pair_order): each load of 2W key
// values gives W even and W odd channels by a shift and a mask (d a multiple of 2W).
[[gnu::always_inline]] inline void dot4_keys4_bf16_pairs(const float* qp, int64_t d, const void* const* k, float* s,
                                                         int64_t lds) {
  Vec a[4][4];
  for (int x = 0; x < 4; ++x)
    for (int r = 0; r < 4; ++r) a[x][r] = Vec::zero();
  for (int64_t c = 0; c < d; c += 2 * Vec::W) {
    Vec ke[4], ko[4];
    for (int x = 0; x < 4; ++x) Vec::loadu_bf16_pairs(static_cast<const uint16_t*>(k[x]) + c, ke[x], ko[x]);
    for (int r = 0; r < 4; ++r) {
      const Vec qe = Vec::loadu(qp + r * d + c), qo = Vec::loadu(qp + r * d + c + Vec::W);
      for (int x = 0; x < 4; ++x) a[x][r] = Vec::fma(qo, ko[x], Vec::fma(qe, ke[x], a[x][r]));
    }
  }
  sums4x4(a, s, lds);
}

// R rows of d channels, each group of 2W channels reordered as its W even channels then its W odd
// ones: the order loadu_bf16_pairs yields a key's values in.
inline void pair_order(const float* q, int64_t R, int64_t d, float* out) {
  for (int64_t r = 0; r < R; ++r)
    for (int64_t g = 0; g < d; g += 2 * Vec::W)
      for (int64_t t = 0; t < Vec::W; ++t) {
        out[r * d + g + t] = q[r * d + g + 2 * t];
        out[r * d + g + Vec::W + t] = q[r * d + g + 2 * t + 1];
      }
}

template <DType T>
void qk_rows_t(const float* q, int64_t R, int64_t d, const void* const* k, int64_t n, float* s, int64_t lds,
               const void* const* next, int64_t next_bytes) {
  const int64_t bytes = d * static_cast<int64_t>(dtype_size(T));
  const int64_t ahead = std::max<int64_t>(kPrefetchKeys, kPrefetchBytes / std::max<int64_t>(bytes, 1));
  // bfloat16 keys: the groups of four rows in pair order (at most 16 rows of 256 channels here)
  constexpr int64_t kPairedFloats = kMaxPairedRows * 256;
  alignas(64) float qp[T == DType::bf16 ? kPairedFloats : 1];
  const int64_t R4 = R / 4 * 4;
  const bool paired = T == DType::bf16 && Vec::W > 8 && d % (2 * Vec::W) == 0 && R4 * d <= kPairedFloats;
  if (paired) pair_order(q, R4, d, qp);
  int64_t j = 0;
  // keys in fours for the groups of four rows (enough registers: AVX-512; whole vectors of channels)
  if (R >= 4 && Vec::W > 8 && d % Vec::W == 0)
    for (; j + 4 <= n; j += 4) {
      for (int64_t x = 0; x < 4; ++x) {
        if (j + ahead + x < n) prefetch_row(k[j + ahead + x], bytes);
        if (next) prefetch_row(next[j + x], next_bytes);
      }
      int64_t r = 0;
      if (paired)
        for (; r + 4 <= R; r += 4) dot4_keys4_bf16_pairs(qp + r * d, d, k + j, s + r * lds + j, lds);
      else
        for (; r + 4 <= R; r += 4) dot4_keys4<T>(q + r * d, d, k + j, s + r * lds + j, lds);
      for (int64_t jj = j; jj < j + 4; ++jj) switch (R - r) {
          case 3: dot_block<T, 3>(q + r * d, d, k[jj], s + r * lds + jj, lds); break;
          case 2: dot_block<T, 2>(q + r * d, d, k[jj], s + r * lds + jj, lds); break;
          case 1: dot_block<T, 1>(q + r * d, d, k[jj], s + r * lds + jj, lds); break;
          default: break;
        }
    }
  // keys in fours for fewer than four rows (AVX-512: 4 x 3 accumulators and 4 keys in registers)
  if (R < 4 && Vec::W > 8 && d % Vec::W == 0)
    for (; j + 4 <= n; j += 4) {
      for (int64_t x = 0; x < 4; ++x) {
        if (j + ahead + x < n) prefetch_row(k[j + ahead + x], bytes);
        if (next) prefetch_row(next[j + x], next_bytes);
      }
      switch (R) {
        case 3: dot_rows_keys4<T, 3>(q, d, k + j, s + j, lds); break;
        case 2: dot_rows_keys4<T, 2>(q, d, k + j, s + j, lds); break;
        default: dot_rows_keys4<T, 1>(q, d, k + j, s + j, lds); break;
      }
    }
  if (R >= 4)  // keys in pairs for the groups of four rows
    for (; j + 2 <= n; j += 2) {
      if (j + ahead + 1 < n) prefetch_row(k[j + ahead], bytes), prefetch_row(k[j + ahead + 1], bytes);
      if (next) prefetch_row(next[j], next_bytes), prefetch_row(next[j + 1], next_bytes);
      int64_t r = 0;
      for (; r + 4 <= R; r += 4) dot4_keys2<T>(q + r * d, d, k[j], k[j + 1], s + r * lds + j, lds);
      for (int64_t jj = j; jj < j + 2; ++jj) switch (R - r) {
          case 3: dot_block<T, 3>(q + r * d, d, k[jj], s + r * lds + jj, lds); break;
          case 2: dot_block<T, 2>(q + r * d, d, k[jj], s + r * lds + jj, lds); break;
          case 1: dot_block<T, 1>(q + r * d, d, k[jj], s + r * lds + jj, lds); break;
          default: break;
        }
    }
  for (; j < n; ++j) {
    if (j + ahead < n) prefetch_row(k[j + ahead], bytes);
    if (next) prefetch_row(next[j], next_bytes);
    int64_t r = 0;
    for (; r + 4 <= R; r += 4) dot_block<T, 4>(q + r * d, d, k[j], s + r * lds + j, lds);
    switch (R - r) {
      case 3: dot_block<T, 3>(q + r * d, d, k[j], s + r * lds + j, lds); break;
      case 2: dot_block<T, 2>(q + r * d, d, k[j], s + r * lds + j, lds); break;
      case 1: dot_block<T, 1>(q + r * d, d, k[j], s + r * lds + j, lds); break;
      default: break;
    }
  }
}

// acc[r][c0 + ...] += sum_j p[r * ldp + j] * V_j[c0 + ...] over NC vectors of channels, the
// accumulators in registers across the keys (summed in key order).
template <DType T, int NR, int NC>
[[gnu::always_inline]] inline void pv_tile(const float* p, int64_t ldp, const void* const* v, int64_t n, int64_t c0,
                                           float* acc, int64_t dv) {
  Vec a[NR][NC];
  for (int r = 0; r < NR; ++r)
    for (int k = 0; k < NC; ++k) a[r][k] = Vec::loadu(acc + r * dv + c0 + k * Vec::W);
  for (int64_t j = 0; j < n; ++j) {
    Vec vv[NC];
    for (int k = 0; k < NC; ++k) vv[k] = load_elems<T>(v[j], c0 + k * Vec::W);
    for (int r = 0; r < NR; ++r) {
      const Vec pr = Vec::set1(p[r * ldp + j]);
      for (int k = 0; k < NC; ++k) a[r][k] = Vec::fma(pr, vv[k], a[r][k]);
    }
  }
  for (int r = 0; r < NR; ++r)
    for (int k = 0; k < NC; ++k) a[r][k].storeu(acc + r * dv + c0 + k * Vec::W);
}

template <DType T, int NR, int NC>
[[gnu::always_inline]] inline void pv_channels(const float* p, int64_t ldp, const void* const* v, int64_t n, float* acc,
                                               int64_t dv) {
  int64_t c = 0;
  for (; c + NC * Vec::W <= dv; c += NC * Vec::W) pv_tile<T, NR, NC>(p, ldp, v, n, c, acc, dv);
  for (; c + Vec::W <= dv; c += Vec::W) pv_tile<T, NR, 1>(p, ldp, v, n, c, acc, dv);
  for (; c < dv; ++c)
    for (int r = 0; r < NR; ++r) {
      float x = acc[r * dv + c];
      for (int64_t j = 0; j < n; ++j) x += p[r * ldp + j] * load_as_float(v[j], T, c);
      acc[r * dv + c] = x;
    }
}

template <DType T>
void pv_rows_t(const float* p, int64_t ldp, int64_t R, const void* const* v, int64_t n, int64_t dv, float* acc) {
  // Keys per pass: their V rows stay in L1 across the row groups. Each pass reloads the
  // accumulators and sets up its tiles: 32 keys against 16 made the sums 8 % faster (f32, V in L2).
  constexpr int64_t kKeys = 32;
  const int64_t bytes = dv * static_cast<int64_t>(dtype_size(T));
  for (int64_t j = 0; j < n; j += kKeys) {
    const int64_t nj = std::min(kKeys, n - j);
    for (int64_t f = j + kKeys; f < std::min(n, j + 2 * kKeys); ++f) prefetch_row(v[f], bytes);
    int64_t r = 0;
    for (; r + 4 <= R; r += 4) pv_channels<T, 4, 4>(p + r * ldp + j, ldp, v + j, nj, acc + r * dv, dv);
    switch (R - r) {
      case 3: pv_channels<T, 3, 4>(p + r * ldp + j, ldp, v + j, nj, acc + r * dv, dv); break;
      case 2: pv_channels<T, 2, 8>(p + r * ldp + j, ldp, v + j, nj, acc + r * dv, dv); break;
      case 1: pv_channels<T, 1, 8>(p + r * ldp + j, ldp, v + j, nj, acc + r * dv, dv); break;
      default: break;
    }
  }
}

void qk_rows(const float* q, int64_t R, int64_t d, const void* const* k, DType kt, int64_t n, float* s, int64_t lds,
             const void* const* next, int64_t next_bytes) {
  switch (kt) {
    case DType::bf16: qk_rows_t<DType::bf16>(q, R, d, k, n, s, lds, next, next_bytes); break;
    case DType::f16: qk_rows_t<DType::f16>(q, R, d, k, n, s, lds, next, next_bytes); break;
    case DType::i8: qk_rows_t<DType::i8>(q, R, d, k, n, s, lds, next, next_bytes); break;
    default: qk_rows_t<DType::f32>(q, R, d, k, n, s, lds, next, next_bytes); break;
  }
  for (int64_t r = 0; r < R; ++r) {  // +-inf scores poison their rows (poison_infinite)
    float* row = s + r * lds;
    int64_t j = 0;
    for (; j + Vec::W <= n; j += Vec::W) poison_infinite(Vec::loadu(row + j)).storeu(row + j);
    for (; j < n; ++j) row[j] = poison_infinite(row[j]);
  }
}

void pv_rows(const float* p, int64_t ldp, int64_t R, const void* const* v, DType vt, int64_t n, int64_t dv, float* acc) {
  switch (vt) {
    case DType::bf16: return pv_rows_t<DType::bf16>(p, ldp, R, v, n, dv, acc);
    case DType::f16: return pv_rows_t<DType::f16>(p, ldp, R, v, n, dv, acc);
    case DType::i8: return pv_rows_t<DType::i8>(p, ldp, R, v, n, dv, acc);
    default: return pv_rows_t<DType::f32>(p, ldp, R, v, n, dv, acc);
  }
}

// ---- moving between rows and lane-major tiles --------------------------------------------------
// qt[c * 64 + i] = src[i * src_stride + c] * scale[i] for i < n, c < d; lanes n..63 are zero.
void pack_qt(const float* src, int64_t src_stride, int n, int64_t d, const float* scale, float* qt) {
  constexpr int W = Vec::W;
  const int64_t dw = d / W * W;
  for (int i0 = 0; i0 < kLanes; i0 += W) {
    for (int64_t c0 = 0; c0 < dw; c0 += W) {
      Vec r[W];
      for (int k = 0; k < W; ++k)
        r[k] = i0 + k < n ? Vec::loadu(src + (i0 + k) * src_stride + c0) * Vec::set1(scale[i0 + k]) : Vec::zero();
      Vec::transpose(r);
      for (int k = 0; k < W; ++k) r[k].store(qt + (c0 + k) * kLanes + i0);
    }
    for (int64_t c = dw; c < d; ++c)
      for (int k = 0; k < W; ++k) qt[c * kLanes + i0 + k] = i0 + k < n ? src[(i0 + k) * src_stride + c] * scale[i0 + k] : 0.0f;
  }
}

// out[i * out_stride + c] = ot[c * 64 + i] * inv[i] for i < n, c < dv.
void unpack_ot(const float* ot, int64_t dv, const float* inv, int n, float* out, int64_t out_stride) {
  constexpr int W = Vec::W;
  const int64_t dw = dv / W * W;
  for (int i0 = 0; i0 < n; i0 += W) {
    const Vec s = Vec::load(inv + i0);
    if (i0 + W <= n)
      for (int64_t c0 = 0; c0 < dw; c0 += W) {
        Vec r[W];
        for (int k = 0; k < W; ++k) r[k] = Vec::load(ot + (c0 + k) * kLanes + i0) * s;
        Vec::transpose(r);
        for (int k = 0; k < W; ++k) r[k].storeu(out + (i0 + k) * out_stride + c0);
      }
    const int64_t c_from = i0 + W <= n ? dw : 0;  // a last partial group of queries: element by element
    for (int i = i0; i < std::min(n, i0 + W); ++i)
      for (int64_t c = c_from; c < dv; ++c) out[i * out_stride + c] = ot[c * kLanes + i] * inv[i];
  }
}

// See kernel_table.hpp. Two accumulators keep two vectors of loads in flight; a NaN lane leaves
// an accumulator as it was (max takes its second operand then) and is reported instead.
float row_max(const float* x, int64_t n, float init, bool* nan) {
  Vec m0 = Vec::set1(init), m1 = m0;
  uint32_t bad = 0;
  int64_t i = 0;
  for (; i + 2 * Vec::W <= n; i += 2 * Vec::W) {
    const Vec a = Vec::loadu(x + i), b = Vec::loadu(x + i + Vec::W);
    m0 = Vec::max(a, m0);
    m1 = Vec::max(b, m1);
    bad |= Vec::nan_bits(a) | Vec::nan_bits(b);
  }
  for (; i + Vec::W <= n; i += Vec::W) {
    const Vec a = Vec::loadu(x + i);
    m0 = Vec::max(a, m0);
    bad |= Vec::nan_bits(a);
  }
  float m = Vec::max(m0, m1).reduce_max();
  for (; i < n; ++i) {
    bad |= x[i] != x[i];
    m = x[i] > m ? x[i] : m;
  }
  *nan = bad != 0;
  return m;
}

// One body for exp_shift_sum (Stats = false) and exp_shift_stats: out[0..3] = sum p, sum pz^2,
// sum p * xc, count of x > -inf. The tail past the last whole vector uses expf (as it always has).
template <bool Stats>
inline float exp_shift_t(float* x, int64_t n, float sub, [[maybe_unused]] float* out) {
  const Vec s = Vec::set1(sub);
  Vec acc = Vec::zero();
  [[maybe_unused]] const Vec neg_inf = Vec::set1(-__builtin_inff());
  [[maybe_unused]] Vec q = Vec::zero(), t = Vec::zero(), c = Vec::zero();
  int64_t i = 0;
  for (; i + Vec::W <= n; i += Vec::W) {
    const Vec v = Vec::loadu(x + i);
    const Vec y = v - s;
    const Vec e = vexp(y);
    e.storeu(x + i);
    acc = acc + e;
    if constexpr (Stats) {
      stat_terms(y, e, q, t);
      c = c + Vec::select_lt(neg_inf, v, Vec::set1(1.0f), Vec::zero());
    }
  }
  float total = acc.reduce_add();
  [[maybe_unused]] float tq = 0, tt = 0, tc = 0;
  if constexpr (Stats) tq = q.reduce_add(), tt = t.reduce_add(), tc = c.reduce_add();
  for (; i < n; ++i) {
    [[maybe_unused]] const float v = x[i], y = v - sub;
    total += (x[i] = expf(x[i] - sub));
    if constexpr (Stats) {
      const float p = x[i], pz = y < -43.6f ? 0.0f : p;
      tq += pz * pz;
      tt += p * std::max(y, -87.3f);  // NaN y: p is NaN already
      tc += v > -__builtin_inff() ? 1.0f : 0.0f;
    }
  }
  if constexpr (Stats) out[0] = total, out[1] = tq, out[2] = tt, out[3] = tc;
  return total;
}

float exp_shift_sum(float* x, int64_t n, float sub) { return exp_shift_t<false>(x, n, sub, nullptr); }

void exp_shift_stats(float* x, int64_t n, float sub, float* out) { exp_shift_t<true>(x, n, sub, out); }

// ---- small matrix products (linear attention's chunks and states) ------------------------------
// A micro-tile: R rows of C times V vectors of columns, the k-loop broadcasting A's elements and
// loading B's rows; Vec::NR x Vec::MR accumulators at most.
template <int R, int V>
inline void gemm_micro(int64_t k, const float* a, int64_t a_rs, int64_t a_cs, const float* b, int64_t ldb, float* c,
                       int64_t ldc, bool accumulate) {
  Vec acc[R][V];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int v = 0; v < V; ++v) acc[r][v] = accumulate ? Vec::loadu(c + r * ldc + v * Vec::W) : Vec::zero();
  for (int64_t p = 0; p < k; ++p) {
    Vec bv[V];
#pragma GCC unroll 8
    for (int v = 0; v < V; ++v) bv[v] = Vec::loadu(b + p * ldb + v * Vec::W);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const Vec av = Vec::set1(a[r * a_rs + p * a_cs]);
#pragma GCC unroll 8
      for (int v = 0; v < V; ++v) acc[r][v] = Vec::fma(av, bv[v], acc[r][v]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int v = 0; v < V; ++v) acc[r][v].storeu(c + r * ldc + v * Vec::W);
}

// Rows [0, m) of one column panel of V vectors, Vec::NR rows at a time.
template <int V>
inline void gemm_panel(int64_t m, int64_t k, const float* a, int64_t a_rs, int64_t a_cs, const float* b, int64_t ldb,
                       float* c, int64_t ldc, bool accumulate) {
  int64_t i = 0;
  for (; i + Vec::NR <= m; i += Vec::NR)
    gemm_micro<Vec::NR, V>(k, a + i * a_rs, a_rs, a_cs, b, ldb, c + i * ldc, ldc, accumulate);
  const int64_t rest = m - i;
  const float* ai = a + i * a_rs;
  float* ci = c + i * ldc;
  [&]<int... R>(std::integer_sequence<int, R...>) {  // the last rows: one micro-tile of `rest` rows
    ((rest == R + 1 ? gemm_micro<R + 1, V>(k, ai, a_rs, a_cs, b, ldb, ci, ldc, accumulate) : void()), ...);
  }(std::make_integer_sequence<int, Vec::NR - 1>{});
}

// C[i][j] (= or +=) sum_p A(i, p) B[p][j] for i < m, j < n, p < k: A(i, p) at a[i a_rs + p a_cs]
// (either orientation), B and C row-major (unit inner stride).
void gemm(int64_t m, int64_t n, int64_t k, const float* a, int64_t a_rs, int64_t a_cs, const float* b, int64_t ldb,
          float* c, int64_t ldc, bool accumulate) {
  constexpr int64_t panel = Vec::MR * Vec::W;
  int64_t j = 0;
  for (; j + panel <= n; j += panel) gemm_panel<Vec::MR>(m, k, a, a_rs, a_cs, b + j, ldb, c + j, ldc, accumulate);
  for (; j + Vec::W <= n; j += Vec::W) gemm_panel<1>(m, k, a, a_rs, a_cs, b + j, ldb, c + j, ldc, accumulate);
  for (; j < n; ++j)  // columns left over: fewer than one vector; 8 rows' sums side by side, each
    for (int64_t i0 = 0; i0 < m; i0 += 8) {  // still over p in order (one dependent chain per row was the cost)
      const int64_t rows = std::min<int64_t>(8, m - i0);
      float acc[8];
      for (int64_t i = 0; i < rows; ++i) acc[i] = accumulate ? c[(i0 + i) * ldc + j] : 0.0f;
      for (int64_t p = 0; p < k; ++p) {
        const float bp = b[p * ldb + j];
        for (int64_t i = 0; i < rows; ++i) acc[i] += a[(i0 + i) * a_rs + p * a_cs] * bp;
      }
      for (int64_t i = 0; i < rows; ++i) c[(i0 + i) * ldc + j] = acc[i];
    }
}

// x[i] = max(x[i] * scale + bias, 0)^2 * mul for i < n (GAU's squared-ReLU weights).
void relu2_rows(float* x, int64_t n, float scale, float bias, float mul) {
  const Vec s = Vec::set1(scale), b = Vec::set1(bias), m = Vec::set1(mul), zero = Vec::zero();
  int64_t i = 0;
  // A non-finite score (a non-finite q or k) stays NaN: +-inf becomes NaN (poison_infinite),
  // and max(0, NaN) keeps the NaN (the vector max returns its second operand when one is NaN).
  for (; i + Vec::W <= n; i += Vec::W) {
    const Vec y = Vec::max(zero, Vec::fma(poison_infinite(Vec::loadu(x + i)), s, b));
    (y * y * m).storeu(x + i);
  }
  for (; i < n; ++i) {
    const float y = std::max(poison_infinite(x[i]) * scale + bias, 0.0f);  // std::max(NaN, 0) is NaN
    x[i] = y * y * mul;
  }
}

// ---- a gated feed-forward's activations -----------------------------------------------------
// The vector forms evaluate the scalar formulas below in the same order (the portable build's
// vexp and vtanh are std::exp and std::tanh: the same bits as the scalar tail there).
inline float silu_scalar(float x) { return x / (1.0f + std::exp(-x)); }
inline float gelu_tanh_scalar(float x) {
  return 0.5f * x * (1.0f + std::tanh(0.7978845608028654f * (x + 0.044715f * x * x * x)));
}

void silu_gate(float* gate, const float* up, int64_t n) {
  const Vec one = Vec::set1(1.0f);
  int64_t i = 0;
  for (; i + Vec::W <= n; i += Vec::W) {
    const Vec x = Vec::loadu(gate + i);
    (x / (one + vexp(Vec::zero() - x)) * Vec::loadu(up + i)).storeu(gate + i);
  }
  for (; i < n; ++i) gate[i] = silu_scalar(gate[i]) * up[i];
}

void gelu_tanh_gate(float* gate, const float* up, int64_t n) {
  const Vec half = Vec::set1(0.5f), one = Vec::set1(1.0f), k = Vec::set1(0.7978845608028654f),
            c = Vec::set1(0.044715f);
  int64_t i = 0;
  for (; i + Vec::W <= n; i += Vec::W) {
    const Vec x = Vec::loadu(gate + i);
    const Vec t = vtanh(k * (x + c * x * x * x));
    (half * x * (one + t) * Vec::loadu(up + i)).storeu(gate + i);
  }
  for (; i < n; ++i) gate[i] = gelu_tanh_scalar(gate[i]) * up[i];
}

// ---- streamed statistics of direct weight rows ---------------------------------------------------
#ifndef ATTN_PORTABLE_MATH
// log(x) for positive finite x, denormals included: x = m 2^k with m in [sqrt(1/2), sqrt(2)),
// log(x) = k ln 2 + log1p(f), f = m - 1 (exact), log1p(f) = f - f^2/2 + f^3 P(f) with P a
// degree-7 Chebyshev fit of (log1p(f) - f + f^2/2) / f^3 on [sqrt(1/2) - 1, sqrt(2) - 1] (fit
// error 2e-8 relative to log1p with the float coefficients), ln 2 split in two so k ln2_hi is exact.
// Measured (TileKernels.VlogAccuracy, x in [1e-38, 1] and denormals): x vlog(x) within 1.2e-7
// relative of x log x, the rounding of that product included (std::log there: 1.3e-7).
// vlog(0) is not defined (-inf or about -104 depending on the ISA): callers mask x = 0.
inline Vec vlog(Vec x) {
  const Vec tiny = Vec::set1(0x1p-126f);  // below: scale by 2^23 first (the AVX2 bit split needs a normal)
  const Vec xs = Vec::select_lt(x, tiny, x * Vec::set1(0x1p23f), x);
  Vec k = Vec::exponent(xs) - Vec::select_lt(x, tiny, Vec::set1(23.0f), Vec::zero());
  Vec m = Vec::mantissa(xs);
  const Vec sqrt2 = Vec::set1(1.41421356f);
  k = Vec::select_lt(sqrt2, m, k + Vec::set1(1.0f), k);
  m = Vec::select_lt(sqrt2, m, m * Vec::set1(0.5f), m);
  const Vec f = m - Vec::set1(1.0f);
  Vec p = Vec::set1(-7.902743667e-02f);
  p = Vec::fma(p, f, Vec::set1(1.262231916e-01f));
  p = Vec::fma(p, f, Vec::set1(-1.299818307e-01f));
  p = Vec::fma(p, f, Vec::set1(1.421449631e-01f));
  p = Vec::fma(p, f, Vec::set1(-1.664128155e-01f));
  p = Vec::fma(p, f, Vec::set1(2.000104487e-01f));
  p = Vec::fma(p, f, Vec::set1(-2.500030696e-01f));
  p = Vec::fma(p, f, Vec::set1(3.333333135e-01f));
  const Vec r = Vec::fma(p, f, Vec::set1(-0.5f)) * (f * f);  // f^2 (f P - 1/2)
  const Vec y = Vec::fma(k, Vec::set1(-2.12194440e-4f), f + r);
  return Vec::fma(k, Vec::set1(0.693359375f), y);
}
#endif

// See kernel_table.hpp. Pass 1 keeps the running min and max of the values (NaN is skipped by
// max/min with the accumulator second), pass 2 adds the terms relative to the final c.
void weight_row_stats(const float* a, int64_t n, WeightRowAcc& acc, uint64_t* cand) {
  Vec lo = Vec::zero(), hi = Vec::zero();
  uint32_t nan = 0;
  int64_t i = 0;
  for (; i + Vec::W <= n; i += Vec::W) {
    const Vec v = Vec::loadu(a + i);
    lo = Vec::min(v, lo);
    hi = Vec::max(v, hi);
    nan |= Vec::nan_bits(v);
  }
  float mn = -(Vec::zero() - lo).reduce_max(), mx = hi.reduce_max();
  for (; i < n; ++i) {
    const float v = a[i];
    if (v < mn) mn = v;
    if (v > mx) mx = v;
    if (v != v) nan = 1;
  }
  acc.neg |= mn < 0;
  acc.pos |= mx > 0;
  acc.nan |= nan != 0;
  const float c_new = std::max(acc.c, std::max(-mn, mx));
  if (c_new > acc.c && acc.c > 0) {
    const float r = acc.c / c_new;
    acc.e = r * (acc.e + acc.a1 * std::log(r));
    acc.a1 *= r;
    acc.a2 *= r * r;
  }
  acc.c = c_new;

  const bool stats = acc.c > 0;
  // A row whose largest |a| so far is tiny (a denormal c, e.g. far keys decayed towards 0) would
  // overflow 1 / c: the values and c are then first scaled by 2^64 (exact), u = (|a| 2^64) / (c 2^64).
  const bool tiny = acc.c < 0x1p-100f;
  const float pre_s = tiny ? 0x1p64f : 1.0f;
  const float inv_s = stats ? 1.0f / (acc.c * pre_s) : 0.0f;
  const Vec inv = Vec::set1(inv_s), pre = Vec::set1(pre_s), thr = Vec::set1(acc.thr), zero = Vec::zero();
  Vec s1 = zero, s2 = zero, se = zero;
  float t1 = 0, t2 = 0, te = 0;
  for (int64_t w0 = 0; w0 < n; w0 += 64) {  // one word of candidate bits (64 is a multiple of W)
    const int64_t end = std::min(n, w0 + 64);
    uint64_t word = 0;
    int64_t j = w0;
    for (; j + Vec::W <= end; j += Vec::W) {
      const Vec v = Vec::abs(Vec::loadu(a + j));
      word |= static_cast<uint64_t>(Vec::gt_bits(v, thr)) << (j - w0);
      if (stats) {
        const Vec u = tiny ? (v * pre) * inv : v * inv;
        s1 = s1 + u;
        s2 = Vec::fma(u, u, s2);
        se = se + Vec::select_lt(zero, u, u * vlog(u), zero);
      }
    }
    for (; j < end; ++j) {  // the last few values of the row
      const float v = std::fabs(a[j]);
      word |= static_cast<uint64_t>(v > acc.thr) << (j - w0);
      if (stats) {
        const float u = (v * pre_s) * inv_s;
        t1 += u;
        t2 += u * u;
        te += u > 0 ? u * std::log(u) : 0.0f;
      }
    }
    cand[w0 / 64] = word;
  }
  if (stats) {
    acc.a1 += s1.reduce_add() + t1;
    acc.a2 += s2.reduce_add() + t2;
    acc.e += se.reduce_add() + te;
  }
}

// ---- bf16 operands on float32 instructions (the tiled_bf16 form where vdpbf16ps is absent) ----
void scale_lanes(float* st, int64_t bc, const float* scale, int lo, int hi) {
  for (int64_t j = 0; j < bc; ++j)
    for (int i = lo; i < hi; i += Vec::W)
      (Vec::load(st + j * kLanes + i) * Vec::load(scale + i)).store(st + j * kLanes + i);
}

void dsoftmax_lanes(const float* pt, float* dst, const float* di, int64_t bc, int lo, int hi) {
  for (int64_t j = 0; j < bc; ++j)
    for (int i = lo; i < hi; i += Vec::W) {
      const Vec p = Vec::load(pt + j * kLanes + i), dp = Vec::load(dst + j * kLanes + i);
      (p * (dp - Vec::load(di + i))).store(dst + j * kLanes + i);
    }
}

void round_bf16_lanes(float* st, int64_t bc, int lo, int hi) {
  for (int64_t j = 0; j < bc; ++j) round_to_bf16(st + j * kLanes + lo, hi - lo);  // vectorised at this ISA
}

inline const TileKernels& table(Isa isa) {
  static const TileKernels t{.isa = isa,
                             .qk = qk,
                             .softmax_update = softmax_update,
                             .softmax_update_stats = softmax_update_stats,
                             .above_bits = above_bits,
                             .topk_lanes = topk_lanes,
                             .pv = pv,
                             .softcap = softcap,
                             .exp_rows = exp_rows,
                             .to_float = to_float,
                             .axpy_rows = axpy_rows,
                             .row_max = row_max,
                             .exp_shift_sum = exp_shift_sum,
                             .exp_shift_stats = exp_shift_stats,
                             .from_float = from_float,
                             .pack_qt = pack_qt,
                             .unpack_ot = unpack_ot,
                             .gemm = gemm,
                             .relu2_rows = relu2_rows,
                             .silu_gate = silu_gate,
                             .gelu_tanh_gate = gelu_tanh_gate,
                             .weight_row_stats = weight_row_stats,
                             .qk_rows = qk_rows,
                             .pv_rows = pv_rows,
                             .dsoftmax_lanes = dsoftmax_lanes,
                             .scale_lanes = scale_lanes,
                             .round_bf16_lanes = round_bf16_lanes};
  return t;
}
