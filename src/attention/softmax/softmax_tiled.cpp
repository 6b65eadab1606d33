// Work item = (batch, head, block of 64 queries); items are independent, so results do not
// depend on the thread count. Per item:
//   1. pack Q^T (d x 64), each row pre-multiplied by its scale (and 1/|q| for cosine);
//   2. for each key tile of the block's runs in the compiled block mask (src/sparse/):
//        St = K Q^T, score transforms (cosine, softcap, bias, ALiBi), the pattern's element
//        test and the boolean mask on partial tiles only,
//        online softmax update, dropout, Ot = alpha*Ot + V^T Pt;
//   3. O = Ot^T / l, lse = m + log l (zeros and -inf for rows that saw no key);
//   4. if probabilities are requested, a second pass recomputes St and writes exp(St - lse).
// Row statistics (return_stats) ride along in step 2 (core/lane_stats.hpp), and step 3 puts one
// summary per row into the sink.
#include "softmax/softmax_tiled.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <vector>

#include "base/aligned_buffer.hpp"
#include "base/parallel.hpp"
#include "core/nonfinite_rows.hpp"
#include "core/kv_rows.hpp"
#include "core/lane_stats.hpp"
#include "kernels/bf16_tiles.hpp"
#include "softmax/score_tile.hpp"
#include "softmax/softmax_rows.hpp"
#include "mask/block_mask.hpp"

namespace attn::exact {
namespace {

constexpr int64_t L = kernels::kQueryTile;

bool is_plain_f32(const TensorView& v) { return v.dtype == DType::f32 && v.strides[3] == 1; }

// 1/l for a row's softmax sum: 0 when it saw no key (l = 0), NaN when l is NaN.
float inverse_sum(float l) { return l > 0 ? 1.0f / l : l == 0 ? 0.0f : std::numeric_limits<float>::quiet_NaN(); }

// Inputs that are not float32 with unit inner stride (bf16, fp16, strided) are converted to
// float32 rows. Converted rows of the kv head a thread is working on are kept, so the query
// blocks of that head convert each row once instead of once per block. Bounded per thread
// (AttendOptions::row_cache_bytes).

struct RowCache {
  int64_t b = -1, h = -1;
  AlignedFloats rows;          // (M, dim) float32
  std::vector<uint8_t> done;   // row j converted?
  bool enabled = false;
  void reserve(int64_t m, int64_t dim, int64_t limit_bytes) {
    enabled = m * dim * static_cast<int64_t>(sizeof(float)) <= limit_bytes;
    if (!enabled) return;
    rows.resize(static_cast<size_t>(m * dim));
    done.resize(static_cast<size_t>(m));
  }
  // Rows [j0, j0 + n) of head (b, h) as float32, converting those not yet converted.
  const float* get(const kernels::TileKernels& kern, const core::KvRows& t, int64_t b, int64_t h, int64_t j0, int64_t n) {
    const int64_t dim = t.dim();
    if (b != this->b || h != this->h) {
      std::fill(done.begin(), done.end(), 0);
      this->b = b, this->h = h;
    }
    for (int64_t j = j0; j < j0 + n; ++j)
      if (!done[j]) {
        t.to_float(kern.to_float, j, rows.data() + j * dim);
        done[j] = 1;
      }
    return rows.data() + j0 * dim;
  }
};

// bf16_dot: V rows of the kv head a thread is working on, packed as key pairs (Vp) once per
// key tile of 64 instead of once per query block: tiles starting at multiples of 64 that are not
// poisoned (then every query block's tile there has the same pairs; a tile cut shorter by a lane
// group packs again, and the next whole one too); bounded per thread like RowCache.
struct PairCache {
  int64_t b = -1, h = -1, dv = 0;
  AlignedFloats words;           // (ceil(M / 2), dv) 32-bit pairs
  std::vector<int32_t> packed;   // per tile: the number of keys packed (0: none yet)
  bool enabled = false;
  void reserve(int64_t m, int64_t dim, int64_t limit_bytes) {
    const int64_t pairs = (m + 1) / 2;
    enabled = pairs * dim * static_cast<int64_t>(sizeof(uint32_t)) <= limit_bytes;
    if (!enabled) return;
    dv = dim;
    words.resize(static_cast<size_t>(pairs * dim));
    packed.resize(static_cast<size_t>((m + kKeyTile - 1) / kKeyTile));
  }
  // Vp of keys [j0, j0 + bc) of head (b, h) (j0 a multiple of kKeyTile), packing them if needed.
  const uint32_t* get(const kernels::Bf16TileKernels& kern, const core::KvRows& t, int64_t b, int64_t h, int64_t j0,
                      int64_t bc) {
    if (b != this->b || h != this->h) {
      std::fill(packed.begin(), packed.end(), 0);
      this->b = b, this->h = h;
    }
    uint32_t* out = reinterpret_cast<uint32_t*>(words.data()) + j0 / 2 * dv;
    int32_t& done = packed[static_cast<size_t>(j0 / kKeyTile)];
    if (done != bc) {
      kern.pack_v(t.row(j0), DType::bf16, t.row_stride_bytes() / static_cast<int64_t>(sizeof(uint16_t)), bc, dv, out);
      done = static_cast<int32_t>(bc);
    }
    return out;
  }
};

bool is_plain_bf16(const core::KvRows& t) { return t.dtype() == DType::bf16 && t.elem_stride() == 1; }

struct Scratch {
  AlignedFloats qt, st, ot, kbuf, vbuf, qp, kp, qrows;
  AlignedFloats m{L}, l{L}, alpha{L}, inv{L}, lane_scale{L};
  std::vector<float> ones = std::vector<float>(L, 1.0f);  // bf16_on_f32: Q^T packed unscaled
  AlignedFloats qt2, k16, vp, p2;  // bf16_dot: 32-bit pairs (k16: bf16 rows), bf16_tiles.hpp's layouts
  std::vector<float> row_scale = std::vector<float>(L);
  std::vector<float> row;
  std::vector<uint8_t> live, vis;
  RowCache kcache, vcache;
  PairCache vpairs;
  core::LaneStats stats;  // row statistics, when asked for
  void reserve(const Problem& p, int64_t row_cache_bytes, int64_t topk, Products products) {
    if (topk > 0) stats.reserve(topk);
    const bool dot = products == Products::bf16_dot;
    // bf16_dot reads plain bf16 rows in place: no float32 copies of them to keep
    if (!is_plain_f32(p.k) && !(dot && p.k.dtype == DType::bf16 && p.k.strides[3] == 1))
      kcache.reserve(p.M, p.D, row_cache_bytes);
    if (!is_plain_f32(p.v) && !(dot && p.v.dtype == DType::bf16 && p.v.strides[3] == 1))
      vcache.reserve(p.M, p.Dv, row_cache_bytes);
    if (dot) {
      const auto pairs = [](int64_t n) { return static_cast<size_t>((n + 1) / 2); };
      qt2.resize(pairs(p.D) * L);
      k16.resize(pairs(kKeyTile * p.D));
      vp.resize(pairs(kKeyTile) * static_cast<size_t>(p.Dv));
      p2.resize(pairs(kKeyTile) * L);
      if (p.v.dtype == DType::bf16 && p.v.strides[3] == 1) vpairs.reserve(p.M, p.Dv, row_cache_bytes);
    }
    qt.resize(static_cast<size_t>(p.D * L));
    if (!is_plain_f32(p.q)) qrows.resize(static_cast<size_t>(L * p.D));
    st.resize(static_cast<size_t>(kKeyTile * L));
    ot.resize(static_cast<size_t>(p.Dv * L));
    kbuf.resize(static_cast<size_t>(kKeyTile * p.D));
    vbuf.resize(static_cast<size_t>(kKeyTile * p.Dv));
    row.resize(static_cast<size_t>(std::max(p.D, p.Dv)));
    live.resize(kKeyTile);
    vis.resize(L);
    if (p.A > 0) {
      qp.resize(static_cast<size_t>(L * p.A));
      kp.resize(static_cast<size_t>(kKeyTile * p.A));
    }
  }
};

class Block {
 public:
  Block(const Problem& p, const mask::BlockMask& mask, const kernels::TileKernels& kern,
        const kernels::Bf16TileKernels* dot, Products products, Scratch& s, int64_t b, int64_t h, int64_t i0,
        const core::NonFiniteRows& nonfinite)
      : p_(p), kern_(kern), dot_(dot), products_(products), s_(s), nonfinite_(nonfinite), b_(b), h_(h),
        hk_(p.kv_head(h)), i0_(i0),
        nq_(std::min<int64_t>(L, p.N - i0)), runs_(mask.runs(i0 / L)), krows_(p.keys(b, hk_)), vrows_(p.values(b, hk_)) {}

  void run(const TensorView& out, const TensorView* lse, const TensorView* probs, const core::StatsSink* stats) {
    pack_queries();
    float* m = s_.m.data();
    float* l = s_.l.data();
    std::fill(m, m + L, -std::numeric_limits<float>::infinity());
    std::fill(l, l + L, 0.0f);
    std::fill(s_.ot.data(), s_.ot.data() + p_.Dv * L, 0.0f);
    if (stats) s_.stats.start();
    auto step = [&](int64_t j0, int64_t bc, bool full, int lo, int hi) {
      const bool all_live = scores(j0, bc, full, lo, hi);
      if (stats)
        s_.stats.update(kern_, s_.st.data(), bc, m, l, s_.alpha.data(), lo, hi);
      else
        kern_.softmax_update(s_.st.data(), bc, m, l, s_.alpha.data(), lo, hi);
      if (p_.mech.dropout > 0) apply_dropout(j0, bc);
      const bool poisoned = nonfinite_.any(b_, hk_, j0, bc);
      weigh_values(j0, bc, all_live, poisoned, lo, hi);
      if (poisoned) poison_lanes(j0, bc, lo, hi);
    };
    for_each_tile([&](int64_t j0, int64_t bc, bool full) {
      if (full) return step(j0, bc, true, 0, L);
      for_each_lane_group(p_, i0_, nq_, j0, bc,
                          [&](int64_t a, int64_t n, int lo, int hi) { step(a, n, false, lo, hi); });
    });
    write_outputs(out, lse);
    if (stats) write_stats(*stats);
    if (probs) write_probs(*probs);
  }

 private:
  void write_stats(const core::StatsSink& sink) {
    for (int i = 0; i < nq_; ++i) sink.put(b_, h_, i0_ + i, s_.stats.summary(i, s_.m.data()[i], s_.l.data()[i]));
  }


  template <class Fn>
  void for_each_tile(Fn&& fn) const {
    for_each_key_tile(p_, runs_, b_, h_, i0_, nq_, fn);
  }

  // Q^T with per-row scale (as float32, whatever the input's dtype or strides, so every layout
  // gives the same bits); lanes past the last query stay zero. Additive scores project q instead.
  void pack_queries() {
    const float* rows;
    int64_t stride;
    if (is_plain_f32(p_.q)) {
      rows = reinterpret_cast<const float*>(p_.q.ptr(b_, h_, i0_));
      stride = p_.q.strides[2];
    } else {
      for (int64_t i = 0; i < nq_; ++i)
        kern_.to_float(p_.q.ptr(b_, h_, i0_ + i), p_.q.dtype, p_.q.strides[3], p_.D, s_.qrows.data() + i * p_.D);
      rows = s_.qrows.data();
      stride = p_.D;
    }
    for (int64_t i = 0; i < nq_; ++i) {
      double scale = p_.row_scale(b_, h_, i0_ + i);
      if (p_.mech.score == ScoreKind::cosine) scale /= std::sqrt(std::max(sum_sq(rows + i * stride, p_.D), 1e-30));
      s_.row_scale[i] = static_cast<float>(scale);
      if (p_.mech.score == ScoreKind::additive) project(rows + i * stride, p_.wq.data(), s_.qp.data() + i * p_.A);
    }
    if (p_.mech.score == ScoreKind::additive) return;
    const int n = static_cast<int>(nq_);
    if (products_ == Products::f32) return kern_.pack_qt(rows, stride, n, p_.D, s_.row_scale.data(), s_.qt.data());
    // bf16: q itself rounded, its scale applied in float32 (to the scores, or to the rounded q)
    float* lane_scale = s_.lane_scale.data();
    for (int64_t i = 0; i < L; ++i) lane_scale[i] = i < nq_ ? s_.row_scale[i] : 0.0f;
    if (products_ == Products::bf16_dot)
      return dot_->pack_qt(rows, stride, n, p_.D, reinterpret_cast<uint32_t*>(s_.qt2.data()));
    // bf16_on_f32: q rounded, then times its scale in float32 (a float32 rounding of each
    // product, not bf16's): the tiles need no pass of their own for it
    kern_.pack_qt(rows, stride, n, p_.D, s_.ones.data(), s_.qt.data());
    kernels::round_to_bf16(s_.qt.data(), p_.D * L);
    kern_.scale_lanes(s_.qt.data(), p_.D, lane_scale, 0, L);
  }

  // St = K Q^T in float32 (dot, cosine or additive scores).
  void qk_f32(int64_t j0, int64_t bc, int lo, int hi) {
    float* st = s_.st.data();
    int64_t ks;
    const float* k = rows_f32(krows_, s_.kcache, j0, bc, s_.kbuf.data(), ks);
    if (p_.mech.score == ScoreKind::additive) return additive_scores(k, ks, bc);
    kern_.qk(s_.qt.data(), p_.D, k, ks, bc, st, lo, hi);
    if (p_.mech.score == ScoreKind::cosine)
      for (int64_t j = 0; j < bc; ++j) {
        const float inv = static_cast<float>(1.0 / std::sqrt(std::max(sum_sq(k + j * ks, p_.D), 1e-30)));
        for (int64_t i = 0; i < L; ++i) st[j * L + i] *= inv;
      }
  }

  // St = K Q^T with bf16 operands, scaled per lane (lanes [lo, hi)).
  void qk_bf16(int64_t j0, int64_t bc, int lo, int hi) {
    float* st = s_.st.data();
    if (products_ == Products::bf16_dot) {
      const uint16_t* k;
      int64_t ks;
      if (is_plain_bf16(krows_) && krows_.run_end(j0) >= j0 + bc) {  // in place
        k = reinterpret_cast<const uint16_t*>(krows_.row(j0));
        ks = krows_.row_stride_bytes() / static_cast<int64_t>(sizeof(uint16_t));
      } else {
        int64_t fs;
        const float* f = rows_f32(krows_, s_.kcache, j0, bc, s_.kbuf.data(), fs);
        uint16_t* k16 = reinterpret_cast<uint16_t*>(s_.k16.data());
        dot_->round_rows(f, fs, bc, p_.D, k16);
        k = k16, ks = p_.D;
      }
      dot_->qk(reinterpret_cast<const uint32_t*>(s_.qt2.data()), p_.D, k, ks, bc, s_.lane_scale.data(), st, lo, hi);
      return;
    }
    int64_t ks;
    const float* k = rounded_rows(krows_, s_.kcache, j0, bc, s_.kbuf.data(), ks);
    kern_.qk(s_.qt.data(), p_.D, k, ks, bc, st, lo, hi);
  }

  // rows_f32's rows with every value rounded to bf16 (a copy in buf unless they already are).
  const float* rounded_rows(const core::KvRows& t, RowCache& cache, int64_t j0, int64_t bc, float* buf,
                            int64_t& stride) const {
    const float* f = rows_f32(t, cache, j0, bc, buf, stride);
    if (t.dtype() == DType::bf16) return f;  // widened bf16: exact
    kernels::round_rows_to_bf16(f, stride, bc, t.dim(), buf);
    stride = t.dim();
    return buf;
  }

  // Ot = alpha Ot + V^T Pt for the tile's keys, in the call's products.
  void weigh_values(int64_t j0, int64_t bc, bool all_live, bool poisoned, int lo, int hi) {
    float* st = s_.st.data();
    float* ot = s_.ot.data();
    const float* alpha = s_.alpha.data();
    if (products_ == Products::bf16_dot) {
      const uint32_t* vp = reinterpret_cast<uint32_t*>(s_.vp.data());
      // Straight from bf16 rows, hidden keys too: their weights are exactly 0 and, in a tile
      // that is not poisoned, their values finite (NonFiniteRows covers every row below kv_len).
      if (!poisoned && is_plain_bf16(vrows_) && vrows_.run_end(j0) >= j0 + bc) {
        if (s_.vpairs.enabled && j0 % kKeyTile == 0)
          vp = s_.vpairs.get(*dot_, vrows_, b_, hk_, j0, bc);
        else
          dot_->pack_v(vrows_.row(j0), DType::bf16,
                       vrows_.row_stride_bytes() / static_cast<int64_t>(sizeof(uint16_t)), bc, p_.Dv, s_.vp.data_u32());
      } else {
        int64_t vs;
        const float* v = values(j0, bc, all_live, vs);
        if (poisoned) v = finite_values(v, j0, bc, vs);
        dot_->pack_v(v, DType::f32, vs, bc, p_.Dv, s_.vp.data_u32());
      }
      dot_->pv(st, bc, vp, p_.Dv, ot, alpha, reinterpret_cast<uint32_t*>(s_.p2.data()), lo, hi);
      return;
    }
    int64_t vs;
    const float* v = values(j0, bc, all_live, vs);
    if (poisoned) v = finite_values(v, j0, bc, vs);
    if (products_ == Products::bf16_on_f32) {
      if (vrows_.dtype() != DType::bf16) {
        kernels::round_rows_to_bf16(v, vs, bc, p_.Dv, s_.vbuf.data());
        v = s_.vbuf.data(), vs = p_.Dv;
      }
      kern_.round_bf16_lanes(st, bc, lo, hi);
    }
    kern_.pv(st, bc, v, vs, p_.Dv, ot, alpha, lo, hi);
  }

  void project(const float* x, const float* w, float* y) const {
    for (int64_t a = 0; a < p_.A; ++a) {
      float s = 0;
      for (int64_t c = 0; c < p_.D; ++c) s += w[a * p_.D + c] * x[c];
      y[a] = s;
    }
  }

  static double sum_sq(const float* x, int64_t n) {
    double s = 0;
    for (int64_t c = 0; c < n; ++c) s += static_cast<double>(x[c]) * x[c];
    return s;
  }

  // Rows [j0, j0+bc) of K (or V) as float32 with unit inner stride: in place when the input
  // already is and the rows are evenly spaced (a tile across a paged cache's block boundary is
  // gathered, so tiles stay where they would be without paging), else from the thread's row
  // cache, else converted into `buf`.
  const float* rows_f32(const core::KvRows& t, RowCache& cache, int64_t j0, int64_t bc, float* buf, int64_t& stride) const {
    if (t.plain_f32() && t.run_end(j0) >= j0 + bc) {
      stride = t.row_stride_bytes() / static_cast<int64_t>(sizeof(float));
      return reinterpret_cast<const float*>(t.row(j0));
    }
    stride = t.dim();
    if (cache.enabled) return cache.get(kern_, t, b_, hk_, j0, bc);
    for (int64_t j = 0; j < bc; ++j) t.to_float(kern_.to_float, j0 + j, buf + j * t.dim());
    return buf;
  }

  // St for keys [j0, j0+bc): scores, transforms and (unless the tile is full) masks. Returns
  // false when some key of the tile is visible to no query of the block (its value row must then
  // be skipped).
  bool scores(int64_t j0, int64_t bc, bool full, int lo = 0, int hi = L) {
    float* st = s_.st.data();
    if (products_ == Products::f32)
      qk_f32(j0, bc, lo, hi);
    else
      qk_bf16(j0, bc, lo, hi);
    if (p_.mech.softcap > 0) kern_.softcap(st, bc * L, static_cast<float>(p_.mech.softcap));
    add_score_terms(p_, b_, h_, i0_, nq_, j0, bc, st);
    if (full) return true;
    return mask_scores(p_, b_, h_, i0_, nq_, j0, bc, st, s_.vis.data(), s_.live.data());
  }

  void additive_scores(const float* k, int64_t ks, int64_t bc) {
    float* kp = s_.kp.data();
    for (int64_t j = 0; j < bc; ++j) project(k + j * ks, p_.wk.data(), kp + j * p_.A);
    const float* w = p_.w.data();
    float* st = s_.st.data();
    for (int64_t j = 0; j < bc; ++j)
      for (int64_t i = 0; i < L; ++i) {
        if (i >= nq_) {
          st[j * L + i] = 0.0f;
          continue;
        }
        const float* qp = s_.qp.data() + i * p_.A;
        float s = 0;
        for (int64_t a = 0; a < p_.A; ++a) {  // + (u - u): tanh(+-inf) must not hide a non-finite input
          const float u = qp[a] + kp[j * p_.A + a];
          s += w[a] * (std::tanh(u) + (u - u));
        }
        st[j * L + i] = s * s_.row_scale[i];
      }
  }

  void apply_dropout(int64_t j0, int64_t bc) {
    float* st = s_.st.data();
    const float keep_scale = static_cast<float>(1.0 / (1.0 - p_.mech.dropout));
    for (int64_t j = 0; j < bc; ++j)
      for (int64_t i = 0; i < nq_; ++i)
        st[j * L + i] = dropout_keep(p_.mech.seed, p_.mech.dropout, b_, h_, i0_ + i, j0 + j)
                            ? st[j * L + i] * keep_scale
                            : 0.0f;
  }

  // V rows of the tile; rows no query may see are zeroed (0 * NaN would leak otherwise).
  const float* values(int64_t j0, int64_t bc, bool all_live, int64_t& vs) {
    float* buf = s_.vbuf.data();
    if (all_live) return rows_f32(vrows_, s_.vcache, j0, bc, buf, vs);
    for (int64_t j = 0; j < bc; ++j) {
      if (s_.live[j])
        vrows_.to_float(kern_.to_float, j0 + j, buf + j * p_.Dv);
      else
        std::fill(buf + j * p_.Dv, buf + (j + 1) * p_.Dv, 0.0f);
    }
    vs = p_.Dv;
    return buf;
  }

  // A tile holding a non-finite value (rare): its copy in vbuf with those elements 0, so that a
  // weight of 0 (a hidden or dropped key) times NaN leaks into no row; poison_lanes then puts the
  // NaN into exactly the rows that weigh the key.
  const float* finite_values(const float* v, int64_t j0, int64_t bc, int64_t& vs) {
    float* buf = s_.vbuf.data();
    for (int64_t j = 0; j < bc; ++j) {
      for (int64_t c = 0; c < p_.Dv; ++c) {
        const float x = v == buf ? buf[j * p_.Dv + c] : vrows_.at(j0 + j, c);
        buf[j * p_.Dv + c] = std::isfinite(x) ? x : 0.0f;
      }
    }
    vs = p_.Dv;
    return buf;
  }

  // Channel c of every lane with a non-zero weight for a key whose value is non-finite in c.
  void poison_lanes(int64_t j0, int64_t bc, int lo, int hi) {
    const float* st = s_.st.data();
    float* ot = s_.ot.data();
    const int end = static_cast<int>(std::min<int64_t>(hi, nq_));
    for (int64_t j = 0; j < bc; ++j) {
      if (!nonfinite_.row(b_, hk_, j0 + j)) continue;
      for (int64_t c = 0; c < p_.Dv; ++c) {
        const float x = vrows_.at(j0 + j, c);
        if (std::isfinite(x)) continue;
        for (int i = lo; i < end; ++i)
          if (st[j * L + i] != 0.0f) ot[c * L + i] = x * st[j * L + i];  // NaN, or +-inf times a weight > 0
      }
    }
  }

  void write_outputs(const TensorView& out, const TensorView* lse) {
    const float* ot = s_.ot.data();
    const float* m = s_.m.data();
    const float* l = s_.l.data();
    float* row = s_.row.data();
    // l = 0: the row saw no key (zeros, LSE -inf); l NaN: a non-finite input reached a visible
    // score (NaN, or +inf minus +inf), and the row is NaN, output and LSE.
    const bool plain = out.dtype == DType::f32 && out.strides[3] == 1;
    if (plain) {  // straight into the output rows, one transpose kernel
      float* inv = s_.inv.data();
      for (int64_t i = 0; i < L; ++i) inv[i] = i < nq_ ? inverse_sum(l[i]) : 0.0f;
      kern_.unpack_ot(ot, p_.Dv, inv, static_cast<int>(nq_), reinterpret_cast<float*>(out.ptr(b_, h_, i0_)),
                      out.strides[2]);
    }
    for (int64_t i = 0; i < nq_; ++i) {
      const float inv = inverse_sum(l[i]);
      if (!plain) {
        for (int64_t c = 0; c < p_.Dv; ++c) row[c] = ot[c * L + i] * inv;
        kern_.from_float(row, out.dtype, out.strides[3], p_.Dv, out.ptr(b_, h_, i0_ + i));
      }
      if (lse)
        static_cast<float*>(lse->data)[lse->offset(b_, h_, i0_ + i, 0)] =
            l[i] > 0 ? m[i] + std::log(l[i]) : l[i] == 0 ? -std::numeric_limits<float>::infinity() : l[i];
    }
  }

  void write_probs(const TensorView& probs) {
    float* pr = static_cast<float*>(probs.data);
    for (int64_t i = 0; i < nq_; ++i)
      for (int64_t j = 0; j < p_.M; ++j) pr[probs.offset(b_, h_, i0_ + i, j)] = 0.0f;
    // exp(s - m) / l; rows with l = 0 saw no key and keep their zeros.
    float* m = s_.m.data();
    float* inv_l = s_.alpha.data();
    for (int64_t i = 0; i < L; ++i) {
      inv_l[i] = inverse_sum(s_.l.data()[i]);
      if (!(s_.l.data()[i] > 0)) m[i] = 0.0f;
    }
    for_each_tile([&](int64_t j0, int64_t bc, bool full) {
      scores(j0, bc, full);
      float* st = s_.st.data();
      kern_.exp_rows(st, bc * L, m);
      for (int64_t j = 0; j < bc; ++j)
        for (int64_t i = 0; i < nq_; ++i) pr[probs.offset(b_, h_, i0_ + i, j0 + j)] = st[j * L + i] * inv_l[i];
    });
  }

  const Problem& p_;
  const kernels::TileKernels& kern_;
  const kernels::Bf16TileKernels* dot_;  // bf16_dot only
  Products products_;
  Scratch& s_;
  const core::NonFiniteRows& nonfinite_;
  int64_t b_, h_, hk_, i0_, nq_;
  std::span<const mask::Run> runs_;
  core::KvRows krows_, vrows_;
};

}  // namespace

namespace {

void tiled_blocks(const Problem& p, const core::Outputs& o, const core::Context& ctx, bool bf16) {
  const kernels::Bf16TileKernels* dot;
  const Products products = products_for(bf16, ctx.kern->isa, dot);
  const int64_t q_blocks = (p.N + L - 1) / L;
  const int64_t items = p.B * p.H * q_blocks;
  const int nthreads = resolve_threads(ctx.threads, items);
  // Scratch is allocated here, before the parallel region, so no allocation (and no
  // exception) can happen inside it.
  std::vector<Scratch> scratch(static_cast<size_t>(nthreads));
  for (Scratch& s : scratch) s.reserve(p, ctx.row_cache_bytes, o.stats ? o.stats->topk() : 0, products);
  const mask::BlockMask mask(p.pattern, p.N, p.M, p.offset, L, kKeyTile);
  const core::NonFiniteRows nonfinite(p, ctx.threads);
  parallel_for(items, nthreads, [&](int64_t item, int tid) {
    Scratch& s = scratch[static_cast<size_t>(tid)];
    const int64_t qb = item % q_blocks, bh = item / q_blocks;
    Block(p, mask, *ctx.kern, dot, products, s, bh / p.H, bh % p.H, qb * L, nonfinite)
        .run(*o.out, o.lse, o.probs, o.stats);
  });
}

// Token row i of v alone (N = 1).
TensorView row_of(TensorView v, int64_t i) {
  v.data = static_cast<char*>(v.data) + i * v.strides[2] * static_cast<int64_t>(dtype_size(v.dtype));
  v.shape[2] = 1;
  return v;
}

// The global query rows of a pattern (Longformer) see every key: in a 64-query block they would
// make the whole block read every key. When the rows form can take them (one row at a time:
// dot scores, no dropout, no probabilities, no block mask or mask_mod, whose row index it would
// not know), the blocks run without them and each global row runs apart against all keys.
bool global_rows_apart(const Problem& p, const core::Outputs& o) {
  if (!p.pattern.global_queries || o.wants_probs() || (o.stats && o.stats->keeps_summaries()) || p.block_mask ||
      p.mask_mod || p.mech.dropout != 0 ||
      p.mech.score != ScoreKind::dot || p.group > kMaxRowsPerKvHead)
    return false;
  for (int64_t g : p.pattern.global)
    if (g >= p.offset && g < p.offset + p.N) return true;
  return false;
}

void global_rows(const Problem& p, const core::Outputs& o, const core::Context& ctx) {
  for (int64_t g : p.pattern.global) {
    const int64_t i = g - p.offset;
    if (i < 0 || i >= p.N) continue;
    Problem row = p;  // query i alone, at its position g
    row.q = row_of(p.q, i);
    row.N = 1;
    row.offset = g;
    if (p.mask) row.mask = row_of(*p.mask, i);
    if (p.bias) row.bias = row_of(*p.bias, i);
    const TensorView out = row_of(*o.out, i);
    TensorView lse;
    if (o.lse) lse = row_of(*o.lse, i);
    std::optional<core::StatsSink> stats;
    if (o.stats) stats.emplace(o.stats->from_row(i));
    softmax_rows(row, {&out, o.lse ? &lse : nullptr, nullptr, nullptr, stats ? &*stats : nullptr}, ctx);
  }
}

}  // namespace

namespace {

void tiled(const Problem& p, const core::Outputs& o, const core::Context& ctx, bool bf16) {
  if (p.B == 0 || p.N == 0) return;
  if (!global_rows_apart(p, o)) return tiled_blocks(p, o, ctx, bf16);
  Problem rest = p;  // the global rows' blocks computed as if they were not global, then overwritten
  rest.pattern.global_queries = false;
  tiled_blocks(rest, o, ctx, bf16);
  global_rows(p, o, ctx);  // float32 products (the rows form's)
}

}  // namespace

void softmax_tiled(const Problem& p, const core::Outputs& o, const core::Context& ctx) { tiled(p, o, ctx, false); }

void softmax_tiled_bf16(const Problem& p, const core::Outputs& o, const core::Context& ctx) {
  tiled(p, o, ctx, true);
}

}  // namespace attn::exact
