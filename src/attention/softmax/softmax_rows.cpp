// Split-K attention for few query rows per kv head. The keys to visit are the block mask's runs
// for the N query rows (one query tile), cut at the batch's valid length; they are split into
// chunks by their count, so a window of 256 keys in a 64K cache still spreads over the threads.
// Work item = (batch, kv head, chunk); each computes, for its R = group * N query rows, the
// chunk's partial (max m, sum l, unnormalised output acc). The merge combines the chunks of a
// (batch, kv head) in chunk order:  m = max_c m_c,  l = sum_c l_c e^(m_c - m),
// O = sum_c acc_c e^(m_c - m) / l. Row statistics (return_stats) keep a row summary per chunk
// partial beside (m, l) (core/row_stats.hpp), merged in the same chunk order.
#include "softmax/softmax_rows.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <limits>
#include <vector>

#include "base/aligned_buffer.hpp"
#include "base/parallel.hpp"
#include "core/kv_rows.hpp"
#include "core/partial_merge.hpp"
#include "core/row_stats.hpp"
#include "mask/block_mask.hpp"

namespace attn::exact {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

struct Scratch {
  std::vector<float> q, row, kbuf, vbuf;  // q: the packed query rows of every kv head an item takes
  std::vector<float> scales;  // int8 rows: the block's row scales
  std::vector<uint8_t> vis;  // (keys, N) visibility of a partial block
  std::vector<const void*> kptr, vptr;  // addresses of the block's K and V rows
  // values some rows weigh and others do not, with non-finite elements (Chunk::finite_copies):
  // their copies (zeroed there), where they were, and their weights (key, row); rarely used, so
  // allocated without being cleared (a memset per call cost ~10 % of a tiny call)
  std::unique_ptr<uint8_t[]> finite;
  std::unique_ptr<const void*[]> poisoned;
  std::unique_ptr<float[]> poison_w;
  AlignedFloats s;  // (R, kKeyChunk) scores, 64-byte aligned for the softcap kernel
  // Sized by the problem: the float32 copies of K/V rows exist only for a non-unit inner stride,
  // and hold at most min(M, kKeyChunk) rows (memory in proportion to the inputs).
  void reserve(const Problem& p, int64_t R, int64_t heads) {
    const int64_t rows = std::min(p.M, kKeyChunk);
    q.resize(static_cast<size_t>(heads * R * p.D));
    s.resize(static_cast<size_t>(R * rows));
    row.resize(static_cast<size_t>(std::max({p.D, p.Dv, R})));  // also holds R scores / weights
    vis.resize(static_cast<size_t>(rows * p.N));
    kptr.resize(static_cast<size_t>(rows));
    vptr.resize(static_cast<size_t>(rows));
    finite.reset(new uint8_t[static_cast<size_t>(rows * p.Dv) * sizeof(float)]);
    poisoned.reset(new const void*[static_cast<size_t>(rows)]);
    poison_w.reset(new float[static_cast<size_t>(rows * R)]);
    if (p.k_scale) scales.resize(static_cast<size_t>(rows));
    if (p.k.strides[3] != 1) kbuf.resize(static_cast<size_t>(rows * p.D));
    if (p.v.strides[3] != 1) vbuf.resize(static_cast<size_t>(rows * p.Dv));
  }
};

// Addresses of rows [j0, j0+n) of K or V in ptr[0..n), row by row (so a paged cache's block
// boundaries change nothing: the same keys meet in the same order). Rows with unit inner stride
// are read in place in their storage type; others are converted to float32 into buf. Returns
// the type the rows are in.
DType row_pointers(const kernels::TileKernels& kern, const core::KvRows& t, int64_t j0, int64_t n, float* buf,
                   const void** ptr) {
  // run by run: one block-table lookup per page, not a division per row (paged caches)
  for (int64_t j = 0; j < n;) {
    const int64_t end = std::min(n, t.run_end(j0 + j) - j0);
    for (const char* row = t.row(j0 + j); j < end; ++j, row += t.row_stride_bytes()) ptr[j] = row;
  }
  if (t.elem_stride() == 1) return t.dtype();
  for (int64_t j = 0; j < n; ++j) {
    kern.to_float(ptr[j], t.dtype(), t.elem_stride(), t.dim(), buf + j * t.dim());
    ptr[j] = buf + j * t.dim();
  }
  return DType::f32;
}

// Query row r of kv head hk is query i = r % N of head h = hk * group + r / N.
struct RowIndex {
  int64_t h, i;
};

// The keys a batch entry visits, in order: the block mask's runs cut at its valid length.
std::vector<mask::Run> visited_keys(const Problem& p, const mask::BlockMask& mask, int64_t b, int64_t& count) {
  std::vector<mask::Run> pieces;
  count = 0;
  for (const mask::Run& r : mask.runs(0)) {
    const int64_t end = std::min(r.end, p.kv_len[b]);
    if (end <= r.begin) continue;
    pieces.push_back({r.begin, end, r.full && !p.has_user_mask()});
    count += end - r.begin;
  }
  return pieces;
}

// Calls fn(block) for the visited keys [first, last) of `pieces` (counted in visiting order) as
// blocks of at most kKeyChunk keys, in order (no allocation: it runs inside the parallel region).
template <class Fn>
void for_each_block(const std::vector<mask::Run>& pieces, int64_t first, int64_t last, Fn fn) {
  int64_t pos = 0;  // visiting-order index of the piece's first key
  for (const mask::Run& piece : pieces) {
    if (pos >= last) break;
    const int64_t len = piece.end - piece.begin;
    const int64_t j1 = piece.begin + std::min(last - pos, len);
    for (int64_t a = piece.begin + std::max<int64_t>(first - pos, 0); a < j1; a += kKeyChunk)
      fn(mask::Run{a, std::min(j1, a + kKeyChunk), piece.full});
    pos += len;
  }
}

// A chunk partial's row statistics beyond (m, l): R summaries (their a1 and reference are l and m).
struct ChunkStats {
  float *a2 = nullptr, *e = nullptr;
  int64_t* n = nullptr;
  core::RowSummary* rows = nullptr;
};

class Chunk {
 public:
  Chunk(const Problem& p, const kernels::TileKernels& kern, Scratch& s, int64_t b, int64_t hk, float* m, float* l,
        float* acc, ChunkStats stats = {})
      : p_(p), kern_(kern), s_(s), b_(b), hk_(hk), R_(p.group * p.N), m_(m), l_(l), acc_(acc), st_(stats),
        krows_(p.keys(b, hk)), vrows_(p.values(b, hk)) {}

  // Starts the online softmax (m = -inf, l = 0, acc = 0) with the query rows packed into `q`.
  void start(float* q) {
    q_ = q;
    std::fill(acc_, acc_ + R_ * p_.Dv, 0.0f);
    std::fill(m_, m_ + R_, kNegInf);
    std::fill(l_, l_ + R_, 0.0f);
    pack_queries();
  }

  // Keys [a, e) (at most kKeyChunk), `full`: every query row sees all of them (pattern-wise).
  void block(int64_t a, int64_t e, bool full) {
    const int64_t n = e - a;
    const DType kt = row_pointers(kern_, krows_, a, n, s_.kbuf.data(), s_.kptr.data());
    const DType vt = row_pointers(kern_, vrows_, a, n, s_.vbuf.data(), s_.vptr.data());
    float* s = s_.s.data();  // s[r * n + j]
    // V rows are fetched while the scores are computed (the two reads overlap)
    kern_.qk_rows(q_, R_, p_.D, s_.kptr.data(), kt, n, s, n, s_.vptr.data(),
                  p_.Dv * static_cast<int64_t>(dtype_size(vt)));
    if (krows_.scaled()) scale_columns(s, a, n, krows_, false);
    if (p_.mech.softcap > 0) kern_.softcap(s, R_ * n, static_cast<float>(p_.mech.softcap));
    uint8_t* vis = s_.vis.data();  // vis[j * N + i]: key a + j visible to query i (pattern only)
    if (!full)
      for (int64_t j = 0; j < n; ++j) p_.pattern.column(a + j, p_.offset, p_.N, vis + j * p_.N);
    for (int64_t r = 0; r < R_; ++r) {
      const RowIndex q = index(r);
      float* sr = s + r * n;
      if (p_.has_bias())
        for (int64_t j = 0; j < n; ++j) sr[j] += p_.additive_bias(b_, q.h, q.i, a + j);
      if (!full)  // the pattern, then the caller's masks
        for (int64_t j = 0; j < n; ++j) {
          uint8_t v = vis[j * p_.N + q.i];
          if (v && p_.has_user_mask()) p_.user_mask_column(b_, q.h, q.i, 1, a + j, &v);
          if (!v) sr[j] = kNegInf;
        }
      bool nan = false;
      const float mx = kern_.row_max(sr, n, m_[r], &nan);
      if (nan) {  // a NaN score poisons the row: its partial sum is NaN (merge_partials passes it on)
        l_[r] = std::numeric_limits<float>::quiet_NaN();
        std::fill(sr, sr + n, 0.0f);
        continue;
      }
      if (mx == kNegInf) {  // nothing visible yet: p = 0
        std::fill(sr, sr + n, 0.0f);
        continue;
      }
      const float alpha = std::exp(m_[r] - mx);  // 0 when m was -inf
      if (alpha != 1.0f)
        for (int64_t c = 0; c < p_.Dv; ++c) acc_[r * p_.Dv + c] *= alpha;
      if (st_.rows) {
        update_stats(r, sr, n, mx, alpha);
      } else {
        l_[r] = l_[r] * alpha + kern_.exp_shift_sum(sr, n, mx);
      }
      m_[r] = mx;
    }
    if (vrows_.scaled()) scale_columns(s, a, n, vrows_, true);
    const int64_t poisoned = vrows_.scaled() ? 0 : finite_copies(s, n, vt);
    kern_.pv_rows(s, n, R_, s_.vptr.data(), vt, weighted_keys(s, n), p_.Dv, acc_);
    if (poisoned) poison_rows(poisoned, vt);
  }

  // Keys that some rows weigh and others do not (hidden from them, or a weight that underflowed
  // to 0) and whose value is not finite: pv_rows would give the rows without weight 0 * NaN = NaN.
  // Such a value enters the product as a copy with its non-finite elements zeroed (the finite
  // channels sum exactly as without the poison), and poison_rows then gives each row that weighs
  // it x * w in those channels, as the tiled form does. (int8 rows hold finite integers: a
  // non-finite row has a NaN scale, which scale_columns keeps away from zero weights.) Returns
  // how many keys were copied.
  int64_t finite_copies(const float* s, int64_t n, DType vt) {
    int32_t zeros[kKeyChunk] = {};  // per key, the rows that give it no weight (vectorised passes)
    for (int64_t r = 0; r < R_; ++r)
      for (int64_t j = 0; j < n; ++j) zeros[j] += s[r * n + j] == 0.0f;
    const size_t row_bytes = static_cast<size_t>(p_.Dv) * dtype_size(vt);
    int64_t count = 0;
    for (int64_t j = 0; j < n; ++j) {
      if (zeros[j] == 0 || zeros[j] == R_) continue;  // weighed by every row, or by none
      const void* v = s_.vptr[static_cast<size_t>(j)];
      if (all_finite(v, vt, p_.Dv)) continue;
      uint8_t* copy = s_.finite.get() + static_cast<size_t>(count) * row_bytes;
      std::memcpy(copy, v, row_bytes);
      for (int64_t c = 0; c < p_.Dv; ++c)  // a zero is all zero bits in every float dtype
        if (!std::isfinite(load_as_float(v, vt, c))) std::memset(copy + static_cast<size_t>(c) * dtype_size(vt), 0, dtype_size(vt));
      s_.poisoned[static_cast<size_t>(count)] = v;
      for (int64_t r = 0; r < R_; ++r) s_.poison_w[static_cast<size_t>(count * R_ + r)] = s[r * n + j];
      s_.vptr[static_cast<size_t>(j)] = copy;
      ++count;
    }
    return count;
  }

  // Whether n values of a float row are all finite: no element with every exponent bit set.
  static bool all_finite(const void* row, DType t, int64_t n) {
    auto none_at_max = [n](const auto* bits, auto exponent) {
      bool any = false;
      for (int64_t c = 0; c < n; ++c) any |= (bits[c] & exponent) == exponent;
      return !any;
    };
    if (t == DType::f32) return none_at_max(static_cast<const uint32_t*>(row), uint32_t{0x7f800000});
    return none_at_max(static_cast<const uint16_t*>(row), static_cast<uint16_t>(t == DType::f16 ? 0x7c00 : 0x7f80));
  }

  void poison_rows(int64_t count, DType vt) {
    float* row = s_.row.data();
    for (int64_t k = 0; k < count; ++k) {
      kern_.to_float(s_.poisoned[static_cast<size_t>(k)], vt, 1, p_.Dv, row);
      for (int64_t c = 0; c < p_.Dv; ++c) {
        if (std::isfinite(row[c])) continue;
        for (int64_t r = 0; r < R_; ++r)
          if (const float w = s_.poison_w[static_cast<size_t>(k * R_ + r)]; w != 0.0f) acc_[r * p_.Dv + c] = row[c] * w;
      }
    }
  }

  // int8 rows (the kernels read their integers): column j of the R x n block times the scale of
  // row a + j. Weights (keep_zeros) that are 0 stay 0, so a hidden row's NaN scale stays out.
  void scale_columns(float* s, int64_t a, int64_t n, const core::KvRows& rows, bool keep_zeros) {
    float* scale = s_.scales.data();
    for (int64_t j = 0; j < n; ++j) scale[j] = rows.scale(a + j);
    for (int64_t r = 0; r < R_; ++r) {
      float* sr = s + r * n;
      if (keep_zeros)
        for (int64_t j = 0; j < n; ++j) sr[j] = sr[j] == 0.0f ? 0.0f : sr[j] * scale[j];
      else
        for (int64_t j = 0; j < n; ++j) sr[j] *= scale[j];
    }
  }

  // The row's scores above its top-k threshold enter the heap; then the exp pass with the
  // summary's sums, rescaled as l is (e' = alpha (e + l (m - m')), nothing carried from l = 0).
  void update_stats(int64_t r, float* sr, int64_t n, float mx, float alpha) {
    core::RowSummary& row = st_.rows[r];
    float thr = row.threshold();
    for (int64_t j = 0; j < n; ++j)
      if (sr[j] > thr) {
        row.offer(sr[j]);
        thr = row.threshold();
      }
    float sums[4];
    kern_.exp_shift_stats(sr, n, mx, sums);
    const float l_old = l_[r];
    st_.e[r] = (l_old == 0 ? 0.0f : alpha * (st_.e[r] + l_old * (m_[r] - mx))) + sums[2];
    st_.a2[r] = alpha * alpha * st_.a2[r] + sums[1];
    st_.n[r] += static_cast<int64_t>(sums[3]);
    l_[r] = l_old * alpha + sums[0];
  }

 private:
  // Keys no row gives weight are left out (as the reference does: a zero weight never meets its
  // value, so a NaN there stays out): their columns of p and their V addresses are squeezed out
  // in place. Returns how many keys remain.
  int64_t weighted_keys(float* s, int64_t n) {
    int zeros = 0;  // a key without weight has a zero in row 0 (as in every row): usually none
    for (int64_t j = 0; j < n; ++j) zeros += s[j] == 0.0f;
    if (zeros == 0) return n;
    int64_t live = 0;
    for (int64_t j = 0; j < n; ++j) {
      bool any = false;
      for (int64_t r = 0; r < R_; ++r) any |= s[r * n + j] != 0.0f;
      if (!any) continue;
      if (live != j) {
        for (int64_t r = 0; r < R_; ++r) s[r * n + live] = s[r * n + j];
        s_.vptr[static_cast<size_t>(live)] = s_.vptr[static_cast<size_t>(j)];
      }
      ++live;
    }
    return live;
  }

  RowIndex index(int64_t r) const { return {hk_ * p_.group + r / p_.N, r % p_.N}; }

  void pack_queries() {
    float* row = s_.row.data();
    for (int64_t r = 0; r < R_; ++r) {
      const RowIndex q = index(r);
      kern_.to_float(p_.q.ptr(b_, q.h, q.i), p_.q.dtype, p_.q.strides[3], p_.D, row);
      const auto scale = static_cast<float>(p_.row_scale(b_, q.h, q.i));
      for (int64_t c = 0; c < p_.D; ++c) q_[r * p_.D + c] = row[c] * scale;
    }
  }

  const Problem& p_;
  const kernels::TileKernels& kern_;
  Scratch& s_;
  int64_t b_, hk_, R_;
  float *m_, *l_, *acc_;
  ChunkStats st_;
  float* q_ = nullptr;  // R packed query rows, scaled
  core::KvRows krows_, vrows_;
};

}  // namespace

void refuse_rows(const Problem& p, const core::Outputs& o, core::Reasons& why) {
  if (p.N == 0) why.push_back("no queries (N = 0)");
  if (p.precision == Precision::bf16) why.push_back("precision bf16 (rows computes in float32)");
  if (p.group * p.N > kMaxRowsPerKvHead)
    why.push_back([&] {
      return std::to_string(p.group * p.N) + " query rows per kv head (group " + std::to_string(p.group) + " x N " +
             std::to_string(p.N) + ") > " + std::to_string(kMaxRowsPerKvHead);
    });
  if (o.wants_probs()) why.push_back("probabilities requested");
  if (p.mech.dropout != 0) why.push_back("dropout");
  if (p.mech.score != ScoreKind::dot) why.push_back([&] { return "score=" + to_string(p.mech.score) + " (dot only)"; });
}

void softmax_rows(const Problem& p, const core::Outputs& o, const core::Context& ctx) {
  if (p.B == 0) return;
  const kernels::TileKernels& kern = *ctx.kern;
  const TensorView& out = *o.out;
  const int64_t R = p.group * p.N;
  const mask::BlockMask mask(p.pattern, p.N, p.M, p.offset, p.N, 64);
  std::vector<std::vector<mask::Run>> pieces(static_cast<size_t>(p.B));
  int64_t most = 0;  // visited keys of the busiest batch entry
  for (int64_t b = 0; b < p.B; ++b) {
    int64_t count;
    pieces[static_cast<size_t>(b)] = visited_keys(p, mask, b, count);
    most = std::max(most, count);
  }
  // Split-K: enough chunks for ~64 work items, whatever the thread count (the chunking fixes the
  // summation order, so it must not depend on threads); partials stay ~64 x R x Dv floats.
  const int64_t max_chunks = std::max<int64_t>(1, (most + kKeyChunk - 1) / kKeyChunk);
  const int64_t chunks = std::min(max_chunks, std::max<int64_t>(1, (64 + p.B * p.Hkv - 1) / (p.B * p.Hkv)));
  const int64_t chunk_len = (most + chunks - 1) / chunks;
  // Work items: (batch, kv head, chunk), or (batch, chunk) with every kv head when the heads'
  // rows interleave in memory (flash-attn's (B, M, Hkv, D) caches, page pools): an item then
  // reads one stretch of memory, block by block, instead of Hkv strided streams. Either way each
  // (batch, kv head, chunk) partial is the same computation, so the grouping changes no bits.
  const bool heads_together = p.Hkv > 1 && p.k.strides[1] < p.k.strides[2] && p.v.strides[1] < p.v.strides[2];
  const int64_t per_item = heads_together ? p.Hkv : 1;
  const int64_t items = p.B * p.Hkv * chunks / per_item;
  // partials: per (b, hk, chunk) R maxima, R sums, R x Dv outputs (~ B*Hkv*M/256*R*Dv, not N x M)
  const int64_t slots = p.B * p.Hkv * chunks;
  std::vector<float> pm(static_cast<size_t>(slots * R)), pl(pm.size()), pacc(static_cast<size_t>(slots * R * p.Dv));
  // row statistics per partial: a2, e, n and a top-k heap (k floats) per row
  const int64_t k = o.stats ? o.stats->topk() : 0;
  std::vector<float> pa2(k ? pm.size() : 0), pe(pa2.size()), ptop(static_cast<size_t>(k ? slots * R * k : 0));
  std::vector<int64_t> pn(pa2.size());
  std::vector<core::RowSummary> prow(pa2.size());
  for (size_t r = 0; r < prow.size(); ++r)
    prow[r] = core::RowSummary::empty(core::RowKind::softmax, static_cast<int32_t>(k), ptop.data() + r * k);
  const int nthreads = resolve_threads(ctx.threads, items);
  std::vector<Scratch> scratch(static_cast<size_t>(nthreads));
  for (Scratch& s : scratch) s.reserve(p, R, per_item);
  std::vector<std::vector<Chunk>> chunks_of(static_cast<size_t>(nthreads));  // per thread, emptied per item
  for (auto& heads : chunks_of) heads.reserve(static_cast<size_t>(per_item));
  parallel_for(items, nthreads, [&](int64_t item, int tid) {
    const int64_t c = item % chunks, group = item / chunks;  // group: (b, hk) or b
    const int64_t b = heads_together ? group : group / p.Hkv, hk0 = heads_together ? 0 : group % p.Hkv;
    Scratch& s = scratch[static_cast<size_t>(tid)];
    std::vector<Chunk>& heads = chunks_of[static_cast<size_t>(tid)];
    heads.clear();  // keeps its capacity: no allocation below
    for (int64_t h = 0; h < per_item; ++h) {
      const int64_t slot = (b * p.Hkv + hk0 + h) * chunks + c;
      const ChunkStats stats =
          k ? ChunkStats{&pa2[slot * R], &pe[slot * R], &pn[slot * R], &prow[slot * R]} : ChunkStats{};
      heads.emplace_back(p, kern, s, b, hk0 + h, &pm[slot * R], &pl[slot * R], &pacc[slot * R * p.Dv], stats);
      heads.back().start(s.q.data() + h * R * p.D);
    }
    for_each_block(pieces[static_cast<size_t>(b)], c * chunk_len, (c + 1) * chunk_len, [&](const mask::Run& blk) {
      for (Chunk& head : heads) head.block(blk.begin, blk.end, blk.full);
    });
  });
  // merge each row's chunk partials in chunk order
  std::vector<float> row(static_cast<size_t>(p.Dv)), top(static_cast<size_t>(k));
  for (int64_t bh = 0; bh < p.B * p.Hkv; ++bh) {
    const int64_t b = bh / p.Hkv, hk = bh % p.Hkv;
    for (int64_t r = 0; r < R; ++r) {
      const int64_t first = bh * chunks * R + r;
      const float lse = core::merge_partials(chunks, &pm[first], &pl[first], R, &pacc[first * p.Dv], R * p.Dv, p.Dv,
                                             row.data());
      const int64_t h = hk * p.group + r / p.N, i = r % p.N;
      kern.from_float(row.data(), out.dtype, out.strides[3], p.Dv, out.ptr(b, h, i));
      if (o.lse) static_cast<float*>(o.lse->data)[o.lse->offset(b, h, i, 0)] = lse;
      if (k) {
        core::RowSummary whole = core::RowSummary::empty(core::RowKind::softmax, static_cast<int32_t>(k), top.data());
        for (int64_t c = 0; c < chunks; ++c) {
          const size_t at = static_cast<size_t>(first + c * R);
          core::RowSummary part = prow[at];
          part.ref = pm[at], part.a1 = pl[at], part.a2 = pa2[at], part.e = pe[at], part.n = pn[at];
          part.nan = std::isnan(pl[at]);
          core::merge_into(whole, part);
        }
        o.stats->put(b, h, i, whole);
      }
    }
  }
}

}  // namespace attn::exact
