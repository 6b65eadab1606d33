// The softmax family's tiled backward (formulas: include/attn/backward.hpp; design:
// docs/plans/backward.md): flash-style, from the forward's LSE and output, on the kernel table's
// tile products. For a block of 64 query rows (the lanes) of head h and a tile of bc keys:
//   St  = K Qt                    qk, then softcap, bias/ALiBi and masks as the forward (score_tile)
//   Pt  = exp(St - lse)           exp_rows: the LSE is final, no running max or sum
//   dPt = V dOt                   qk with dO transposed in Q's place
//   dSt = Pt (dPt keep - D_i) softcap'   elementwise; D_i = dO_i . O_i - dlse_i, once per row (qk)
//   dV += P~t dO,  dK += dSt Qs,  dQ += dSt^T K      three gemm calls, accumulating in float32
// Qs holds the rows already multiplied by their scale, so dK needs no scale and dQ takes it once
// at the end. Hidden tiles are never visited (the forward's block mask), so the cost follows the
// pattern.
//
// Tasks: core::KvGradientTasks (bitwise the same for any thread count).
//
// bf16 products (the tiled_bf16 form, AttendOptions::precision): q, k, v and dO rounded to bf16
// (D_i from the rounded dO), P and dS rounded for their products, every sum float32. On vdpbf16ps
// (kernels/bf16_tiles.hpp): St and dPt by qk on pair-packed Qt2 and dOt2 (the scale applied to
// the float32 scores), dV and dK by rows_gemm against q and dO packed as pairs of rows (dK's dS
// times the row's scale before rounding), dQ lane-major by pv against the tile's K pairs, scaled
// at the end. Elsewhere the float32 kernels on the rounded operands (q rounded, then scaled).
//
// Non-finite inputs (q, k, v, dout, out, lse, dlse): 0 * NaN in the tile products would carry a
// hidden key's or a dropped weight's poison into gradients that do not depend on it, so such calls
// are computed by the rows form, which visits exactly the visible pairs (one pass over the inputs
// decides).
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "base/aligned_buffer.hpp"
#include "base/parallel.hpp"
#include "core/kv_gradient_tasks.hpp"
#include "core/nonfinite_rows.hpp"
#include "kernels/bf16_tiles.hpp"
#include "softmax/score_tile.hpp"
#include "softmax/softmax_backward.hpp"
#include "softmax/softmax_tiled.hpp"

namespace attn::exact {
namespace {

constexpr int64_t L = kernels::kQueryTile;

// Float32 rows [0, len) of a kv head: in place when the input is float32 with unit inner stride,
// else converted once per task into `buf`.
const float* kv_f32(const kernels::TileKernels& kern, const core::KvRows& t, int64_t len, AlignedFloats& buf,
                    int64_t& stride) {
  if (t.plain_f32()) {
    stride = t.row_stride_bytes() / static_cast<int64_t>(sizeof(float));
    return reinterpret_cast<const float*>(t.row(0));
  }
  stride = t.dim();
  for (int64_t j = 0; j < len; ++j) t.to_float(kern.to_float, j, buf.data() + j * stride);
  return buf.data();
}

// The float32 rows of kv_f32, every value rounded to bf16 (a copy in buf unless already bf16).
const float* kv_rounded(const kernels::TileKernels& kern, const core::KvRows& t, int64_t len, AlignedFloats& buf,
                        int64_t& stride) {
  const float* f = kv_f32(kern, t, len, buf, stride);
  if (t.dtype() == DType::bf16) return f;
  kernels::round_rows_to_bf16(f, stride, len, t.dim(), buf.data());
  stride = t.dim();
  return buf.data();
}

// bf16 rows [0, len) of a kv head: in place when the input is bf16 with unit inner stride, else
// converted and rounded once per task into `buf` (`row`: one float row of scratch).
const uint16_t* kv_bf16(const kernels::TileKernels& kern, const kernels::Bf16TileKernels& dot, const core::KvRows& t,
                        int64_t len, AlignedFloats& buf, float* row, int64_t& stride) {
  if (t.dtype() == DType::bf16 && t.elem_stride() == 1) {
    stride = t.row_stride_bytes() / static_cast<int64_t>(sizeof(uint16_t));
    return reinterpret_cast<const uint16_t*>(t.row(0));
  }
  stride = t.dim();
  uint16_t* out = reinterpret_cast<uint16_t*>(buf.data());
  for (int64_t j = 0; j < len; ++j) {
    t.to_float(kern.to_float, j, row);
    dot.round_rows(row, t.dim(), 1, t.dim(), out + j * stride);
  }
  return out;
}

struct Scratch {
  AlignedFloats qt, dot, qs, dor, orows, dq, st, ds, pd, capped, kall, vall;
  AlignedFloats sub{L}, di{L}, scale{L}, ones{L};
  // bf16_dot: Qt2, dOt2 (pairs over channels), q and dO as pairs of rows, the tile's K pairs,
  // A rows of rows_gemm, P2 of pv, dQ lane-major, unscaled q rows
  AlignedFloats qt2, dot2, qp, dop, kp, a2, p2, dqt, qrows, kpall;
  std::vector<float> row;
  std::vector<uint8_t> vis, live;
  void reserve(const Problem& p, Products products) {
    if (products == Products::bf16_dot) {
      const auto pairs = [](int64_t n) { return static_cast<size_t>((n + 1) / 2); };
      qt2.resize(pairs(p.D) * L);
      dot2.resize(pairs(p.Dv) * L);
      qp.resize(pairs(L) * static_cast<size_t>(p.D));
      dop.resize(pairs(L) * static_cast<size_t>(p.Dv));
      kp.resize(pairs(kKeyTile) * static_cast<size_t>(p.D));
      kpall.resize(pairs(p.M) * static_cast<size_t>(p.D));
      a2.resize(static_cast<size_t>(kKeyTile) * pairs(L));
      p2.resize(pairs(kKeyTile) * L);
      dqt.resize(static_cast<size_t>(p.D * L));
      qrows.resize(static_cast<size_t>(L * p.D));
      // K and V read in place when bf16 with unit inner stride, else rounded once per task
      if (!(p.k.dtype == DType::bf16 && p.k.strides[3] == 1)) kall.resize(static_cast<size_t>((p.M * p.D + 1) / 2));
      if (!(p.v.dtype == DType::bf16 && p.v.strides[3] == 1)) vall.resize(static_cast<size_t>((p.M * p.Dv + 1) / 2));
    } else if (products == Products::bf16_on_f32) {
      kall.resize(static_cast<size_t>(p.M * p.D));
      vall.resize(static_cast<size_t>(p.M * p.Dv));
    }
    qt.resize(static_cast<size_t>(p.D * L));
    dot.resize(static_cast<size_t>(p.Dv * L));
    qs.resize(static_cast<size_t>(L * p.D));
    dor.resize(static_cast<size_t>(L * p.Dv));
    orows.resize(static_cast<size_t>(L * p.Dv));
    dq.resize(static_cast<size_t>(L * p.D));
    st.resize(static_cast<size_t>(kKeyTile * L));
    ds.resize(static_cast<size_t>(kKeyTile * L));
    if (p.mech.dropout > 0) pd.resize(static_cast<size_t>(kKeyTile * L));
    if (p.mech.softcap > 0) capped.resize(static_cast<size_t>(kKeyTile * L));
    if (products == Products::f32 && !p.keys(0, 0).plain_f32()) kall.resize(static_cast<size_t>(p.M * p.D));
    if (products == Products::f32 && !p.values(0, 0).plain_f32()) vall.resize(static_cast<size_t>(p.M * p.Dv));
    std::fill(ones.data(), ones.data() + L, 1.0f);
    row.resize(static_cast<size_t>(std::max(p.D, p.Dv)));
    vis.resize(L);
    live.resize(kKeyTile);
  }
};

// One task's walk. dk/dv: its sums (M x D, M x Dv float32, zeroed by the caller).
class Task {
 public:
  Task(const Problem& p, const BackwardViews& g, const mask::BlockMask& mask, const kernels::TileKernels& kern,
       const kernels::Bf16TileKernels* dot, Products products, Scratch& s, int64_t b, int64_t hk, float* dk, float* dv)
      : p_(p), g_(g), mask_(mask), kern_(kern), dot_(dot), products_(products), s_(s), b_(b), hk_(hk), dk_(dk),
        dv_(dv) {}

  void run(int64_t qb0, int64_t qb1) {
    const int64_t len = p_.kv_len[static_cast<size_t>(b_)];
    const core::KvRows keys = p_.keys(b_, hk_), values = p_.values(b_, hk_);
    if (products_ == Products::bf16_dot) {
      k16_ = kv_bf16(kern_, *dot_, keys, len, s_.kall, s_.row.data(), ks_);
      v16_ = kv_bf16(kern_, *dot_, values, len, s_.vall, s_.row.data(), vs_);
      // K as pairs of rows once per task: a tile starting at an even key reads its pairs here (a
      // tile of odd length pairs its last key with the next one, whose weight is 0 and value
      // finite: non-finite inputs never reach the tiles)
      dot_->pack_v(k16_, DType::bf16, ks_, len, p_.D, s_.kpall.data_u32());
    } else if (products_ == Products::bf16_on_f32) {
      k_ = kv_rounded(kern_, keys, len, s_.kall, ks_);
      v_ = kv_rounded(kern_, values, len, s_.vall, vs_);
    } else {
      k_ = kv_f32(kern_, keys, len, s_.kall, ks_);
      v_ = kv_f32(kern_, values, len, s_.vall, vs_);
    }
    for (int64_t h = hk_ * p_.group; h < (hk_ + 1) * p_.group; ++h)
      for (int64_t qb = qb0; qb < qb1; ++qb) query_block(h, qb * L);
  }

 private:
  void query_block(int64_t h, int64_t i0) {
    const int64_t nq = std::min<int64_t>(L, p_.N - i0);
    pack(h, i0, nq);
    std::fill(s_.dq.data(), s_.dq.data() + L * p_.D, 0.0f);
    if (products_ == Products::bf16_dot) std::fill(s_.dqt.data(), s_.dqt.data() + p_.D * L, 0.0f);
    for_each_key_tile(p_, mask_.runs(i0 / L), b_, h, i0, nq, [&](int64_t j0, int64_t bc, bool full) {
      if (full) return tile(h, i0, nq, j0, bc, true, 0, L);
      for_each_lane_group(p_, i0, nq, j0, bc,
                          [&](int64_t a, int64_t n, int lo, int hi) { tile(h, i0, nq, a, n, false, lo, hi); });
    });
    float* row = s_.row.data();
    const bool lanes = products_ == Products::bf16_dot;  // dQ lane-major (dqt) or by rows (dq)
    for (int64_t i = 0; i < nq; ++i) {
      const float scale = s_.scale.data()[i];
      for (int64_t c = 0; c < p_.D; ++c)
        row[c] = (lanes ? s_.dqt.data()[c * L + i] : s_.dq.data()[i * p_.D + c]) * scale;
      kern_.from_float(row, g_.dq.dtype, g_.dq.strides[3], p_.D, g_.dq.ptr(b_, h, i0 + i));
    }
  }

  // The block's rows as float32: Qs (scaled q rows) and Qt, dO rows and dOt, D_i, the exp's
  // subtrahend (lse; +inf for rows without keys and lanes past the last row, so their P is 0).
  void pack(int64_t h, int64_t i0, int64_t nq) {
    float* qs = s_.qs.data();
    float* dor = s_.dor.data();
    std::fill(qs, qs + L * p_.D, 0.0f);
    std::fill(dor, dor + L * p_.Dv, 0.0f);
    const float inf = std::numeric_limits<float>::infinity();
    for (int64_t i = 0; i < L; ++i) {
      s_.sub.data()[i] = inf;
      s_.di.data()[i] = 0.0f;
      s_.scale.data()[i] = 0.0f;
    }
    float* out = s_.orows.data();
    std::fill(out, out + L * p_.Dv, 0.0f);
    for (int64_t i = 0; i < nq; ++i) {
      const float lse = g_.lse.at(b_, h, i0 + i, 0);
      if (lse == -inf) continue;  // no visible key: every gradient of the row is 0
      const float scale = static_cast<float>(p_.row_scale(b_, h, i0 + i));
      s_.scale.data()[i] = scale;
      s_.sub.data()[i] = lse;
      float* q = qs + i * p_.D;
      kern_.to_float(p_.q.ptr(b_, h, i0 + i), p_.q.dtype, p_.q.strides[3], p_.D, q);
      kern_.to_float(g_.dout.ptr(b_, h, i0 + i), g_.dout.dtype, g_.dout.strides[3], p_.Dv, dor + i * p_.Dv);
      if (products_ != Products::f32) {  // the operands rounded: q (before its scale) and dO
        kernels::round_to_bf16(q, p_.D);
        kernels::round_to_bf16(dor + i * p_.Dv, p_.Dv);
        if (products_ == Products::bf16_dot) std::copy(q, q + p_.D, s_.qrows.data() + i * p_.D);
      }
      for (int64_t c = 0; c < p_.D; ++c) q[c] *= scale;
      kern_.to_float(g_.out.ptr(b_, h, i0 + i), g_.out.dtype, g_.out.strides[3], p_.Dv, out + i * p_.Dv);
    }
    kern_.pack_qt(qs, p_.D, static_cast<int>(nq), p_.D, s_.ones.data(), s_.qt.data());
    kern_.pack_qt(dor, p_.Dv, static_cast<int>(nq), p_.Dv, s_.ones.data(), s_.dot.data());
    if (products_ == Products::bf16_dot) {
      float* qrows = s_.qrows.data();
      std::fill(qrows + nq * p_.D, qrows + L * p_.D, 0.0f);
      for (int64_t i = 0; i < nq; ++i)  // rows without keys: 0, as in qs
        if (s_.sub.data()[i] == inf) std::fill(qrows + i * p_.D, qrows + (i + 1) * p_.D, 0.0f);
      dot_->pack_qt(qrows, p_.D, static_cast<int>(nq), p_.D, s_.qt2.data_u32());
      dot_->pack_qt(dor, p_.Dv, static_cast<int>(nq), p_.Dv, s_.dot2.data_u32());
      dot_->pack_v(qrows, DType::f32, p_.D, L, p_.D, s_.qp.data_u32());
      dot_->pack_v(dor, DType::f32, p_.Dv, L, p_.Dv, s_.dop.data_u32());
    }
    // D_i = dO_i . O_i by the kernel that makes dP_ij = dO_i . v_j, summed in the same order: where
    // the weights are one-hot, O_i = v_j and dP_ij - D_i cancels exactly, as in a plain backward
    // (the diagonal of O dOt; the rest of the tile is not used).
    float* od = s_.st.data();
    kern_.qk(s_.dot.data(), p_.Dv, out, p_.Dv, nq, od, 0, L);
    for (int64_t i = 0; i < nq; ++i) {
      if (s_.sub.data()[i] == inf) continue;
      float di = od[i * L + i];  // less the gradient through lse_i (d lse_i / d t_ij = P_ij)
      if (!g_.dlse.empty()) di -= g_.dlse.at(b_, h, i0 + i, 0);
      s_.di.data()[i] = di;
    }
  }

  // Keys [j0, j0 + bc) against lanes [lo, hi) (the lanes that see any of them; all 64 for a full
  // tile): only those lanes are computed and summed.
  void tile(int64_t h, int64_t i0, int64_t nq, int64_t j0, int64_t bc, bool full, int lo, int hi) {
    float* st = s_.st.data();
    float* ds = s_.ds.data();
    const bool dot = products_ == Products::bf16_dot;
    const float* k = dot ? nullptr : k_ + j0 * ks_;
    const float* v = dot ? nullptr : v_ + j0 * vs_;
    const int64_t w = hi - lo;
    if (dot)
      dot_->qk(s_.qt2.data_u32(), p_.D, k16_ + j0 * ks_, ks_, bc, s_.scale.data(), st, lo, hi);
    else
      kern_.qk(s_.qt.data(), p_.D, k, ks_, bc, st, lo, hi);
    const float cap = static_cast<float>(p_.mech.softcap);
    if (cap > 0)
      for (int64_t j = 0; j < bc; ++j) {
        kern_.softcap(st + j * L + lo, w, cap);
        std::copy(st + j * L + lo, st + j * L + hi, s_.capped.data() + j * L + lo);
      }
    add_score_terms(p_, b_, h, i0, nq, j0, bc, st);
    if (!full) mask_scores(p_, b_, h, i0, nq, j0, bc, st, s_.vis.data(), s_.live.data());
    if (w < L) {  // lanes outside [lo, hi) hold no score of this tile: weight 0
      const float neg_inf = -std::numeric_limits<float>::infinity();
      for (int64_t j = 0; j < bc; ++j) {
        std::fill(st + j * L, st + j * L + lo, neg_inf);
        std::fill(st + j * L + hi, st + (j + 1) * L, neg_inf);
      }
    }
    kern_.exp_rows(st, bc * L, s_.sub.data());  // st = P
    if (dot)  // ds = dP
      dot_->qk(s_.dot2.data_u32(), p_.Dv, v16_ + j0 * vs_, vs_, bc, s_.ones.data(), ds, lo, hi);
    else
      kern_.qk(s_.dot.data(), p_.Dv, v, vs_, bc, ds, lo, hi);
    const float* pd = st;  // the weights dV sums: P, or P keep / (1 - dropout)
    if (p_.mech.dropout > 0) {
      dropout(h, i0, nq, j0, bc, lo, hi);
      pd = s_.pd.data();
    }
    kern_.dsoftmax_lanes(st, ds, s_.di.data(), bc, lo, hi);
    if (cap > 0) {  // d cap tanh(s / cap) / ds = 1 - tanh^2 = 1 - (t / cap)^2
      const float inv = 1.0f / cap;
      for (int64_t j = 0; j < bc; ++j) {
        const float* t = s_.capped.data() + j * L;
        float* dr = ds + j * L;
        for (int64_t i = lo; i < hi; ++i) {
          const float th = t[i] * inv;
          dr[i] *= 1.0f - th * th;
        }
      }
    }
    if (dot) {
      uint32_t* a2 = s_.a2.data_u32();
      dot_->rows_gemm(pd, bc, nullptr, lo, hi, s_.dop.data_u32(), p_.Dv, dv_ + j0 * p_.Dv, p_.Dv, a2);
      dot_->rows_gemm(ds, bc, s_.scale.data(), lo, hi, s_.qp.data_u32(), p_.D, dk_ + j0 * p_.D, p_.D, a2);
      const uint32_t* kp = s_.kpall.data_u32() + j0 / 2 * p_.D;
      if (j0 % 2 != 0) {
        dot_->pack_v(k16_ + j0 * ks_, DType::bf16, ks_, bc, p_.D, s_.kp.data_u32());
        kp = s_.kp.data_u32();
      }
      dot_->pv(ds, bc, kp, p_.D, s_.dqt.data(), s_.ones.data(), s_.p2.data_u32(), lo, hi);
      return;
    }
    if (products_ == Products::bf16_on_f32) {  // P and dS rounded for their products
      kern_.round_bf16_lanes(const_cast<float*>(pd), bc, lo, hi);
      kern_.round_bf16_lanes(ds, bc, lo, hi);
    }
    kern_.gemm(bc, p_.Dv, w, pd + lo, L, 1, s_.dor.data() + lo * p_.Dv, p_.Dv, dv_ + j0 * p_.Dv, p_.Dv, true);
    kern_.gemm(bc, p_.D, w, ds + lo, L, 1, s_.qs.data() + lo * p_.D, p_.D, dk_ + j0 * p_.D, p_.D, true);
    kern_.gemm(w, p_.D, bc, ds + lo, 1, L, k, ks_, s_.dq.data() + lo * p_.D, p_.D, true);
  }

  // pd = P keep / (1 - dropout) and dP *= keep / (1 - dropout), the forward's mask regenerated.
  void dropout(int64_t h, int64_t i0, int64_t nq, int64_t j0, int64_t bc, int lo, int hi) {
    const float f = static_cast<float>(1.0 / (1.0 - p_.mech.dropout));
    float* st = s_.st.data();
    float* ds = s_.ds.data();
    float* pd = s_.pd.data();
    for (int64_t j = 0; j < bc; ++j)
      for (int64_t i = lo; i < hi; ++i) {
        const int64_t e = j * L + i;
        const bool keep = i < nq && dropout_keep(p_.mech.seed, p_.mech.dropout, b_, h, i0 + i, j0 + j);
        pd[e] = keep ? st[e] * f : 0.0f;
        ds[e] = keep ? ds[e] * f : 0.0f;
      }
  }

  const Problem& p_;
  const BackwardViews& g_;
  const mask::BlockMask& mask_;
  const kernels::TileKernels& kern_;
  const kernels::Bf16TileKernels* dot_;  // bf16_dot only
  Products products_;
  Scratch& s_;
  int64_t b_, hk_;
  float *dk_, *dv_;
  const float *k_ = nullptr, *v_ = nullptr;
  const uint16_t *k16_ = nullptr, *v16_ = nullptr;  // bf16_dot
  int64_t ks_ = 0, vs_ = 0;
};

// lse is -inf for rows without keys: anything else non-finite (NaN, +inf) is poison.
bool finite_lse(const TensorView& lse) {
  for (int64_t b = 0; b < lse.shape[0]; ++b)
    for (int64_t h = 0; h < lse.shape[1]; ++h)
      for (int64_t i = 0; i < lse.shape[2]; ++i) {
        const float x = lse.at(b, h, i, 0);
        if (std::isnan(x) || x == std::numeric_limits<float>::infinity()) return false;
      }
  return true;
}

bool finite_inputs(const Problem& p, const BackwardViews& g, int threads) {
  return core::all_finite(p.q, threads) && core::all_finite(p.k, threads, &p.kv_len) &&
         core::all_finite(p.v, threads, &p.kv_len) && core::all_finite(g.dout, threads) &&
         core::all_finite(g.out, threads) && finite_lse(g.lse) && core::all_finite(g.dlse, threads);
}

void backward_tiled(const Problem& p, const BackwardViews& g, const core::Context& ctx, bool bf16) {
  if (p.B == 0 || p.Hkv == 0 || p.N == 0) return;  // dk and dv are 0 (fresh tensors are zeroed)
  if (!finite_inputs(p, g, ctx.threads)) return softmax_backward_rows(p, g, ctx.threads);
  const kernels::Bf16TileKernels* dot;
  const Products products = products_for(bf16, ctx.kern->isa, dot);
  const core::KvGradientTasks tasks(p, (p.N + L - 1) / L, ctx.threads);
  // Everything is sized here: the parallel regions allocate nothing.
  std::vector<Scratch> scratch(static_cast<size_t>(tasks.threads()));
  for (Scratch& s : scratch) s.reserve(p, products);
  const mask::BlockMask mask(p.pattern, p.N, p.M, p.offset, L, kKeyTile);
  tasks.run(g, *ctx.kern, [&](int64_t b, int64_t hk, int64_t qb0, int64_t qb1, float* dk, float* dv, int tid) {
    Task(p, g, mask, *ctx.kern, dot, products, scratch[static_cast<size_t>(tid)], b, hk, dk, dv).run(qb0, qb1);
  });
}

}  // namespace

void softmax_backward_tiled(const Problem& p, const BackwardViews& g, const core::Context& ctx) {
  backward_tiled(p, g, ctx, false);
}

void softmax_backward_tiled_bf16(const Problem& p, const BackwardViews& g, const core::Context& ctx) {
  backward_tiled(p, g, ctx, true);
}

}  // namespace attn::exact
