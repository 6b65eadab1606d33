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
#include "softmax/score_tile.hpp"
#include "softmax/softmax_backward.hpp"

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

struct Scratch {
  AlignedFloats qt, dot, qs, dor, orows, dq, st, ds, pd, capped, kall, vall;
  AlignedFloats sub{L}, di{L}, scale{L}, ones{L};
  std::vector<float> row;
  std::vector<uint8_t> vis, live;
  void reserve(const Problem& p) {
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
    if (!p.keys(0, 0).plain_f32()) kall.resize(static_cast<size_t>(p.M * p.D));
    if (!p.values(0, 0).plain_f32()) vall.resize(static_cast<size_t>(p.M * p.Dv));
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
       Scratch& s, int64_t b, int64_t hk, float* dk, float* dv)
      : p_(p), g_(g), mask_(mask), kern_(kern), s_(s), b_(b), hk_(hk), dk_(dk), dv_(dv) {}

  void run(int64_t qb0, int64_t qb1) {
    const int64_t len = p_.kv_len[static_cast<size_t>(b_)];
    k_ = kv_f32(kern_, p_.keys(b_, hk_), len, s_.kall, ks_);
    v_ = kv_f32(kern_, p_.values(b_, hk_), len, s_.vall, vs_);
    for (int64_t h = hk_ * p_.group; h < (hk_ + 1) * p_.group; ++h)
      for (int64_t qb = qb0; qb < qb1; ++qb) query_block(h, qb * L);
  }

 private:
  void query_block(int64_t h, int64_t i0) {
    const int64_t nq = std::min<int64_t>(L, p_.N - i0);
    pack(h, i0, nq);
    std::fill(s_.dq.data(), s_.dq.data() + L * p_.D, 0.0f);
    for_each_key_tile(p_, mask_.runs(i0 / L), b_, h, i0, nq, [&](int64_t j0, int64_t bc, bool full) {
      if (full) return tile(h, i0, nq, j0, bc, true, 0, L);
      for_each_lane_group(p_, i0, nq, j0, bc,
                          [&](int64_t a, int64_t n, int lo, int hi) { tile(h, i0, nq, a, n, false, lo, hi); });
    });
    float* row = s_.row.data();
    for (int64_t i = 0; i < nq; ++i) {
      const float scale = s_.scale.data()[i];
      for (int64_t c = 0; c < p_.D; ++c) row[c] = s_.dq.data()[i * p_.D + c] * scale;
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
      for (int64_t c = 0; c < p_.D; ++c) q[c] *= scale;
      kern_.to_float(g_.dout.ptr(b_, h, i0 + i), g_.dout.dtype, g_.dout.strides[3], p_.Dv, dor + i * p_.Dv);
      kern_.to_float(g_.out.ptr(b_, h, i0 + i), g_.out.dtype, g_.out.strides[3], p_.Dv, out + i * p_.Dv);
    }
    kern_.pack_qt(qs, p_.D, static_cast<int>(nq), p_.D, s_.ones.data(), s_.qt.data());
    kern_.pack_qt(dor, p_.Dv, static_cast<int>(nq), p_.Dv, s_.ones.data(), s_.dot.data());
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
    const float* k = k_ + j0 * ks_;
    const float* v = v_ + j0 * vs_;
    const int64_t w = hi - lo;
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
    kern_.qk(s_.dot.data(), p_.Dv, v, vs_, bc, ds, lo, hi);  // ds = dP
    const float* pd = st;  // the weights dV sums: P, or P keep / (1 - dropout)
    if (p_.mech.dropout > 0) {
      dropout(h, i0, nq, j0, bc, lo, hi);
      pd = s_.pd.data();
    }
    const float* di = s_.di.data();
    for (int64_t j = 0; j < bc; ++j) {
      const float* pr = st + j * L;
      float* dr = ds + j * L;
      for (int64_t i = lo; i < hi; ++i) dr[i] = pr[i] * (dr[i] - di[i]);
    }
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
  Scratch& s_;
  int64_t b_, hk_;
  float *dk_, *dv_;
  const float *k_ = nullptr, *v_ = nullptr;
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

}  // namespace

void softmax_backward_tiled(const Problem& p, const BackwardViews& g, const core::Context& ctx) {
  if (p.B == 0 || p.Hkv == 0 || p.N == 0) return;  // dk and dv are 0 (fresh tensors are zeroed)
  if (!finite_inputs(p, g, ctx.threads)) return softmax_backward_rows(p, g, ctx.threads);
  const core::KvGradientTasks tasks(p, (p.N + L - 1) / L, ctx.threads);
  // Everything is sized here: the parallel regions allocate nothing.
  std::vector<Scratch> scratch(static_cast<size_t>(tasks.threads()));
  for (Scratch& s : scratch) s.reserve(p);
  const mask::BlockMask mask(p.pattern, p.N, p.M, p.offset, L, kKeyTile);
  tasks.run(g, *ctx.kern, [&](int64_t b, int64_t hk, int64_t qb0, int64_t qb1, float* dk, float* dv, int tid) {
    Task(p, g, mask, *ctx.kern, scratch[static_cast<size_t>(tid)], b, hk, dk, dv).run(qb0, qb1);
  });
}

}  // namespace attn::exact
