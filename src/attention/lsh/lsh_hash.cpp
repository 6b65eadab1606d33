// LSH hashing and sorting: bucket(x) = argmax([xR, -xR]) per round (ties to the lower index),
// then a stable counting sort of the positions by bucket. Plain portable code, compiled once: the
// buckets are the same on every ISA path, for the fast form and the reference alike.
#include <algorithm>

#include "attn/error.hpp"
#include "attn/pattern.hpp"
#include "lsh/lsh.hpp"

namespace attn::lsh {

namespace {

// lsh_hash with its scratch: row (D floats) and dot (rounds * half floats).
void hash_rows(const LshProblem& p, const TensorView& x, int64_t b, int64_t h, int64_t count, int32_t* out,
               std::vector<float>& row, std::vector<float>& dot) {
  const int64_t rounds = p.mech.rounds, half = p.half, width = rounds * half;
  for (int64_t t = 0; t < count; ++t) {
    if (x.dtype == DType::f32 && x.strides[3] == 1) {
      const auto* src = reinterpret_cast<const float*>(x.ptr(b, h, t));
      std::copy(src, src + p.D, row.begin());
    } else {
      for (int64_t c = 0; c < p.D; ++c) row[static_cast<size_t>(c)] = x.at(b, h, t, c);
    }
    std::fill(dot.begin(), dot.end(), 0.0f);
    for (int64_t c = 0; c < p.D; ++c) {
      const float xc = row[static_cast<size_t>(c)];
      const float* r = p.rotation.data() + c * width;
      for (int64_t k = 0; k < width; ++k) dot[static_cast<size_t>(k)] += xc * r[k];
    }
    for (int64_t r = 0; r < rounds; ++r) {
      const float* d = dot.data() + r * half;
      int64_t best = 0;
      float top = d[0];
      for (int64_t k = 1; k < 2 * half; ++k) {
        const float s = k < half ? d[k] : -d[k - half];
        if (s > top) top = s, best = k;
      }
      out[r * count + t] = static_cast<int32_t>(best);
    }
  }
}

// Positions [0, n) ordered by class (stable): order[rank] = position, rank_of[position] = rank;
// start: classes + 1 counters of scratch.
void counting_sort(const int32_t* cls, int64_t n, int64_t classes, std::vector<int32_t>& order,
                   std::vector<int32_t>& rank_of, std::vector<int64_t>& start) {
  start.assign(static_cast<size_t>(classes + 1), 0);
  for (int64_t t = 0; t < n; ++t) ++start[static_cast<size_t>(cls[t]) + 1];
  for (int64_t c = 0; c < classes; ++c) start[static_cast<size_t>(c + 1)] += start[static_cast<size_t>(c)];
  order.resize(static_cast<size_t>(n));
  for (int64_t t = 0; t < n; ++t) {
    const int64_t at = start[static_cast<size_t>(cls[t])]++;
    order[static_cast<size_t>(at)] = static_cast<int32_t>(t);
    rank_of[static_cast<size_t>(t)] = static_cast<int32_t>(at);
  }
}

}  // namespace

void lsh_hash(const LshProblem& p, const TensorView& x, int64_t b, int64_t h, int64_t count, int32_t* out) {
  std::vector<float> row(static_cast<size_t>(p.D)), dot(static_cast<size_t>(p.mech.rounds * p.half));
  hash_rows(p, x, b, h, count, out, row, dot);
}

// Every buffer at its largest size for p (N queries, at most M valid keys): the assign and resize
// calls of lsh_rounds_into then stay within capacity.
void LshWork::reserve(const LshProblem& p) {
  const int64_t R = p.mech.rounds;
  row.resize(static_cast<size_t>(p.D));
  dot.resize(static_cast<size_t>(R * p.half));
  qb.resize(static_cast<size_t>(R * p.N));
  kb.reserve(static_cast<size_t>(R * p.M));
  cls.resize(static_cast<size_t>(std::max(p.N, p.M)));
  start.reserve(static_cast<size_t>(4 * p.half + 1));  // the queries' classes: 2 x 2 half
  rounds.resize(static_cast<size_t>(R));
  for (LshRound& r : rounds) {
    r.q_order.reserve(static_cast<size_t>(p.N)), r.q_rank.reserve(static_cast<size_t>(p.N));
    r.k_order.reserve(static_cast<size_t>(p.M)), r.k_rank.reserve(static_cast<size_t>(p.M));
  }
}

std::vector<LshRound> lsh_rounds(const LshProblem& p, int64_t b, int64_t h) {
  LshWork w;
  w.reserve(p);
  lsh_rounds_into(p, b, h, w);
  return std::move(w.rounds);
}

void lsh_rounds_into(const LshProblem& p, int64_t b, int64_t h, LshWork& w) {
  const int64_t rounds = p.mech.rounds, buckets = 2 * p.half, L = p.kv_len[b];
  std::vector<int32_t> &qb = w.qb, &kb = w.kb, &cls = w.cls;
  hash_rows(p, p.q, b, h, p.N, qb.data(), w.row, w.dot);
  if (!p.mech.shared_qk) {
    kb.resize(static_cast<size_t>(rounds * L));
    hash_rows(p, p.k, b, p.kv_head(h), L, kb.data(), w.row, w.dot);
  }
  std::vector<LshRound>& out = w.rounds;
  for (int64_t r = 0; r < rounds; ++r) {
    LshRound& round = out[static_cast<size_t>(r)];
    const int32_t* q = qb.data() + r * p.N;
    round.q_rank.assign(static_cast<size_t>(p.N), 0);
    round.k_rank.assign(static_cast<size_t>(p.M), -1);
    // shared_qk: queries past the valid length sort after the others, so the valid queries'
    // ranks are exactly the keys' ranks.
    for (int64_t i = 0; i < p.N; ++i)
      cls[static_cast<size_t>(i)] = q[i] + (p.mech.shared_qk && i >= L ? static_cast<int32_t>(buckets) : 0);
    counting_sort(cls.data(), p.N, 2 * buckets, round.q_order, round.q_rank, w.start);
    counting_sort(p.mech.shared_qk ? q : kb.data() + r * L, L, buckets, round.k_order, round.k_rank, w.start);
  }
}

}  // namespace attn::lsh
