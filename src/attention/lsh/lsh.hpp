// Reformer's LSH attention (attn::Lsh in attn/mechanism.hpp has the rules). Forms: "chunked"
// (per round: sort, then each chunk of 64 sorted queries against its own and the previous key
// chunk with the tile kernels; rounds merged through their log-sum-exp) and "reference"
// (the union of the rounds' pairs as a dense mask, float64 softmax over it).
#pragma once
#include <string>
#include <vector>

#include "core/backward_views.hpp"
#include "core/facts.hpp"
#include "core/form.hpp"
#include "core/io_checks.hpp"
#include "core/reference_result.hpp"

namespace attn::lsh {

struct LshProblem : core::Dims {
  Lsh mech;
  double scale = 1.0;
  int64_t half = 16;           // buckets / 2
  std::vector<float> rotation;  // (D, rounds * half): column r * half + k is round r's k-th direction
};

// One hash round of one (batch, query head): queries and keys sorted by (bucket, position).
// shared_qk: the keys' buckets are the queries' (positions past the valid length sort last).
struct LshRound {
  std::vector<int32_t> q_order, k_order;  // positions in sorted order (N queries, the valid keys)
  std::vector<int32_t> q_rank, k_rank;    // inverses; k_rank = -1 past the valid length
  // Query position i sees key j in this round: j's chunk is i's or the one before.
  bool sees(int64_t i, int64_t j, int64_t chunk) const {
    if (k_rank[j] < 0) return false;
    const int64_t d = q_rank[i] / chunk - k_rank[j] / chunk;
    return d == 0 || d == 1;
  }
};

// Buckets of `count` rows of x (batch b, head h) for every round: out[r * count + t].
void lsh_hash(const LshProblem& p, const TensorView& x, int64_t b, int64_t h, int64_t count, int32_t* out);
// The rounds of (b, h): hashing, then a stable counting sort per round.
std::vector<LshRound> lsh_rounds(const LshProblem& p, int64_t b, int64_t h);
// The same into reusable buffers: after reserve(p) (before a parallel region), lsh_rounds_into
// allocates nothing for any (b, h) of p.
struct LshWork {
  std::vector<LshRound> rounds;  // the result
  std::vector<float> row, dot;
  std::vector<int32_t> qb, kb, cls;
  std::vector<int64_t> start;
  void reserve(const LshProblem& p);
};
void lsh_rounds_into(const LshProblem& p, int64_t b, int64_t h, LshWork& w);
// Whether head h of batch entry b meets a non-finite input: its queries, or its kv head's valid
// keys or values. Hashing a non-finite vector gives no bucket, so which rows meet which keys is
// undefined: every row of such a head is NaN (output and LSE), in every form; in the backward,
// the head's dq rows and its kv head's valid dk, dv rows.
bool head_not_finite(const LshProblem& p, int64_t b, int64_t h);
// Pairs the pattern allows before the rounds (causal, and not the token itself under shared_qk).
inline bool lsh_allowed(const LshProblem& p, int64_t i, int64_t j) {
  return (!p.mech.causal || j <= i + p.M - p.N) && !(p.mech.shared_qk && i == j);
}

struct LshFamily {
  using Mechanism = Lsh;
  using Problem = LshProblem;
  static Problem validate(const TensorView& q, const TensorView& k, const TensorView& v, const Lsh& m,
                          const AttendOptions& options, const core::Outputs& outs);
  static core::Facts facts(const Lsh& m);
  // What facts(m) declares of them, for validation (each without the rest of the facts).
  static std::vector<core::OptionRange> ranges(const Lsh& m);
  static std::vector<core::ParamSpec> params(const Lsh& m);
  static const std::vector<core::Form<Problem>>& forms();
  // What the chunked form computes: per round, every query against its two key chunks.
  static double flops(const Problem& p);
  static core::ReferenceResult reference(const Problem& p, core::RefPrecision precision);
  // dQ, dK, dV (lsh_backward.cpp): the buckets are constants (no gradient through the hashing);
  // forms chunked (float32, per (batch, kv head), the forward's lse) and reference (float64, per
  // round, then the rounds' merge, differentiated by hand). Nothing refused.
  static std::string backward_refusal(const Problem& p);
  static const std::vector<core::BackwardForm<Problem>>& backward_forms();
  static void backward_reference(const Problem& p, const core::BackwardViews& g, core::RefPrecision precision);
};

}  // namespace attn::lsh
