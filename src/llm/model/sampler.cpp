#include "attn/sampler.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include "attn/error.hpp"
#include "base/counter_random.hpp"
#include "model/nucleus.hpp"

namespace attn {
namespace model {

Nucleus nucleus(const float* logits, int64_t vocab, double temperature, double top_p) {
  const float top = *std::max_element(logits, logits + vocab);
  // probabilities in float64, unnormalised (the best is 1; -inf logits give 0)
  std::vector<double> p(static_cast<size_t>(vocab));
  for (int64_t i = 0; i < vocab; ++i) p[i] = std::exp((static_cast<double>(logits[i]) - top) / temperature);
  Nucleus n;
  n.ids.resize(static_cast<size_t>(vocab));
  std::iota(n.ids.begin(), n.ids.end(), 0);
  size_t keep = n.ids.size();
  if (top_p < 1.0) {
    const double total = std::accumulate(p.begin(), p.end(), 0.0);
    // The nucleus is summed in another order than `total`; the two sums differ by at most
    // vocab * eps * total, so a nucleus reaching top_p * total up to that is complete (else
    // rounding alone would drag every remaining token, however unlikely, into it).
    const double target = top_p * total - static_cast<double>(vocab) * std::numeric_limits<double>::epsilon() * total;
    auto before = [&](int32_t a, int32_t b) { return p[a] > p[b] || (p[a] == p[b] && a < b); };
    // most likely tokens first until their mass reaches the target (sorting only as many as
    // needed: 64, 256, ... candidates)
    for (size_t k = 64;; k *= 4) {
      k = std::min(k, n.ids.size());
      std::partial_sort(n.ids.begin(), n.ids.begin() + static_cast<std::ptrdiff_t>(k), n.ids.end(), before);
      double mass = 0.0;
      keep = 0;
      while (keep < k && (keep == 0 || mass < target)) mass += p[n.ids[keep++]];
      if (mass >= target || k == n.ids.size()) break;
    }
    n.ids.resize(keep);
  }
  n.cumulative.resize(n.ids.size());
  double sum = 0.0;
  for (size_t i = 0; i < n.ids.size(); ++i) n.cumulative[i] = sum += p[n.ids[i]];
  return n;
}

int32_t pick(const Nucleus& n, double x) {
  // u < cumulative.back() for every x < 1 (x * c rounds to c only if x >= 1 - 2^-53), so the
  // first cumulative sum above u exists, and it rose at that token: the token's probability is
  // not zero. Comparing against sums (not subtracting from u) keeps one rounding per token.
  const double u = x * n.cumulative.back();
  const auto it = std::upper_bound(n.cumulative.begin(), n.cumulative.end(), u);
  const size_t i = it == n.cumulative.end() ? n.cumulative.size() - 1 : static_cast<size_t>(it - n.cumulative.begin());
  return n.ids[i];
}

double draw(uint64_t seed, uint64_t step) { return unit_uniform(splitmix64(splitmix64(seed) ^ step)); }

}  // namespace model

namespace {

// A double as people write it: 1.5, 0.001, -1 (std::to_string gives 1.500000).
std::string number_text(double x) {
  char buffer[32];
  std::snprintf(buffer, sizeof buffer, "%.17g", x);
  std::string shortest = buffer;
  for (int digits = 1; digits <= 17; ++digits) {
    std::snprintf(buffer, sizeof buffer, "%.*g", digits, x);
    if (std::strtod(buffer, nullptr) == x || std::isnan(x)) return buffer;
  }
  return shortest;
}

}  // namespace

Sampler::Sampler(const SamplingOptions& options) : options_(options) {
  if (!(options.temperature >= 0.0) || !std::isfinite(options.temperature))
    fail("sampling", "temperature must be a finite number >= 0, got " + number_text(options.temperature));
  if (!(options.top_p > 0.0 && options.top_p <= 1.0))
    fail("sampling", "top_p must be in (0, 1], got " + number_text(options.top_p));
  if (options.top_k < 0) fail("sampling", "top_k must be >= 0 (0: off), got " + std::to_string(options.top_k));
  if (!(options.min_p >= 0.0 && options.min_p <= 1.0))
    fail("sampling", "min_p must be in [0, 1] (0: off), got " + number_text(options.min_p));
  if (!(options.repeat_penalty > 0.0) || !std::isfinite(options.repeat_penalty))
    fail("sampling", "repeat_penalty must be a finite number > 0 (1: off), got " + number_text(options.repeat_penalty));
  if (options.repeat_last_n < -1)
    fail("sampling", "repeat_last_n must be >= -1 (0: no token, -1: the whole context), got " +
                         std::to_string(options.repeat_last_n));
}

namespace {

// Logits must be finite or -inf (a token that cannot come), with one finite at least: NaN (a
// model with NaN weights) and +inf (softmax has no value) are errors naming the step, never a
// token chosen by how max_element happens to treat them.
void check_logits(const float* logits, int64_t vocab, uint64_t step) {
  int64_t nan = 0, inf = 0, finite = 0, first_bad = -1;
  for (int64_t i = 0; i < vocab; ++i) {
    const float x = logits[i];
    if (std::isnan(x)) ++nan;
    else if (x == std::numeric_limits<float>::infinity()) ++inf;
    else if (x != -std::numeric_limits<float>::infinity()) ++finite;
    if ((std::isnan(x) || x == std::numeric_limits<float>::infinity()) && first_bad < 0) first_bad = i;
  }
  const std::string at = "the logits at step " + std::to_string(step) + " (new token " + std::to_string(step + 1) + ")";
  if (nan + inf > 0)
    fail("sampling", at + " are not finite: " + std::to_string(nan) + " NaN and " + std::to_string(inf) + " +inf of " +
                         std::to_string(vocab) + " (the first at token " + std::to_string(first_bad) +
                         "); the model's weights or activations hold non-finite values");
  if (finite == 0) fail("sampling", at + " are all -inf: no token is possible");
}

}  // namespace

int32_t Sampler::next(const float* logits, int64_t vocab, std::span<const int32_t> context) {
  if (vocab < 1) fail("sampling", "vocab must be >= 1, got " + std::to_string(vocab));
  const uint64_t step = step_++;
  check_logits(logits, vocab, step);
  const SamplingOptions& o = options_;
  // 1. the repetition penalty, on a copy of the row (once per distinct recent id)
  std::vector<float> row;
  const size_t recent = o.repeat_last_n < 0 ? context.size() : std::min(context.size(), static_cast<size_t>(o.repeat_last_n));
  if (o.repeat_penalty != 1.0 && recent > 0) {
    row.assign(logits, logits + vocab);
    std::vector<bool> seen(static_cast<size_t>(vocab), false);
    for (const int32_t id : context.subspan(context.size() - recent)) {
      if (id < 0 || id >= vocab)
        fail("sampling", "the context holds token " + std::to_string(id) + ", outside the vocabulary of " +
                             std::to_string(vocab));
      if (seen[static_cast<size_t>(id)]) continue;
      seen[static_cast<size_t>(id)] = true;
      float& x = row[static_cast<size_t>(id)];
      x = x > 0.0f ? static_cast<float>(x / o.repeat_penalty) : static_cast<float>(x * o.repeat_penalty);
    }
    logits = row.data();
  }
  if (o.temperature == 0.0)
    return static_cast<int32_t>(std::max_element(logits, logits + vocab) - logits);  // first of equal maxima
  // 2. top-k: the k largest logits stay (ties to the lower id), the others become -inf
  if (o.top_k > 0 && o.top_k < vocab) {
    if (row.empty()) row.assign(logits, logits + vocab);
    std::vector<int32_t> ids(static_cast<size_t>(vocab));
    std::iota(ids.begin(), ids.end(), 0);
    auto before = [&](int32_t a, int32_t b) { return row[a] > row[b] || (row[a] == row[b] && a < b); };
    std::nth_element(ids.begin(), ids.begin() + o.top_k, ids.end(), before);
    for (auto it = ids.begin() + o.top_k; it != ids.end(); ++it) row[static_cast<size_t>(*it)] = -std::numeric_limits<float>::infinity();
    logits = row.data();
  }
  // 3. top-p, then min-p on the nucleus: p / p_max = exp((logit - top) / temperature) >= min_p
  model::Nucleus n = model::nucleus(logits, vocab, o.temperature, o.top_p);
  if (o.min_p > 0.0) {
    const double top = *std::max_element(logits, logits + vocab);
    model::Nucleus kept;
    double sum = 0.0;
    for (const int32_t id : n.ids) {
      const double p = std::exp((static_cast<double>(logits[id]) - top) / o.temperature);
      if (p < o.min_p) continue;  // the most likely token has p = 1 >= min_p: one stays at least
      kept.ids.push_back(id);
      kept.cumulative.push_back(sum += p);
    }
    n = std::move(kept);
  }
  return model::pick(n, model::draw(o.seed, step));
}

void check_generation_length(const std::string& argument, int64_t prompt_tokens, int64_t max_tokens, int64_t max_seq_len) {
  if (max_tokens < 0) fail(argument, "must be >= 0, got " + std::to_string(max_tokens));
  const int64_t room = max_seq_len - prompt_tokens;
  if (max_tokens > room)
    fail(argument, std::to_string(max_tokens) + " new tokens after a prompt of " + std::to_string(prompt_tokens) +
                       " exceed the context of " + std::to_string(max_seq_len) + " tokens (at most " +
                       std::to_string(std::max<int64_t>(room, 0)) + ")");
}

}  // namespace attn
