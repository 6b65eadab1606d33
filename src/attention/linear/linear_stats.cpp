// Row statistics of the linear family (return_stats), a second pass after the form has run. The
// state the forms carry gives a row's sum (and with an F x F state its sum of squares), but not
// its entropy, max or top k, nor sum |w| for signed maps: those need the row itself. So this pass
// makes the weights again, 64 queries x 64 keys at a time,
//   w_ij = scale phi(q_i) . phi(k_j) decay^(pos_i - j)    over the keys row i may see,
// one gemm per tile, and streams each tile row into the row's summary (core::DirectRows). The cost is
// that of a quadratic call, O(N M F); the memory one tile per thread, never N x M.
//
// The applied weights are w_ij / den_i (normalize) or w_ij. The statistics are scale-free, so only
// den's sign matters: a negative den flips the signs (entropy turns NaN), a zero den applies an
// all-zero row. den is summed here from the same tiles, plus the initial state's share and eps, as
// in the reference. PolaFormer's two streams weigh the keys differently, each for half of the
// value channels; its row is their channel average (w0 / den0 + w1 / den1) / 2, so its pass sums
// both dens first (one sweep over the keys), then averages the two streams' tiles (a second).
//
// Work items are (b, h, block of 64 queries) in a fixed order, each row summed in one item: the
// results do not depend on the thread count.
#include <algorithm>
#include <cmath>

#include "base/aligned_buffer.hpp"
#include "base/parallel.hpp"
#include "core/row_stats.hpp"
#include "core/direct_rows.hpp"
#include "linear/head_state.hpp"

namespace attn::linear {
namespace {

constexpr int64_t kT = kernels::kQueryTile;

// One query block of one head at a time: its query features and, tile by tile, its weights. One
// per thread, its buffers sized before the parallel region (which must not allocate).
class BlockWeights {
 public:
  // `streams`: the problem itself, or PolaFormer's two stream problems.
  BlockWeights(const kernels::TileKernels& kern, const LinearProblem& p, const std::vector<LinearProblem>& streams)
      : kern_(kern), p_(p), sub_(streams) {
    const int64_t F = p.F;
    raw_.resize(static_cast<size_t>(kT * p.D));
    fq_.resize(static_cast<size_t>(kT * F));
    fk_.resize(static_cast<size_t>(kT * F));
    kt_.resize(static_cast<size_t>(F * kT));
    ones_.resize(kT);
    std::fill(ones_.data(), ones_.data() + kT, 1.0f);
    for (auto& t : tile_) t.resize(static_cast<size_t>(kT * kT));
    pw_.resize(static_cast<size_t>(std::max<int64_t>(p.M, 1)));  // pos(r) + 1 <= M
  }

  // The block of rows [i0, i0 + 64) of head h in batch entry b.
  void start(int64_t b, int64_t h, int64_t i0) {
    b_ = b, h_ = h, hk_ = p_.kv_head(h), i0_ = i0, nq_ = std::min(kT, p_.N - i0);
    len_ = p_.kv_len[static_cast<size_t>(b)];
    // the queries are the same in both of PolaFormer's streams (only its keys swap halves)
    load_features(kern_, sub_[0], true, b, h, i0, nq_, p_.N, static_cast<float>(p_.scale), raw_.data(), fq_.data());
    const double lambda = p_.decay[static_cast<size_t>(h)];
    decayed_ = lambda != 1.0;
    if (decayed_) {  // decay^d for every distance d in the block (underflows to 0 far back)
      double x = 1;
      for (int64_t d = 0; d <= pos(nq_ - 1); ++d) pw_[static_cast<size_t>(d)] = static_cast<float>(x), x *= lambda;
    }
  }

  int streams() const { return static_cast<int>(sub_.size()); }
  int64_t rows() const { return nq_; }
  // The keys [0, end(r)) row r may see, and those the block's last row sees (the most).
  int64_t end(int64_t r) const { return p_.mech.causal ? std::clamp<int64_t>(pos(r) + 1, 0, len_) : len_; }
  int64_t end() const { return end(nq_ - 1); }

  // The normaliser's part from outside the row's keys: eps, and the initial state's tokens (all
  // behind every query, decayed by decay^(pos + 1)).
  float den_outside(int s, int64_t r) const {
    const LinearProblem& sp = sub_[s];
    double d = p_.eps;
    if (sp.initial) {
      double dot = 0;
      for (int64_t f = 0; f < sp.F; ++f)
        dot += static_cast<double>(fq_[static_cast<size_t>(r * sp.F + f)]) * sp.initial_at(b_, h_, f, sp.Dv);
      d += dot * (p_.mech.causal ? std::pow(p_.decay[static_cast<size_t>(h_)], pos(r) + 1) : 1.0);
    }
    return static_cast<float>(d);
  }

  // Stream s's weights of keys [j0, j0 + nk) for every row of the block, row r at tile(s) + r * kT;
  // keys a row may not see are left as they are (callers read the first seen(r, j0, nk)).
  void make_tile(int s, int64_t j0, int64_t nk) {
    const int64_t F = p_.F;
    load_features(kern_, sub_[s], false, b_, hk_, j0, nk, len_, 1.0f, raw_.data(), fk_.data());
    kern_.pack_qt(fk_.data(), F, static_cast<int>(nk), F, ones_.data(), kt_.data());
    float* t = tile(s);
    kern_.gemm(nq_, nk, F, fq_.data(), F, 1, kt_.data(), kT, t, kT, false);
    if (!decayed_) return;
    for (int64_t r = 0; r < nq_; ++r) {
      float* row = t + r * kT;
      for (int64_t c = 0, n = seen(r, j0, nk); c < n; ++c) row[c] *= pw_[static_cast<size_t>(pos(r) - (j0 + c))];
    }
  }
  float* tile(int s) { return tile_[s].data(); }
  int64_t seen(int64_t r, int64_t j0, int64_t nk) const { return std::clamp<int64_t>(end(r) - j0, 0, nk); }

 private:
  int64_t pos(int64_t r) const { return i0_ + r + p_.M - p_.N; }  // causal calls have N = M

  const kernels::TileKernels& kern_;
  const LinearProblem& p_;
  const std::vector<LinearProblem>& sub_;
  int64_t b_ = 0, h_ = 0, hk_ = 0, i0_ = 0, nq_ = 0, len_ = 0;
  bool decayed_ = false;  // pw_ holds decay^d, d <= pos(nq_ - 1)
  std::vector<float> raw_, fq_, fk_, pw_;
  AlignedFloats kt_, ones_;
  std::vector<float> tile_[2];
};

// sum of x[0..n) in double (a row's share of its normaliser).
double row_sum(const float* x, int64_t n) {
  double s = 0;
  for (int64_t c = 0; c < n; ++c) s += x[c];
  return s;
}

}  // namespace

void linear_row_stats(const LinearProblem& p, const core::Outputs& o, const core::Context& ctx) {
  const kernels::TileKernels& kern = *ctx.kern;
  const int64_t blocks = (p.N + kT - 1) / kT, items = p.B * p.H * blocks;
  std::vector<LinearProblem> streams;
  if (p.polar())
    streams = {stream_problem(p, 0), stream_problem(p, 1)};
  else
    streams = {p};
  const int threads = resolve_threads(ctx.threads, items);
  std::vector<BlockWeights> weights;
  std::vector<core::DirectRows> summaries;
  weights.reserve(static_cast<size_t>(threads));
  summaries.reserve(static_cast<size_t>(threads));
  for (int t = 0; t < threads; ++t) weights.emplace_back(kern, p, streams), summaries.emplace_back(kern, o.stats->topk());
  parallel_for(items, threads, [&](int64_t item, int thread) {
    const int64_t b = item / (p.H * blocks), h = item / blocks % p.H, i0 = item % blocks * kT;
    BlockWeights& w = weights[static_cast<size_t>(thread)];
    w.start(b, h, i0);
    core::DirectRows& rows = summaries[static_cast<size_t>(thread)];
    rows.start();
    const int64_t nq = w.rows(), end = w.end();
    double den[2][kT];
    for (int s = 0; s < w.streams(); ++s)
      for (int64_t r = 0; r < nq; ++r) den[s][r] = p.mech.normalize ? w.den_outside(s, r) : 1.0;
    if (w.streams() == 1) {  // one sweep: stream the rows, and sum den for its sign
      for (int64_t j0 = 0; j0 < end; j0 += kT) {
        const int64_t nk = std::min(kT, end - j0);
        w.make_tile(0, j0, nk);
        for (int64_t r = 0; r < nq; ++r) {
          const float* row = w.tile(0) + r * kT;
          const int64_t n = w.seen(r, j0, nk);
          rows.add(r, row, n);
          if (p.mech.normalize) den[0][r] += row_sum(row, n);
        }
      }
      for (int64_t r = 0; r < nq; ++r) {
        core::RowSummary s = rows.summary(r, den[0][r] < 0);
        if (den[0][r] == 0) s.a1 = 0;  // a zero normaliser applies an all-zero row (NaN statistics)
        o.stats->put(b, h, i0 + r, s);
      }
      return;
    }
    if (p.mech.normalize)  // PolaFormer: each stream's den first ...
      for (int64_t j0 = 0; j0 < end; j0 += kT) {
        const int64_t nk = std::min(kT, end - j0);
        for (int s = 0; s < 2; ++s) {
          w.make_tile(s, j0, nk);
          for (int64_t r = 0; r < nq; ++r) den[s][r] += row_sum(w.tile(s) + r * kT, w.seen(r, j0, nk));
        }
      }
    float f[2][kT];  // ... then the average of the applied weights (a zero den applies zeros)
    for (int s = 0; s < 2; ++s)
      for (int64_t r = 0; r < nq; ++r) f[s][r] = den[s][r] != 0 ? static_cast<float>(0.5 / den[s][r]) : 0.0f;
    for (int64_t j0 = 0; j0 < end; j0 += kT) {
      const int64_t nk = std::min(kT, end - j0);
      w.make_tile(0, j0, nk);
      w.make_tile(1, j0, nk);
      for (int64_t r = 0; r < nq; ++r) {
        float* a = w.tile(0) + r * kT;
        const float* a1 = w.tile(1) + r * kT;
        const int64_t n = w.seen(r, j0, nk);
        for (int64_t c = 0; c < n; ++c) a[c] = a[c] * f[0][r] + a1[c] * f[1][r];
        rows.add(r, a, n);
      }
    }
    for (int64_t r = 0; r < nq; ++r) o.stats->put(b, h, i0 + r, rows.summary(r));
  });
}

}  // namespace attn::linear
