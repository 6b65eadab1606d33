// The two halves of a nucleus draw, apart so that tests can feed them draws at the extremes
// (0 and the largest double below 1) without searching for seeds that produce them.
#pragma once
#include <cstdint>
#include <vector>

namespace attn::model {

// The tokens a draw may return, most likely first (ties by id), and the running sum of their
// unnormalised probabilities, summed in that order: cumulative[i] = p[ids[0]] + ... + p[ids[i]].
struct Nucleus {
  std::vector<int32_t> ids;
  std::vector<double> cumulative;
};

// The smallest set of most likely tokens whose probability reaches top_p (all tokens when top_p
// is 1) of softmax(logits / temperature). Logits must be finite or -inf, with at least one
// finite (Sampler::next checks); temperature > 0; top_p in (0, 1].
Nucleus nucleus(const float* logits, int64_t vocab, double temperature, double top_p);

// The token whose cumulative interval [cumulative[i-1], cumulative[i]) holds x * cumulative.back(),
// for x in [0, 1): always one of n.ids, never one whose probability added nothing to the sum
// (an empty interval), whatever x.
int32_t pick(const Nucleus& n, double x);

// The uniform draw in [0, 1) of (seed, step). The seed and the step are mixed by two rounds of
// splitmix64, so no seed a user would write (0, 2^64 - 1, ...) maps a step to a draw of exactly 0
// (one mixing round of seed * phi + step did: seed 2^64 - 1 gave 0 at step 0, which with top_p =
// 1 picked the lowest id whatever its probability).
double draw(uint64_t seed, uint64_t step);

}  // namespace attn::model
