// Row statistics of efficient attention (return_stats), a second pass after the form has run.
// Row i's weights over the keys it may see, [0, e_i) (e_i = len, or min(i + 1, len) causal):
//   a_ij = scale sum_f sigma(q_i)_f e^(k_jf - top_f(i)) / total_f(i),
// where top_f(i) and total_f(i) are feature f's softmax maximum and sum over those keys and the
// initial state's tokens (sum z0 at maximum m0), which are not in the row. The weights are
// positive, so only the row's own values matter.
//
// Per (b, h, block of 64 queries), the keys every row of the block sees, [0, before), go through
// one shift r_f = their top: a tile is the gemm of the query factors
//   scale sigma(q_i)_f e^(r_f - top_f(i)) / total_f(i)     (each <= sigma / total: no overflow)
// with the key factors e^(k_jf - r_f) <= 1. A causal block's own keys (the diagonal tile) are
// summed per pair with their row's top. top and total come from a sweep over [0, before) first.
// Memory: a few 64-row tiles per thread; results do not depend on the thread count (fixed items,
// each row summed in one of them).
#include <algorithm>
#include <cmath>
#include <limits>

#include "base/aligned_buffer.hpp"
#include "base/parallel.hpp"
#include "core/params.hpp"
#include "core/row_stats.hpp"
#include "core/direct_rows.hpp"
#include "efficient/efficient.hpp"
#include "core/rows.hpp"

namespace attn::efficient {
namespace {

constexpr int64_t kT = kernels::kQueryTile;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Per feature: the maximum and the sum of exponentials (relative to it) of the keys so far and
// the initial state's. total 0: nothing yet.
struct KeySoftmax {
  std::vector<float> top, total;

  explicit KeySoftmax(const EfficientProblem& p) : top(static_cast<size_t>(p.D)), total(static_cast<size_t>(p.D)) {}

  // The initial state's tokens of (b, h), or nothing yet.
  void load(const EfficientProblem& p, int64_t b, int64_t h) {
    std::fill(top.begin(), top.end(), kNegInf);
    std::fill(total.begin(), total.end(), 0.0f);
    if (!p.initial) return;
    for (int64_t f = 0; f < p.D; ++f) {
      const float z = core::element_at(*p.initial, b, h, f, p.Dv);
      if (z != 0) total[static_cast<size_t>(f)] = z, top[static_cast<size_t>(f)] = core::element_at(*p.initial, b, h, f, p.Dv + 1);
    }
  }

  // Feature f gains keys whose maximum is `most` and whose sum of e^(k - next) is `sum`, with
  // next = max(top, most).
  static float next(float top, float most) { return std::max(top, most); }
  void add(int64_t f, float next_top, float sum) {
    float& t = top[static_cast<size_t>(f)];
    float& z = total[static_cast<size_t>(f)];
    z = (z != 0 ? z * std::exp(t - next_top) : 0.0f) + sum;
    t = next_top;
  }
  // One key row k (D values).
  void absorb(const float* k, int64_t D) {
    for (int64_t f = 0; f < D; ++f) {
      const float t = next(top[static_cast<size_t>(f)], k[f]);
      add(f, t, std::exp(k[f] - t));
    }
  }
};

// One per thread, its buffers sized before the parallel region (which must not allocate); start()
// takes it to a block, and every buffer is written before it is read there.
class Block {
 public:
  Block(const kernels::TileKernels& kern, const EfficientProblem& p)
      : kern_(kern), p_(p), keys_(p), krow_(static_cast<size_t>(kT * p.D)), sigma_(static_cast<size_t>(kT * p.D)),
        qf_(static_cast<size_t>(kT * p.D)), top_(static_cast<size_t>(kT * p.D)), total_(static_cast<size_t>(kT * p.D)),
        x_(static_cast<size_t>(p.D)), tile_(static_cast<size_t>(kT * kT)), shift_(static_cast<size_t>(p.D)) {
    kt_.resize(static_cast<size_t>(p.D * kT));
    ones_.resize(kT);
    std::fill(ones_.data(), ones_.data() + kT, 1.0f);
  }

  // The block of rows [i0, i0 + 64) of head h in batch entry b.
  void start(int64_t b, int64_t h, int64_t i0) {
    b_ = b, h_ = h, hk_ = p_.kv_head(h), i0_ = i0, nq_ = std::min(kT, p_.N - i0);
    len_ = p_.kv_len[static_cast<size_t>(b)], before_ = p_.mech.causal ? std::min(i0, len_) : len_;
    keys_.load(p_, b, h);
  }

  void run(core::DirectRows& rows) {
    const int64_t D = p_.D;
    sweep_shared_keys();
    std::copy(keys_.top.begin(), keys_.top.end(), shift_.begin());  // r_f: the top of the keys the whole block sees
    const std::vector<float>& shift = shift_;
    row_softmaxes();
    queries();
    for (int64_t r = 0; r < nq_; ++r)
      for (int64_t f = 0; f < D; ++f) {
        const size_t at = static_cast<size_t>(r * D + f);
        const float z = total_[at];  // 0: the row has no key, so no weight to compute
        qf_[at] = z != 0 ? sigma_[at] * std::exp(shift[static_cast<size_t>(f)] - top_[at]) / z : 0.0f;
        sigma_[at] = z != 0 ? sigma_[at] / z : 0.0f;  // the diagonal's factor
      }
    for (int64_t j0 = 0; j0 < before_; j0 += kT) {
      const int64_t nk = std::min(kT, before_ - j0);
      load_keys(j0, nk);
      for (int64_t f = 0; f < D; ++f) kern_.exp_shift_sum(kt_.data() + f * kT, nk, shift[static_cast<size_t>(f)]);
      kern_.gemm(nq_, nk, D, qf_.data(), D, 1, kt_.data(), kT, tile_.data(), kT, false);
      for (int64_t r = 0; r < nq_; ++r) rows.add(r, tile_.data() + r * kT, nk);
    }
    diagonal(rows);
  }

 private:
  int64_t end(int64_t r) const { return p_.mech.causal ? std::min(i0_ + r + 1, len_) : len_; }

  // Keys [j0, j0 + nk) transposed into kt (kt[f * 64 + j]).
  void load_keys(int64_t j0, int64_t nk) {
    core::load_rows(kern_, p_.k, b_, hk_, j0, nk, len_, krow_.data(), p_.D);
    kern_.pack_qt(krow_.data(), p_.D, static_cast<int>(nk), p_.D, ones_.data(), kt_.data());
  }

  // keys_ over [0, before): per tile and feature, its maximum, then one vector exp pass.
  void sweep_shared_keys() {
    for (int64_t j0 = 0; j0 < before_; j0 += kT) {
      const int64_t nk = std::min(kT, before_ - j0);
      load_keys(j0, nk);
      for (int64_t f = 0; f < p_.D; ++f) {
        float* x = kt_.data() + f * kT;
        const float t = KeySoftmax::next(keys_.top[static_cast<size_t>(f)], *std::max_element(x, x + nk));
        keys_.add(f, t, kern_.exp_shift_sum(x, nk, t));
      }
    }
  }

  // Each row's top and total: the shared keys', then the block's own keys up to the row's last.
  void row_softmaxes() {
    int64_t j = before_;
    for (int64_t r = 0; r < nq_; ++r) {
      for (; j < end(r); ++j) {
        core::load_rows(kern_, p_.k, b_, hk_, j, 1, len_, x_.data(), p_.D);
        keys_.absorb(x_.data(), p_.D);
      }
      std::copy(keys_.top.begin(), keys_.top.end(), top_.begin() + r * p_.D);
      std::copy(keys_.total.begin(), keys_.total.end(), total_.begin() + r * p_.D);
    }
  }

  // sigma_ = scale * softmax(q_i) per row, as the forms take it.
  void queries() {
    core::load_rows(kern_, p_.q, b_, h_, i0_, nq_, p_.N, sigma_.data(), p_.D);
    for (int64_t r = 0; r < nq_; ++r) {
      float* q = sigma_.data() + r * p_.D;
      const float sum = kern_.exp_shift_sum(q, p_.D, *std::max_element(q, q + p_.D));
      for (int64_t f = 0; f < p_.D; ++f) q[f] *= static_cast<float>(p_.scale) / sum;
    }
  }

  // A causal block's own keys [before, end(r)) per row, each weight summed from its definition.
  void diagonal(core::DirectRows& rows) {
    const int64_t D = p_.D, last = end(nq_ - 1);
    if (last <= before_) return;
    core::load_rows(kern_, p_.k, b_, hk_, before_, last - before_, len_, krow_.data(), D);
    for (int64_t r = 0; r < nq_; ++r) {
      float* a = tile_.data() + r * kT;
      const float* top = top_.data() + r * D;
      for (int64_t j = before_; j < end(r); ++j) {
        const float* k = krow_.data() + (j - before_) * D;
        for (int64_t f = 0; f < D; ++f) x_[static_cast<size_t>(f)] = k[f] - top[f];  // top >= k: the row has key j
        kern_.exp_shift_sum(x_.data(), D, 0.0f);
        a[j - before_] = core::dot(x_.data(), sigma_.data() + r * D, D);
      }
      rows.add(r, a, end(r) - before_);
    }
  }

  const kernels::TileKernels& kern_;
  const EfficientProblem& p_;
  int64_t b_ = 0, h_ = 0, hk_ = 0, i0_ = 0, nq_ = 0, len_ = 0, before_ = 0;
  KeySoftmax keys_;
  // krow_: key rows; sigma_, qf_, top_, total_: per row and feature; x_: one row's exponents;
  // shift_: per feature, the top of the keys the whole block sees
  std::vector<float> krow_, sigma_, qf_, top_, total_, x_, tile_, shift_;
  AlignedFloats kt_, ones_;
};

}  // namespace

void efficient_row_stats(const EfficientProblem& p, const core::Outputs& o, const core::Context& ctx) {
  const int64_t blocks = (p.N + kT - 1) / kT, items = p.B * p.H * blocks;
  const int threads = resolve_threads(ctx.threads, items);
  std::vector<Block> work;
  std::vector<core::DirectRows> summaries;
  work.reserve(static_cast<size_t>(threads));
  summaries.reserve(static_cast<size_t>(threads));
  for (int t = 0; t < threads; ++t) work.emplace_back(*ctx.kern, p), summaries.emplace_back(*ctx.kern, o.stats->topk());
  parallel_for(items, threads, [&](int64_t item, int thread) {
    const int64_t b = item / (p.H * blocks), h = item / blocks % p.H, i0 = item % blocks * kT;
    core::DirectRows& rows = summaries[static_cast<size_t>(thread)];
    rows.start();
    Block& block = work[static_cast<size_t>(thread)];
    block.start(b, h, i0);
    block.run(rows);
    for (int64_t r = 0, nq = std::min(kT, p.N - i0); r < nq; ++r) o.stats->put(b, h, i0 + r, rows.summary(r));
  });
}

}  // namespace attn::efficient
