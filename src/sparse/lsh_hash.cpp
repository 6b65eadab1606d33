// LSH hashing and sorting: bucket(x) = argmax([xR, -xR]) per round (ties to the lower index),
// then a stable counting sort of the positions by bucket. Plain portable code, compiled once: the
// buckets are the same on every ISA path, for the fast form and the reference alike.
#include <algorithm>

#include "attn/error.hpp"
#include "attn/pattern.hpp"
#include "sparse/lsh.hpp"

namespace attn::sparse {

void lsh_hash(const LshProblem& p, const TensorView& x, int64_t b, int64_t h, int64_t count, int32_t* out) {
  const int64_t rounds = p.mech.rounds, half = p.half, width = rounds * half;
  std::vector<float> row(static_cast<size_t>(p.D)), dot(static_cast<size_t>(width));
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

namespace {

// Positions [0, n) ordered by class (stable): order[rank] = position, rank_of[position] = rank.
void counting_sort(const int32_t* cls, int64_t n, int64_t classes, std::vector<int32_t>& order,
                   std::vector<int32_t>& rank_of) {
  std::vector<int64_t> start(static_cast<size_t>(classes + 1), 0);
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

std::vector<LshRound> lsh_rounds(const LshProblem& p, int64_t b, int64_t h) {
  const int64_t rounds = p.mech.rounds, buckets = 2 * p.half, L = p.kv_len[b];
  std::vector<int32_t> qb(static_cast<size_t>(rounds * p.N)), kb;
  lsh_hash(p, p.q, b, h, p.N, qb.data());
  if (!p.mech.shared_qk) {
    kb.resize(static_cast<size_t>(rounds * L));
    lsh_hash(p, p.k, b, p.kv_head(h), L, kb.data());
  }
  std::vector<LshRound> out(static_cast<size_t>(rounds));
  std::vector<int32_t> cls(static_cast<size_t>(std::max(p.N, L)));
  for (int64_t r = 0; r < rounds; ++r) {
    LshRound& round = out[static_cast<size_t>(r)];
    const int32_t* q = qb.data() + r * p.N;
    round.q_rank.assign(static_cast<size_t>(p.N), 0);
    round.k_rank.assign(static_cast<size_t>(p.M), -1);
    // shared_qk: queries past the valid length sort after the others, so the valid queries'
    // ranks are exactly the keys' ranks.
    for (int64_t i = 0; i < p.N; ++i)
      cls[static_cast<size_t>(i)] = q[i] + (p.mech.shared_qk && i >= L ? static_cast<int32_t>(buckets) : 0);
    counting_sort(cls.data(), p.N, 2 * buckets, round.q_order, round.q_rank);
    counting_sort(p.mech.shared_qk ? q : kb.data() + r * L, L, buckets, round.k_order, round.k_rank);
  }
  return out;
}

}  // namespace attn::sparse
