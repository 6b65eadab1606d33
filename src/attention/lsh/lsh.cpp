#include "lsh/lsh.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include "attn/error.hpp"
#include "attn/pattern.hpp"
#include "base/aligned_buffer.hpp"
#include "base/counter_random.hpp"
#include "base/parallel.hpp"
#include "core/kv_rows.hpp"
#include "core/lane_stats.hpp"
#include "core/params.hpp"
#include "core/partial_merge.hpp"
#include "core/reference_softmax_row.hpp"

namespace attn::lsh {
namespace {

const char* kWhere = "attend";
constexpr float kNegInf = -std::numeric_limits<float>::infinity();
// Chunk indices no key / no lane has: far apart, so "0 or 1 chunks behind" never holds for them
// (the difference of the two stays far from 0 and 1, and never overflows).
constexpr int32_t kNoKey = std::numeric_limits<int32_t>::max() / 2;
constexpr int32_t kNoChunk = std::numeric_limits<int32_t>::min() / 2;

}  // namespace

bool head_not_finite(const LshProblem& p, int64_t b, int64_t h) {
  float probe = 0;  // x * 0 is NaN exactly when x is not finite
  for (int64_t i = 0; i < p.N; ++i)
    for (int64_t c = 0; c < p.D; ++c) probe += p.q.at(b, h, i, c) * 0.0f;
  const int64_t hk = p.kv_head(h), len = p.kv_len[static_cast<size_t>(b)];
  for (int64_t j = 0; j < len; ++j) {
    for (int64_t c = 0; c < p.D; ++c) probe += p.k.at(b, hk, j, c) * 0.0f;
    for (int64_t c = 0; c < p.Dv; ++c) probe += p.v.at(b, hk, j, c) * 0.0f;
  }
  return std::isnan(probe);
}

LshProblem LshFamily::validate(const TensorView& q, const TensorView& k, const TensorView& v, const Lsh& m,
                               const AttendOptions& opt, const core::Outputs& outs) {
  core::check_option_ranges(ranges(m), "lsh");
  LshProblem p;
  static_cast<core::Dims&>(p) = core::check_io(q, k, v, outs, opt);
  p.mech = m;
  core::refuse_score_options(opt, "lsh", "its keys are chosen by hashing");
  if (m.buckets < 2 || m.buckets % 2 != 0 || m.buckets > 65536)
    fail(kWhere, "lsh buckets must be even and in [2, 65536] (a rotation gives buckets/2 directions and their "
                 "opposites), got " + std::to_string(m.buckets));
  if (m.rounds < 1 || m.rounds > 64) fail(kWhere, "lsh rounds must be in [1, 64], got " + std::to_string(m.rounds));
  if (m.chunk < 1) fail(kWhere, "lsh chunk must be >= 1, got " + std::to_string(m.chunk));
  if (p.N >= (int64_t{1} << 31) || p.M >= (int64_t{1} << 31))
    fail(kWhere, "lsh sorts at most 2^31 - 1 queries and keys, got N = " + std::to_string(p.N) +
                     ", M = " + std::to_string(p.M));
  // The rotations are D x rounds x buckets / 2: sized by the keys there are to spread, not by the option.
  if (const int64_t most = std::max<int64_t>(64, 2 * p.M); m.buckets > most)
    fail(kWhere, "lsh buckets must be at most max(64, 2 M) = " + std::to_string(most) + " for M = " +
                     std::to_string(p.M) + " keys (more leave buckets empty; the rotations grow with them), got " +
                     std::to_string(m.buckets));
  if (m.shared_qk && p.N != p.M)
    fail(kWhere, "lsh shared_qk needs as many queries as keys (they are the same tokens), got N = " +
                     std::to_string(p.N) + ", M = " + std::to_string(p.M));
  p.scale = m.scale ? *m.scale : 1.0 / std::sqrt(static_cast<double>(p.D));
  p.half = m.buckets / 2;
  const int64_t width = m.rounds * p.half;
  p.rotation.resize(static_cast<size_t>(p.D * width));
  if (!opt.params.empty()) {  // (rounds, D, buckets / 2) -> (D, rounds * buckets / 2)
    core::Symbols symbols{{"rounds", m.rounds}, {"D", p.D}, {"half", p.half}};
    core::check_params(opt.params, params(m), core::mechanism_text(m), symbols);
    const std::vector<float> given = core::to_floats(opt.params.at("rotations"));
    for (int64_t r = 0; r < m.rounds; ++r)
      for (int64_t c = 0; c < p.D; ++c)
        for (int64_t j = 0; j < p.half; ++j)
          p.rotation[static_cast<size_t>(c * width + r * p.half + j)] =
              given[static_cast<size_t>((r * p.D + c) * p.half + j)];
  } else {
    for (int64_t c = 0; c < p.D; ++c)
      for (int64_t j = 0; j < width; ++j)
        p.rotation[static_cast<size_t>(c * width + j)] = static_cast<float>(counter_normal(m.seed, 2, c, j));
  }
  return p;
}

namespace {

constexpr int64_t L = kernels::kQueryTile;

// Every round's partial (m, l, acc) per query position of one (batch, head), merged after the
// last round in round order (R x N x Dv floats per thread); with row statistics, also each
// round's row summary (the rounds count disjoint pairs, so their summaries merge exactly).
struct Partials {
  std::vector<float> m, l, acc;  // (rounds, N), (rounds, N), (rounds, N, Dv)
  std::vector<core::RowSummary> rows;  // (rounds, N)
  std::vector<float> tops;             // (rounds, N, k)
};

struct Scratch {
  AlignedFloats qt, st, ot, m{L}, l{L}, alpha{L}, kbuf, vbuf, qrows;
  std::vector<float> scale = std::vector<float>(L);  // every lane's: the mechanism's scale
  std::vector<float> row;
  Partials part;
  core::LaneStats lanes;
  LshWork hashing;  // the rounds of the current (batch, head)
  // [round][position]: each round's chunk of every query and key; [round][lane]: of the lanes
  std::vector<std::vector<int32_t>> query_chunk, key_chunk, lane_chunk;
  std::vector<float> qrow, krow, top;  // finish(): a query and key row, a merged top-k heap

  // Every buffer at its largest for p (any batch entry's keys; k: the row statistics' top k, or
  // 0), before the parallel region: a HeadRun allocates nothing.
  void reserve(const LshProblem& p, int64_t k) {
    const int64_t R = p.mech.rounds, keys = std::max<int64_t>(p.M, 1);
    if (k) {
      lanes.reserve(k);
      part.rows.resize(static_cast<size_t>(R * p.N));
      part.tops.resize(static_cast<size_t>(R * p.N * k));
    }
    part.m.resize(static_cast<size_t>(R * p.N));
    part.l.resize(static_cast<size_t>(R * p.N));
    part.acc.resize(static_cast<size_t>(R * p.N * p.Dv));
    kbuf.resize(static_cast<size_t>(keys * p.D));
    vbuf.resize(static_cast<size_t>(keys * p.Dv));
    qt.resize(static_cast<size_t>(p.D * L));
    qrows.resize(static_cast<size_t>(L * p.D));
    st.resize(static_cast<size_t>(L * L));
    ot.resize(static_cast<size_t>(p.Dv * L));
    row.resize(static_cast<size_t>(std::max(p.D, p.Dv)));
    hashing.reserve(p);
    query_chunk.assign(static_cast<size_t>(R), std::vector<int32_t>(static_cast<size_t>(p.N)));
    key_chunk.assign(static_cast<size_t>(R), std::vector<int32_t>(static_cast<size_t>(p.M)));
    lane_chunk.assign(static_cast<size_t>(R), std::vector<int32_t>(L));
    qrow.resize(static_cast<size_t>(p.D));
    krow.resize(static_cast<size_t>(p.D));
    top.resize(static_cast<size_t>(k));
  }
};

// The chunked form for one (batch, query head).
class HeadRun {
 public:
  HeadRun(const LshProblem& p, const kernels::TileKernels& kern, Scratch& s, int64_t b, int64_t h)
      : p_(p), kern_(kern), s_(s), b_(b), h_(h), keys_(p.kv_len[b]), rounds_(s.hashing.rounds),
        query_chunk_(s.query_chunk), key_chunk_(s.key_chunk), lane_chunk_(s.lane_chunk) {
    lsh_rounds_into(p, b, h, s.hashing);
    // Each round's chunk of every query and key position, for the earlier-round test.
    const int64_t R = p.mech.rounds, C = p.mech.chunk;
    for (int64_t e = 0; e < R; ++e) {
      const LshRound& round = rounds_[static_cast<size_t>(e)];
      auto& qc = query_chunk_[static_cast<size_t>(e)];
      auto& kc = key_chunk_[static_cast<size_t>(e)];
      for (int64_t i = 0; i < p.N; ++i) qc[static_cast<size_t>(i)] = static_cast<int32_t>(round.q_rank[static_cast<size_t>(i)] / C);
      for (int64_t j = 0; j < p.M; ++j) {
        const int32_t rank = round.k_rank[static_cast<size_t>(j)];
        kc[static_cast<size_t>(j)] = rank < 0 ? kNoKey : static_cast<int32_t>(rank / C);
      }
    }
  }

  void run(const core::Outputs& o) {
    const int64_t R = p_.mech.rounds;
    k_ = o.stats ? o.stats->topk() : 0;  // the buffers are sized (Scratch::reserve); only reset here
    if (k_) {
      for (size_t at = 0; at < s_.part.rows.size(); ++at)  // a query no round reaches: no key
        s_.part.rows[at] = core::RowSummary::empty(core::RowKind::softmax, static_cast<int32_t>(k_),
                                                   s_.part.tops.data() + at * static_cast<size_t>(k_));
    }
    std::fill(s_.part.m.begin(), s_.part.m.end(), kNegInf);
    std::fill(s_.part.l.begin(), s_.part.l.end(), 0.0f);
    std::fill(s_.scale.begin(), s_.scale.end(), static_cast<float>(p_.scale));
    for (int64_t r = 0; r < R; ++r) {
      gather_keys(r);
      for (int64_t t0 = 0; t0 < p_.N; t0 += L) tile(r, t0, std::min(L, p_.N - t0));
    }
    finish(o);
  }

 private:
  // K and V rows of the valid keys in round r's sorted order, as float32.
  void gather_keys(int64_t r) {
    const core::KvRows k(p_.k, b_, p_.kv_head(h_)), v(p_.v, b_, p_.kv_head(h_));
    const auto& order = rounds_[static_cast<size_t>(r)].k_order;
    for (int64_t s = 0; s < keys_; ++s) {
      const int64_t j = order[static_cast<size_t>(s)];
      kern_.to_float(k.row(j), k.dtype(), k.elem_stride(), p_.D, s_.kbuf.data() + s * p_.D);
      kern_.to_float(v.row(j), v.dtype(), v.elem_stride(), p_.Dv, s_.vbuf.data() + s * p_.Dv);
    }
  }

  // Sorted queries [t0, t0 + n) of round r against the key chunks their chunks see.
  void tile(int64_t r, int64_t t0, int64_t n) {
    const LshRound& round = rounds_[static_cast<size_t>(r)];
    const int64_t C = p_.mech.chunk;
    float* qt = s_.qt.data();
    for (int64_t i = 0; i < n; ++i)  // the sorted queries' rows, then one scaled transpose
      kern_.to_float(p_.q.ptr(b_, h_, round.q_order[static_cast<size_t>(t0 + i)]), p_.q.dtype, p_.q.strides[3], p_.D,
                     s_.qrows.data() + i * p_.D);
    kern_.pack_qt(s_.qrows.data(), p_.D, static_cast<int>(n), p_.D, s_.scale.data(), qt);
    float *m = s_.m.data(), *l = s_.l.data(), *ot = s_.ot.data(), *st = s_.st.data();
    std::fill(m, m + L, kNegInf);
    std::fill(l, l + L, 0.0f);
    std::fill(ot, ot + p_.Dv * L, 0.0f);
    if (k_) s_.lanes.start();
    const int64_t c0 = t0 / C, c1 = (t0 + n - 1) / C;
    const int64_t k0 = std::max<int64_t>(0, (c0 - 1) * C), k1 = std::min(keys_, (c1 + 1) * C);
    // Per lane: its position, its chunk in this round and in each earlier one (padding lanes
    // get a chunk no key has).
    for (int64_t i = 0; i < L; ++i) {
      const bool live = i < n;
      const int32_t pos = live ? round.q_order[static_cast<size_t>(t0 + i)] : 0;
      lane_pos_[i] = pos;
      lane_chunk_[0][i] = live ? static_cast<int32_t>((t0 + i) / C) : kNoChunk;
      for (int64_t e = 0; e < r; ++e) lane_chunk_[e + 1][i] = live ? query_chunk_[e][pos] : kNoChunk;
    }
    for (int64_t j0 = k0; j0 < k1; j0 += L) {
      const int64_t bc = std::min(L, k1 - j0);
      kern_.qk(qt, p_.D, s_.kbuf.data() + j0 * p_.D, p_.D, bc, st, 0, L);
      for (int64_t jj = 0; jj < bc; ++jj) hide_uncounted(r, round, j0 + jj, st + jj * L);
      if (k_)
        s_.lanes.update(kern_, st, bc, m, l, s_.alpha.data(), 0, L);
      else
        kern_.softmax_update(st, bc, m, l, s_.alpha.data(), 0, L);
      kern_.pv(st, bc, s_.vbuf.data() + j0 * p_.Dv, p_.Dv, p_.Dv, ot, s_.alpha.data(), 0, L);
    }
    for (int64_t i = 0; i < n; ++i) {
      const int64_t at = r * p_.N + round.q_order[static_cast<size_t>(t0 + i)];
      s_.part.m[static_cast<size_t>(at)] = m[i];
      s_.part.l[static_cast<size_t>(at)] = l[i];
      float* acc = s_.part.acc.data() + at * p_.Dv;
      for (int64_t c = 0; c < p_.Dv; ++c) acc[c] = ot[c * L + i];
      if (k_) {
        s_.part.rows[static_cast<size_t>(at)].keep(s_.lanes.summary(static_cast<int>(i), m[i], l[i]));
      }
    }
  }

  // Hides, in the score row of sorted key ks, the lanes that do not count the pair in round r:
  // the key's chunk is not the lane's or the one before, the pattern forbids it (causal, self
  // under shared_qk), or an earlier round had it (each key once in the union).
  void hide_uncounted(int64_t r, const LshRound& round, int64_t ks, float* srow) {
    const int32_t j = round.k_order[static_cast<size_t>(ks)];
    const auto near = [](int32_t lane_chunk, int32_t key_chunk) {
      return static_cast<uint32_t>(lane_chunk - key_chunk) <= 1u;  // 0 or 1 chunks behind
    };
    const int32_t kc = static_cast<int32_t>(ks / p_.mech.chunk);
    const auto last = static_cast<int32_t>(j - (p_.M - p_.N));  // causal: lanes at positions >= this
    uint8_t* keep = keep_;
    for (int64_t i = 0; i < L; ++i)
      keep[i] = near(lane_chunk_[0][i], kc) && (!p_.mech.causal || lane_pos_[i] >= last) &&
                (!p_.mech.shared_qk || lane_pos_[i] != j);
    for (int64_t e = 0; e < r; ++e) {
      const int32_t ke = key_chunk_[e][j];
      for (int64_t i = 0; i < L; ++i) keep[i] &= !near(lane_chunk_[e + 1][i], ke);
    }
    for (int64_t i = 0; i < L; ++i) srow[i] = keep[i] ? srow[i] : kNegInf;
  }

  // Rounds merged per query in round order; under shared_qk a query that saw nothing else
  // attends to itself.
  void finish(const core::Outputs& o) {
    const int64_t R = p_.mech.rounds;
    const bool poisoned = head_not_finite(p_, b_, h_);
    float* row = s_.row.data();
    std::vector<float> &qrow = s_.qrow, &krow = s_.krow, &top = s_.top;
    for (int64_t i = 0; i < p_.N; ++i) {
      core::RowSummary whole = core::RowSummary::empty(core::RowKind::softmax, static_cast<int32_t>(k_), top.data());
      for (int64_t r = 0; r < R && k_; ++r) core::merge_into(whole, s_.part.rows[static_cast<size_t>(r * p_.N + i)]);
      float lse = core::merge_partials(R, s_.part.m.data() + i, s_.part.l.data() + i, p_.N,
                                       s_.part.acc.data() + i * p_.Dv, p_.N * p_.Dv, p_.Dv, row);
      if (lse == kNegInf && p_.mech.shared_qk && i < keys_) {
        kern_.to_float(p_.q.ptr(b_, h_, i), p_.q.dtype, p_.q.strides[3], p_.D, qrow.data());
        kern_.to_float(p_.k.ptr(b_, p_.kv_head(h_), i), p_.k.dtype, p_.k.strides[3], p_.D, krow.data());
        float dot = 0;
        for (int64_t c = 0; c < p_.D; ++c) dot += qrow[static_cast<size_t>(c)] * krow[static_cast<size_t>(c)];
        lse = dot * static_cast<float>(p_.scale);
        kern_.to_float(p_.v.ptr(b_, p_.kv_head(h_), i), p_.v.dtype, p_.v.strides[3], p_.Dv, row);
        if (k_) {  // the one key: weight 1
          whole = core::RowSummary::empty(core::RowKind::softmax, static_cast<int32_t>(k_), top.data());
          const float self = lse;
          core::stream_scores(whole, &self, 1);
        }
      }
      if (k_) o.stats->put(b_, h_, i, whole);
      if (poisoned) std::fill(row, row + p_.Dv, lse = std::numeric_limits<float>::quiet_NaN());
      kern_.from_float(row, o.out->dtype, o.out->strides[3], p_.Dv, o.out->ptr(b_, h_, i));
      if (o.lse) static_cast<float*>(o.lse->data)[o.lse->offset(b_, h_, i, 0)] = lse;
    }
  }

  const LshProblem& p_;
  const kernels::TileKernels& kern_;
  Scratch& s_;
  int64_t b_, h_, keys_;
  const std::vector<LshRound>& rounds_;  // in s_.hashing
  std::vector<std::vector<int32_t>> &query_chunk_, &key_chunk_;  // [round][position]
  std::vector<std::vector<int32_t>>& lane_chunk_;  // [0]: this round's; [e + 1]: round e's, per lane
  int64_t k_ = 0;  // top k of the row statistics; 0: none asked for
  int32_t lane_pos_[L];
  uint8_t keep_[L];
};

void run_chunked(const LshProblem& p, const core::Outputs& o, const core::Context& ctx) {
  const int64_t items = p.B * p.H;
  const int threads = resolve_threads(ctx.threads, items);
  std::vector<Scratch> scratch(static_cast<size_t>(threads));
  for (Scratch& s : scratch) s.reserve(p, o.stats ? o.stats->topk() : 0);
  parallel_for(items, threads, [&](int64_t item, int t) {
    HeadRun(p, *ctx.kern, scratch[static_cast<size_t>(t)], item / p.H, item % p.H).run(o);
  });
}

// ---- the reference: the rounds' union as a dense mask, softmax over it ------------------------

template <class T>
core::ReferenceResult reference_impl(const LshProblem& p, bool plain) {
  const DType dt = p.q.dtype;
  const core::Rounding<T> rnd{dt, plain};
  core::ReferenceResult r = core::zero_result(p.B, p.H, p.N, p.M, p.Dv, p.stats_topk);
  r.lse.assign(static_cast<size_t>(p.B * p.H * p.N), -std::numeric_limits<double>::infinity());
  r.probs.assign(static_cast<size_t>(p.B * p.H * p.N * p.M), 0.0);
  std::vector<uint8_t> vis(static_cast<size_t>(p.M));
  std::vector<T> s(static_cast<size_t>(p.M));
  for (int64_t b = 0; b < p.B; ++b)
    for (int64_t h = 0; h < p.H; ++h) {
      const std::vector<LshRound> rounds = lsh_rounds(p, b, h);
      const int64_t hk = p.kv_head(h);
      for (int64_t i = 0; i < p.N; ++i) {
        bool any = false;
        for (int64_t j = 0; j < p.M; ++j) {
          bool seen = false;
          for (const LshRound& round : rounds) seen = seen || round.sees(i, j, p.mech.chunk);
          vis[static_cast<size_t>(j)] = seen && lsh_allowed(p, i, j);
          any = any || vis[static_cast<size_t>(j)];
        }
        if (p.mech.shared_qk && !any && i < p.kv_len[b]) vis[static_cast<size_t>(i)] = 1, any = true;
        if (!any) continue;
        for (int64_t j = 0; j < p.M; ++j) {
          if (!vis[static_cast<size_t>(j)]) continue;
          T dot = 0;
          for (int64_t c = 0; c < p.D; ++c) dot += static_cast<T>(p.q.at(b, h, i, c)) * static_cast<T>(p.k.at(b, hk, j, c));
          s[static_cast<size_t>(j)] = rnd(dot * static_cast<T>(p.scale));
        }
        const size_t at = static_cast<size_t>((b * p.H + h) * p.N + i);
        core::reference_softmax_row(
            s, vis.data(), p.Dv, rnd, [&](int64_t j, int64_t c) { return static_cast<T>(p.v.at(b, hk, j, c)); },
            r.lse[at], &r.probs[at * p.M], &r.out[at * p.Dv], r.stats_of(b, h, i), p.stats_topk);
      }
      if (head_not_finite(p, b, h))
        for (int64_t i = 0; i < p.N; ++i) {
          const size_t at = static_cast<size_t>((b * p.H + h) * p.N + i);
          r.lse[at] = std::numeric_limits<double>::quiet_NaN();
          std::fill(&r.out[at * p.Dv], &r.out[at * p.Dv] + p.Dv, std::numeric_limits<double>::quiet_NaN());
        }
    }
  return r;
}

void run_reference(const LshProblem& p, const core::Outputs& o, const core::Context&) {
  core::write_reference(reference_impl<double>(p, false), o);
}

}  // namespace

const std::vector<core::Form<LshProblem>>& LshFamily::forms() {
  static const std::vector<core::Form<LshProblem>> list = {
      {"chunked", "per round: hash, sort, each sorted chunk against itself and the previous one; rounds merged",
       core::refuse_probs<LshProblem>, run_chunked},
      {"reference", "the rounds' union as a dense mask, float64 softmax (slow, exact)",
       core::refuse_nothing<LshProblem>, run_reference},
  };
  return list;
}

double LshFamily::flops(const LshProblem& p) {
  // Per round and batch entry: sorted query tiles of 64 against the key chunks they reach.
  double pairs = 0;
  const int64_t C = p.mech.chunk;
  for (int64_t b = 0; b < p.B; ++b)
    for (int64_t t0 = 0; t0 < p.N; t0 += L) {
      const int64_t n = std::min(L, p.N - t0), c0 = t0 / C, c1 = (t0 + n - 1) / C;
      const int64_t k0 = std::max<int64_t>(0, (c0 - 1) * C), k1 = std::min(p.kv_len[b], (c1 + 1) * C);
      pairs += static_cast<double>(n) * static_cast<double>(std::max<int64_t>(0, k1 - k0));
    }
  return 2.0 * static_cast<double>(p.D + p.Dv) * pairs * static_cast<double>(p.H * p.mech.rounds);
}

core::ReferenceResult LshFamily::reference(const LshProblem& p, core::RefPrecision precision) {
  return precision == core::RefPrecision::f64 ? reference_impl<double>(p, false) : reference_impl<float>(p, true);
}

}  // namespace attn::lsh

namespace attn {

LshBuckets lsh_buckets(const TensorView& q, const TensorView& k, const TensorView& v, const Lsh& mechanism,
                       const AttendOptions& options) {
  const lsh::LshProblem p = lsh::LshFamily::validate(q, k, v, mechanism, options, core::Outputs{});
  LshBuckets out;
  out.B = p.B, out.H = p.H, out.rounds = p.mech.rounds, out.N = p.N, out.M = p.M;
  out.key_heads = p.mech.shared_qk ? p.H : p.Hkv;
  out.query.resize(static_cast<size_t>(p.B * p.H * p.mech.rounds * p.N));
  out.key.assign(static_cast<size_t>(p.B * out.key_heads * p.mech.rounds * p.M), -1);
  for (int64_t b = 0; b < p.B; ++b) {
    for (int64_t h = 0; h < p.H; ++h)
      lsh::lsh_hash(p, p.q, b, h, p.N, out.query.data() + (b * p.H + h) * p.mech.rounds * p.N);
    for (int64_t h = 0; h < out.key_heads; ++h) {
      const int64_t len = p.kv_len[b];
      std::vector<int32_t> kb(static_cast<size_t>(p.mech.rounds * len));
      lsh::lsh_hash(p, p.mech.shared_qk ? p.q : p.k, b, h, len, kb.data());
      for (int64_t r = 0; r < p.mech.rounds; ++r)
        std::copy(kb.begin() + r * len, kb.begin() + (r + 1) * len,
                  out.key.begin() + ((b * out.key_heads + h) * p.mech.rounds + r) * p.M);
    }
  }
  return out;
}

}  // namespace attn
