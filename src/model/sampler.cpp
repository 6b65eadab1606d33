#include "attn/sampler.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>
#include <vector>

#include "attn/error.hpp"
#include "base/counter_random.hpp"

namespace attn {

Sampler::Sampler(const SamplingOptions& options) : options_(options) {
  if (!(options.temperature >= 0.0) || !std::isfinite(options.temperature))
    fail("sampling", "temperature must be a finite number >= 0, got " + std::to_string(options.temperature));
  if (!(options.top_p > 0.0 && options.top_p <= 1.0))
    fail("sampling", "top_p must be in (0, 1], got " + std::to_string(options.top_p));
}

int32_t Sampler::next(const float* logits, int64_t vocab) {
  if (vocab < 1) fail("sampling", "vocab must be >= 1, got " + std::to_string(vocab));
  const uint64_t step = step_++;
  const int64_t best = std::max_element(logits, logits + vocab) - logits;  // first of equal maxima
  if (options_.temperature == 0.0 || !std::isfinite(logits[best])) return static_cast<int32_t>(best);
  // probabilities in float64, most likely first (ties by id, so the order is deterministic)
  std::vector<double> p(static_cast<size_t>(vocab));
  for (int64_t i = 0; i < vocab; ++i) p[i] = std::exp((static_cast<double>(logits[i]) - logits[best]) / options_.temperature);
  const double total = std::accumulate(p.begin(), p.end(), 0.0);
  auto before = [&](int32_t a, int32_t b) { return p[a] > p[b] || (p[a] == p[b] && a < b); };
  std::vector<int32_t> order(static_cast<size_t>(vocab));
  std::iota(order.begin(), order.end(), 0);
  size_t keep = order.size();
  double mass = total;
  if (options_.top_p < 1.0) {
    // the nucleus: most likely tokens first until their mass reaches top_p (sorting only as many
    // as needed: 64, 256, ... candidates)
    for (size_t k = 64;; k *= 4) {
      k = std::min(k, order.size());
      std::partial_sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(k), order.end(), before);
      keep = 0, mass = 0.0;
      while (keep < k && (keep == 0 || mass < options_.top_p * total)) mass += p[order[keep++]];
      if (mass >= options_.top_p * total || k == order.size()) break;
    }
  }
  double u = unit_uniform(splitmix64(options_.seed * 0x9E3779B97F4A7C15ull + step)) * mass;
  for (size_t i = 0; i < keep; ++i) {
    u -= p[order[i]];
    if (u < 0.0) return order[i];
  }
  return order[keep - 1];
}

}  // namespace attn
