// Tile primitives, one set per instruction set, chosen at run time in one place
// (kernels_for). Nothing here knows about masks or mechanisms.
//
// Tiles are "query-lane major": a tile row holds kQueryTile = 64 floats, one per query of
// the current query block, so a row of St is one key against 64 queries. Softmax over keys
// then runs down the rows (vertical vector ops, no horizontal reductions), K and V are read
// in place through broadcasts, and only Q is packed (transposed) once per query block.
//   Qt (d, 64)   St/Pt (bc, 64)   Ot (dv, 64)   m, l, alpha (64)
// All tile pointers are 64-byte aligned. K/V rows have unit inner stride.
#pragma once
#include <cstdint>

#include "attn/dtype.hpp"
#include "attn/isa.hpp"

namespace attn::kernels {

constexpr int kQueryTile = 64;
// qk, softmax_update and pv may be asked for a range of lanes [lo, hi), in multiples of this:
// the other lanes are left as they are (St undefined there; m, l, alpha, Ot untouched). A caller
// does so for keys that no lane outside the range sees, where skipping them is exact.
constexpr int kLaneGroup = 16;
// topk_lanes keeps at most this many values per lane (in registers).
constexpr int kMaxTopkLanes = 16;

// The running summary of one row of direct weights (weight_row_stats): c the largest |a| so far
// (0: none yet), a1 = sum u, a2 = sum u^2, e = sum u log u with u = |a| / c; signs seen; thr the
// caller's top-k threshold in |a| (candidates are values above it).
struct WeightRowAcc {
  float c = 0, a1 = 0, a2 = 0, e = 0, thr = 0;
  bool neg = false, pos = false, nan = false;
};

struct TileKernels {
  Isa isa;
  // St[j][i] = sum_c K[j][c] * Qt[c][i]   for j < bc, lo <= i < hi; K row j at k + j*k_stride.
  void (*qk)(const float* qt, int64_t d, const float* k, int64_t k_stride, int64_t bc, float* st, int lo, int hi);
  // Online softmax step over bc rows of St (in place St -> Pt = exp(St - m_new)):
  //   m_new = max(m, max_j St[j]); alpha = exp(m - m_new); l = alpha*l + sum_j Pt[j]; m = m_new.
  // A lane whose m_new is -inf uses 0 as its base, so it yields p = 0, alpha = 0, never NaN.
  void (*softmax_update)(float* st, int64_t bc, float* m, float* l, float* alpha, int lo, int hi);
  // softmax_update plus the row statistics of the new probabilities, per lane i in [lo, hi):
  // with base the same as softmax_update's (m_new, or 0 when m_new is -inf), x = St - base,
  // p = exp(x) (the value stored into St), xc = max(x, -87.3f), pz = (x < -43.6f ? 0 : p):
  //   a2[i] = alpha^2 * a2[i] + sum_j pz*pz
  //   e[i]  = (l_old[i] == 0 ? 0 : alpha * (e[i] + l_old[i] * (m_old - base)))  +  sum_j p * xc
  //   cnt[i] = number of j with St[j][i] > -inf   (written, not accumulated: this call's count)
  // St, m, l and alpha are bitwise identical to softmax_update's (one template body with a
  // `bool Stats` parameter, so the plain path does not change at all). alpha^2 is taken as 0
  // when m_old - base < -43.6 (alpha < 1.2e-19), so it is never denormal: the part lost is
  // < 1.4e-38 of the old a2, against the new a2 >= 1 (the new maximum has pz = 1).
  // a2, e, cnt are 64-byte aligned like m; lanes outside [lo, hi) are untouched.
  void (*softmax_update_stats)(float* st, int64_t bc, float* m, float* l, float* alpha, float* a2, float* e,
                               float* cnt, int lo, int hi);
  // bits[j] bit i (for lo <= i < hi) = St[j][i] > thr[i], for j < bc; bits outside [lo, hi) are 0.
  void (*above_bits)(const float* st, int64_t bc, const float* thr, int lo, int hi, uint64_t* bits);
  // The k largest scores per lane, 1 <= k <= kMaxTopkLanes (the tile forms' top-k for row statistics):
  // list[t * 64 + i] for t < k holds lane i's largest values seen so far in descending order
  // (-inf: fewer than k yet; 64-byte aligned); each row St[j] (j < bc) is merged in, lanes
  // lo <= i < hi. A score equal to the k-th leaves the multiset of the k largest unchanged.
  void (*topk_lanes)(const float* st, int64_t bc, float* list, int k, int lo, int hi);
  // Ot[c][i] = alpha[i]*Ot[c][i] + sum_j V[j][c] * Pt[j][i]   for c < dv, lo <= i < hi; V row j
  // at v + j*v_stride.
  void (*pv)(const float* pt, int64_t bc, const float* v, int64_t v_stride, int64_t dv, float* ot,
             const float* alpha, int lo, int hi);
  // x[i] = cap * tanh(x[i] / cap) for i < n; x 64-byte aligned.
  void (*softcap)(float* x, int64_t n, float cap);
  // x[i] = exp(x[i] - sub[i % 64]) for i < n (n a multiple of 64): probabilities pass.
  void (*exp_rows)(float* x, int64_t n, const float* sub);
  // dst[c] = float(src[c * stride]) for c < n.
  void (*to_float)(const void* src, DType dtype, int64_t stride, int64_t n, float* dst);
  // Row primitive (linear attention's recurrent state update):
  // acc[r][c] += p[r] * v[c] for r < R, c < dv (acc: R rows of dv floats; v: dv values of `vt`).
  void (*axpy_rows)(const float* p, int64_t R, const void* v, DType vt, int64_t dv, float* acc);
  // max(init, x[0..n)) for unaligned x, any n; *nan = whether some x[i] is NaN (the maximum
  // of the others is returned then). Max is exact, so the order of comparison changes nothing.
  float (*row_max)(const float* x, int64_t n, float init, bool* nan);
  // x[i] = exp(x[i] - sub) for i < n; returns the sum of the results.
  float (*exp_shift_sum)(float* x, int64_t n, float sub);
  // exp_shift_sum with statistics (the rows/decode form), unaligned x, any n:
  //   x[i] = p = exp(x[i] - sub); out[0] = sum p, out[1] = sum pz*pz, out[2] = sum p * xc,
  //   out[3] = count of x[i] > -inf (before the exp), with xc, pz defined from x[i] - sub as in
  //   softmax_update_stats. out[0] equals exp_shift_sum's return value bitwise (shared body).
  void (*exp_shift_stats)(float* x, int64_t n, float sub, float* out);
  // dst[c * stride] = src[c] rounded to `dtype` (nearest even) for c < n.
  void (*from_float)(const float* src, DType dtype, int64_t stride, int64_t n, void* dst);
  // Between float32 rows and lane-major tiles (transposes, with a per-query factor):
  // Qt[c][i] = src[i * src_stride + c] * scale[i] for i < n, c < d; lanes n..63 zero.
  void (*pack_qt)(const float* src, int64_t src_stride, int n, int64_t d, const float* scale, float* qt);
  // out[i * out_stride + c] = Ot[c][i] * inv[i] for i < n, c < dv (inv 64-byte aligned).
  void (*unpack_ot)(const float* ot, int64_t dv, const float* inv, int n, float* out, int64_t out_stride);
  // Small row-major products (linear attention's chunks and states), unaligned:
  // C[i][j] (accumulate ? += : =) sum_p A(i, p) * B[p][j] for i < m, j < n, p < k, where
  // A(i, p) = a[i * a_rs + p * a_cs] (so A or its transpose, read in place), B row p at b + p*ldb,
  // C row i at c + i*ldc. Summation runs over p in order, per element.
  void (*gemm)(int64_t m, int64_t n, int64_t k, const float* a, int64_t a_rs, int64_t a_cs, const float* b,
               int64_t ldb, float* c, int64_t ldc, bool accumulate);
  // x[i] = max(x[i] * scale + bias, 0)^2 * mul for i < n (squared-ReLU weights).
  void (*relu2_rows)(float* x, int64_t n, float scale, float bias, float mul);
  // gate[i] = act(gate[i]) * up[i] for i < n: a gated feed-forward's activations, elementwise
  // (SwiGLU: silu(x) = x / (1 + exp(-x)); GeGLU: GELU's tanh form 0.5 x (1 + tanh(sqrt(2/pi)
  // (x + 0.044715 x^3)))). Whole vectors first, then a scalar tail: callers that split the work
  // cut it at multiples of 64 so each element takes the same path for any split.
  void (*silu_gate)(float* gate, const float* up, int64_t n);
  void (*gelu_tanh_gate)(float* gate, const float* up, int64_t n);
  // Direct (non-softmax) weight rows, e.g. relu^2 or linear attention rows, streamed in pieces
  // into one WeightRowAcc. For the n values a[0..n) (unaligned, any n):
  //   pass 1: c_new = max(acc.c, max_j |a_j|); if c_new > acc.c > 0 rescale: r = acc.c / c_new,
  //           a1 *= r, a2 *= r*r, e = r * (e + a1_old * log(r)); set acc.neg |= any a_j < 0,
  //           acc.pos |= any a_j > 0 (NaN: set acc.nan = true); acc.c = c_new.
  //   pass 2 (if acc.c > 0): u = |a_j| * (1 / acc.c) (a multiply by the rounded reciprocal, not
  //           a division: u is within 1 ulp of |a_j| / c, the max may give 1 +- 1 ulp; when c is
  //           tiny, < 2^-100, both are scaled by 2^64 first so that 1 / c cannot overflow):
  //           a1 += u, a2 += u*u, e += (u > 0 ? u * log(u) : 0);
  //           cand bit j (word j/64, bit j%64) = |a_j| > acc.thr; cand has (n+63)/64 words, all
  //           written (also when acc.c is 0).
  // NaN values are left out of c but make a1 and a2 NaN; a +-inf value makes c inf and the sums
  // NaN. Either way the row is degenerate (the caller reports NaN).
  void (*weight_row_stats)(const float* a, int64_t n, WeightRowAcc& acc, uint64_t* cand);
  // Decode-shaped blocks of keys given by row addresses (paged or not; unit inner stride, `kt`):
  // s[r * lds + j] = q[r] . K_j for r < R, j < n (q: R rows of d floats), register-blocked over
  // rows, each key row read once for up to 4 query rows. `next` (null, or n addresses of rows of
  // next_bytes each, e.g. the block's V rows) is prefetched into L2 alongside, key by key.
  // int8 rows (kt and vt DType::i8) are read as their integers: the caller applies the row scales.
  void (*qk_rows)(const float* q, int64_t R, int64_t d, const void* const* k, DType kt, int64_t n, float* s,
                  int64_t lds, const void* const* next, int64_t next_bytes);
  // acc[r * dv + c] += sum_j p[r * ldp + j] * V_j[c] for r < R, c < dv, keys j < n summed in order,
  // accumulators held in registers across the keys.
  void (*pv_rows)(const float* p, int64_t ldp, int64_t R, const void* const* v, DType vt, int64_t n, int64_t dv,
                  float* acc);
  // The softmax backward's dS from P and dP, lanes [lo, hi) of bc tile rows (64-byte aligned):
  // dst[j][i] = pt[j][i] * (dst[j][i] - di[i])   (dst holds dP on entry).
  void (*dsoftmax_lanes)(const float* pt, float* dst, const float* di, int64_t bc, int lo, int hi);
  // bf16 products on float32 instructions (softmax_tiled.cpp where vdpbf16ps is absent), lanes
  // [lo, hi) of bc tile rows (64-byte aligned): x[j][i] *= scale[i]; x[j][i] = round_to_bf16(x[j][i]).
  void (*scale_lanes)(float* st, int64_t bc, const float* scale, int lo, int hi);
  void (*round_bf16_lanes)(float* st, int64_t bc, int lo, int hi);
};

// The kernel set for `isa` (throws Error if this CPU cannot run it).
const TileKernels& kernels_for(Isa isa);

}  // namespace attn::kernels
