// Greedy, nucleus, top-k, min-p sampling and the repetition penalty: choices, reproducibility by seed, frequencies, bad options.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "attn/sampler.hpp"
#include "model/nucleus.hpp"
#include "support/expect_error.hpp"

namespace attn {
namespace {

TEST(Sampler, GreedyTakesTheFirstLargestLogit) {
  Sampler s({});
  const float logits[5] = {0.5f, 2.0f, -1.0f, 2.0f, 1.0f};
  EXPECT_EQ(s.next(logits, 5), 1);
  EXPECT_EQ(s.next(logits, 5), 1);
}

TEST(Sampler, DrawsFollowTheProbabilitiesAndTheSeed) {
  // logits log(1), log(2), log(3), log(4): probabilities 0.1 .. 0.4 at temperature 1
  const float logits[4] = {0.0f, std::log(2.0f), std::log(3.0f), std::log(4.0f)};
  Sampler a({1.0, 1.0, 42}), b({1.0, 1.0, 42}), c({1.0, 1.0, 43});
  std::vector<int> count(4, 0);
  int differs = 0;
  const int n = 20000;
  for (int i = 0; i < n; ++i) {
    const int32_t x = a.next(logits, 4);
    EXPECT_EQ(x, b.next(logits, 4));
    differs += x != c.next(logits, 4);
    ++count[x];
  }
  EXPECT_GT(differs, n / 2);  // another seed, another sequence
  for (int k = 0; k < 4; ++k)  // 5 standard deviations of a binomial count
    EXPECT_NEAR(count[k], n * 0.1 * (k + 1), 5 * std::sqrt(n * 0.1 * (k + 1) * (1 - 0.1 * (k + 1)))) << k;
}

TEST(Sampler, TopPKeepsTheSmallestSetReachingIt) {
  const float logits[4] = {0.0f, std::log(2.0f), std::log(3.0f), std::log(4.0f)};
  // top_p 0.65: {3, 2} (0.4 + 0.3 = 0.7 >= 0.65); token 0 and 1 never drawn
  Sampler s({1.0, 0.65, 7});
  std::vector<int> count(4, 0);
  for (int i = 0; i < 4000; ++i) ++count[s.next(logits, 4)];
  EXPECT_EQ(count[0], 0);
  EXPECT_EQ(count[1], 0);
  EXPECT_NEAR(count[3] / 4000.0, 4.0 / 7.0, 0.04);
  // a tiny top_p is greedy; a large vocabulary takes the widening partial sort
  Sampler t({0.7, 1e-9, 1});
  std::vector<float> wide(50000);
  for (size_t i = 0; i < wide.size(); ++i) wide[i] = std::sin(static_cast<float>(i));
  wide[31337] = 3.0f;
  EXPECT_EQ(t.next(wide.data(), 50000), 31337);
  Sampler u({1.0, 0.999, 3});
  for (int i = 0; i < 20; ++i) EXPECT_LT(u.next(wide.data(), 50000), 50000);
}

TEST(Sampler, BadOptionsAreErrors) {
  testing::expect_error([] { Sampler({-1.0, 1.0, 0}); }, "temperature must be a finite number >= 0, got -1");
  testing::expect_error([] { Sampler({1.0, 0.0, 0}); }, "top_p must be in (0, 1], got 0");
  testing::expect_error([] { Sampler({1.0, 1.5, 0}); }, "top_p must be in (0, 1], got 1.5");
  testing::expect_error([] { Sampler({1.0, 1.0, 0, -1}); }, "sampling: top_k must be >= 0 (0: off), got -1");
  testing::expect_error([] { Sampler({1.0, 1.0, 0, 0, 1.5}); }, "sampling: min_p must be in [0, 1] (0: off), got 1.5");
  testing::expect_error([] { Sampler({1.0, 1.0, 0, 0, -0.1}); }, "min_p must be in [0, 1] (0: off), got -0.1");
  testing::expect_error([] { Sampler({1.0, 1.0, 0, 0, 0.0, 0.0}); }, "repeat_penalty must be a finite number > 0 (1: off), got 0");
  testing::expect_error([] { Sampler({1.0, 1.0, 0, 0, 0.0, INFINITY}); }, "repeat_penalty must be a finite number > 0 (1: off), got inf");
  testing::expect_error([] { Sampler({1.0, 1.0, 0, 0, 0.0, 1.1, -2}); },
                        "repeat_last_n must be >= -1 (0: no token, -1: the whole context), got -2");
}

// Draw frequencies of `n` draws of a sampler on one row, as fractions.
std::vector<double> frequencies(Sampler& s, const std::vector<float>& row, const std::vector<int32_t>& context, int n) {
  std::vector<int> count(row.size(), 0);
  for (int i = 0; i < n; ++i) ++count[s.next(row.data(), static_cast<int64_t>(row.size()), context)];
  std::vector<double> f;
  for (int c : count) f.push_back(static_cast<double>(c) / n);
  return f;
}

// llama.cpp's rule: each distinct id among the last repeat_last_n context tokens has a positive
// logit divided by the penalty, a negative one multiplied; greedy decoding sees it too.
TEST(Sampler, RepeatPenaltyDividesPositiveAndMultipliesNegativeLogits) {
  SamplingOptions o;
  o.repeat_penalty = 2.0;
  const std::vector<int32_t> ctx = {0, 2, 0};
  const float logits[4] = {2.0f, 1.5f, -1.0f, 0.5f};  // penalised: {1.0, 1.5, -2.0, 0.5}
  EXPECT_EQ(Sampler({}).next(logits, 4, ctx), 0);   // no penalty: the first logit
  EXPECT_EQ(Sampler(o).next(logits, 4, ctx), 1);    // 1.0 < 1.5
  EXPECT_EQ(Sampler(o).next(logits, 4), 0);         // no context, nothing penalised
  const float negative[2] = {-1.0f, -1.5f};         // penalised token 0: -2.0 < -1.5
  EXPECT_EQ(Sampler(o).next(negative, 2, std::vector<int32_t>{0}), 1);
  // once per distinct id: token 0 twice is 2.0 / 2 = 1.0 > 0.9 (not 0.5)
  const float once[2] = {2.0f, 0.9f};
  EXPECT_EQ(Sampler(o).next(once, 2, std::vector<int32_t>{0, 0}), 0);
  // only the last repeat_last_n tokens count; 0 penalises none, -1 the whole context
  const float two[2] = {2.0f, 1.5f};
  o.repeat_last_n = 1;
  EXPECT_EQ(Sampler(o).next(two, 2, std::vector<int32_t>{1, 0}), 1);  // token 0: 1.0 < 1.5
  EXPECT_EQ(Sampler(o).next(two, 2, std::vector<int32_t>{0, 1}), 0);  // token 1: 0.75
  o.repeat_last_n = 0;
  EXPECT_EQ(Sampler(o).next(two, 2, std::vector<int32_t>{1, 0}), 0);
  o.repeat_last_n = -1;
  const float three[3] = {2.0f, 1.5f, 0.0f};  // token 2's logit 0 stays 0
  std::vector<int32_t> long_ctx(100, 2);
  long_ctx[0] = 0;  // 99 tokens back: penalised with -1, not with the default 64
  EXPECT_EQ(Sampler(o).next(three, 3, long_ctx), 1);
  o.repeat_last_n = 64;
  EXPECT_EQ(Sampler(o).next(three, 3, long_ctx), 0);
  // when sampling: token 0 penalised from log 4 to log(4) / 2 = log 2: probabilities 2/5, 3/5
  o.temperature = 1.0, o.seed = 5;
  Sampler s(o);
  const std::vector<double> f = frequencies(s, {std::log(4.0f), std::log(3.0f)}, {0}, 4000);
  EXPECT_NEAR(f[0], 0.4, 0.035);
  testing::expect_error([] { Sampler({0.0, 1.0, 0, 0, 0.0, 1.5}).next(std::vector<float>{1.0f, 2.0f}.data(), 2, std::vector<int32_t>{2}); },
                        "the context holds token 2, outside the vocabulary of 2");
}

TEST(Sampler, TopKKeepsTheKLargestLogits) {
  const std::vector<float> four = {0.0f, std::log(2.0f), std::log(3.0f), std::log(4.0f)};
  Sampler s({1.0, 1.0, 7, 2});  // tokens 3 and 2: probabilities 4/7 and 3/7
  std::vector<double> f = frequencies(s, four, {}, 4000);
  EXPECT_EQ(f[0], 0.0);
  EXPECT_EQ(f[1], 0.0);
  EXPECT_NEAR(f[3], 4.0 / 7.0, 0.04);
  Sampler ties({1.0, 1.0, 7, 2});  // equal logits: the lower ids stay
  f = frequencies(ties, {1.0f, 1.0f, 1.0f, 0.0f}, {}, 4000);
  EXPECT_EQ(f[2], 0.0);
  EXPECT_EQ(f[3], 0.0);
  EXPECT_NEAR(f[0], 0.5, 0.04);
  Sampler one({3.0, 1.0, 7, 1});  // k = 1 is greedy, whatever the temperature
  f = frequencies(one, four, {}, 200);
  EXPECT_EQ(f[3], 1.0);
  Sampler all({1.0, 1.0, 7, 4});  // k >= vocab: every token
  f = frequencies(all, four, {}, 4000);
  EXPECT_NEAR(f[0], 0.1, 0.03);
}

TEST(Sampler, MinPKeepsTokensOfAtLeastMinPTimesTheBest) {
  const std::vector<float> four = {0.0f, std::log(2.0f), std::log(3.0f), std::log(4.0f)};
  SamplingOptions o{1.0, 1.0, 11};
  o.min_p = 0.45;  // p / p_max: 0.25, 0.5, 0.75, 1: tokens 1, 2, 3 (2/9, 3/9, 4/9)
  Sampler s(o);
  std::vector<double> f = frequencies(s, four, {}, 4000);
  EXPECT_EQ(f[0], 0.0);
  EXPECT_NEAR(f[1], 2.0 / 9.0, 0.035);
  EXPECT_NEAR(f[3], 4.0 / 9.0, 0.04);
  o.temperature = 0.5, o.min_p = 0.3;  // tempered ratios 0.0625, 0.25, 0.5625, 1: tokens 2, 3 (9/25, 16/25)
  Sampler t(o);
  f = frequencies(t, four, {}, 4000);
  EXPECT_EQ(f[0] + f[1], 0.0);
  EXPECT_NEAR(f[2], 9.0 / 25.0, 0.04);
  o.temperature = 1.0, o.min_p = 1.0;  // only the best
  Sampler u(o);
  EXPECT_EQ(frequencies(u, four, {}, 200)[3], 1.0);
  // after top-p: top_p 0.65 keeps {3, 2}, min_p 0.5 keeps {3, 2, 1}: the two together {3, 2}
  o.top_p = 0.65, o.min_p = 0.5;
  Sampler v(o);
  f = frequencies(v, four, {}, 4000);
  EXPECT_EQ(f[0] + f[1], 0.0);
  EXPECT_NEAR(f[3], 4.0 / 7.0, 0.04);
}

// Non-finite logits (a model with NaN weights) used to give token 0 or the first +inf without a
// word; now each kind is an error naming the step, on the greedy and the sampling path alike.
TEST(Sampler, NonFiniteLogitsAreErrorsNamingTheStep) {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  const std::vector<std::vector<float>> bad = {
      {nan, nan, nan, nan}, {0.5f, nan, 1.0f, 0.0f}, {0.5f, inf, 1.0f, 0.0f}, {inf, inf, inf, inf},
      {nan, inf, 1.0f, 0.0f}, {-inf, -inf, -inf, -inf}};
  const std::vector<const char*> said = {"4 NaN and 0 +inf of 4 (the first at token 0)", "1 NaN and 0 +inf of 4 (the first at token 1)",
                                         "0 NaN and 1 +inf of 4 (the first at token 1)", "0 NaN and 4 +inf of 4",
                                         "1 NaN and 1 +inf of 4 (the first at token 0)", "are all -inf: no token is possible"};
  const float good[4] = {0.0f, 1.0f, 2.0f, -inf};
  for (const SamplingOptions& o : {SamplingOptions{}, SamplingOptions{1.0, 1.0, 3}, SamplingOptions{0.8, 0.5, 3}}) {
    for (size_t i = 0; i < bad.size(); ++i) {
      Sampler s(o);
      EXPECT_EQ(s.next(good, 4) >= 0, true);  // step 0 is fine; -inf is a token that cannot come
      EXPECT_EQ(s.next(good, 4) == 3, false);
      testing::expect_error([&] { s.next(bad[i].data(), 4); }, "the logits at step 2 (new token 3)");
      Sampler t(o);
      testing::expect_error([&] { t.next(bad[i].data(), 4); }, said[i]);
    }
  }
}

// The nucleus of an independent reference (long double, a full sort): the smallest set of most
// likely tokens reaching top_p; returns the least probability in it.
double least_in_reference_nucleus(const std::vector<float>& logits, double temperature, double top_p) {
  const long double top = *std::max_element(logits.begin(), logits.end());
  std::vector<long double> p;
  for (float l : logits) p.push_back(std::exp((l - top) / temperature));
  std::sort(p.rbegin(), p.rend());
  if (top_p >= 1.0) return static_cast<double>(p.back());  // every token
  const long double total = std::accumulate(p.begin(), p.end(), 0.0L);
  long double mass = 0;
  for (long double x : p)
    if ((mass += x) >= top_p * total * (1 - 1e-12L)) return static_cast<double>(x);
  return static_cast<double>(p.back());
}

// The root of "a seed makes top-p return a token of probability 1e-15": the draw u * mass was
// walked down by subtraction, whose rounding can leave it above zero after the last candidate,
// and the fallback then took the last candidate -- with top_p near 1 the nucleus, grown by
// rounding, held every token, so that was the least likely token of the vocabulary. Now a
// draw picks the first cumulative sum above it, and a token whose probability adds nothing to
// the sum cannot be picked. Draws at the extremes and adversarial seeds, on adversarial logits.
TEST(Sampler, TopPNeverReturnsATokenOutsideTheNucleus) {
  std::vector<std::vector<float>> rows;
  std::vector<float> spike(6000, -30.0f);  // one token of probability ~1, the rest ~1e-13 each
  spike[777] = 0.0f;
  rows.push_back(spike);
  std::vector<float> cliff(4096, -100.0f);  // two likely tokens, a sea of ~1e-44
  cliff[5] = 1.0f, cliff[4000] = 1.0f;
  rows.push_back(cliff);
  std::vector<float> wide(6000);
  for (size_t i = 0; i < wide.size(); ++i) wide[i] = 8.0f * std::sin(static_cast<float>(i) * 0.37f);
  rows.push_back(wide);
  const double below_one = std::nextafter(1.0, 0.0);
  const std::vector<double> draws = {0.0, 1e-300, 0.5, 0.999999, 1.0 - 1e-12, below_one};
  const std::vector<uint64_t> seeds = {0, 1, 2, 0x8000000000000000ull, 0xFFFFFFFFFFFFFFFFull, 0xFFFFFFFFFFFFFFFEull,
                                       0x9E3779B97F4A7C15ull, 12345};
  int tried = 0;
  for (const std::vector<float>& row : rows)
    for (double top_p : {1.0, below_one, 0.999, 0.9, 0.5, 1e-9})
      for (double temperature : {1.0, 0.7, 3.0}) {
        const double least = least_in_reference_nucleus(row, temperature, top_p);
        const float best = *std::max_element(row.begin(), row.end());
        auto probability = [&](int32_t id) { return std::exp((static_cast<double>(row[id]) - best) / temperature); };
        const model::Nucleus n = model::nucleus(row.data(), static_cast<int64_t>(row.size()), temperature, top_p);
        for (double x : draws) {
          const int32_t id = model::pick(n, x);
          ASSERT_TRUE(id >= 0 && id < static_cast<int32_t>(row.size()));
          EXPECT_GE(probability(id), least * (1 - 1e-9)) << "draw " << x << " top_p " << top_p;
          EXPECT_GT(probability(id), 0.0);
          ++tried;
        }
        for (uint64_t seed : seeds) {
          Sampler s({temperature, top_p, seed});
          for (int step = 0; step < 3; ++step) {
            const int32_t id = s.next(row.data(), static_cast<int64_t>(row.size()));
            EXPECT_GE(probability(id), least * (1 - 1e-9)) << "seed " << seed << " step " << step << " top_p " << top_p;
            ++tried;
          }
        }
      }
  EXPECT_EQ(tried, 3 * 6 * 3 * (6 + 8 * 3));
  // the extremes of a draw: 0 takes the most likely token, the largest double below 1 the last
  // token that adds probability
  const float four[4] = {0.0f, std::log(2.0f), std::log(3.0f), std::log(4.0f)};
  const model::Nucleus n = model::nucleus(four, 4, 1.0, 0.65);
  EXPECT_EQ(n.ids, (std::vector<int32_t>{3, 2}));
  EXPECT_EQ(model::pick(n, 0.0), 3);
  EXPECT_EQ(model::pick(n, below_one), 2);
  const float zeros_last[3] = {0.0f, 0.0f, -std::numeric_limits<float>::infinity()};
  EXPECT_EQ(model::pick(model::nucleus(zeros_last, 3, 1.0, 1.0), below_one), 1);  // not the -inf token 2
}

// Seed 2^64 - 1 used to give a draw of exactly 0 at step 0 (seed * phi + step, then one splitmix64
// round that first adds phi), so with top_p = 1 it returned token 0 whatever its probability.
// No seed near the ends of the range or a power of two draws 0 (or anything below 1e-12) in the
// first thousand steps.
TEST(Sampler, NoSimpleSeedDrawsZero) {
  std::vector<uint64_t> seeds = {0, 1, 2, 3, 0xFFFFFFFFFFFFFFFFull, 0xFFFFFFFFFFFFFFFEull, 0x9E3779B97F4A7C15ull,
                                 0x61C8864680B583EBull /* -phi */, 0x61C8864680B583EAull};
  for (int b = 0; b < 64; ++b) seeds.push_back(uint64_t{1} << b), seeds.push_back(~(uint64_t{1} << b));
  double least = 1.0;
  for (uint64_t seed : seeds)
    for (uint64_t step = 0; step < 1000; ++step) least = std::min(least, model::draw(seed, step));
  EXPECT_GT(least, 1e-12);  // 137 000 draws: the smallest is ~1e-5 for uniform draws
  // the regression itself: token 0 of probability ~1e-15, top_p 1, seed 2^64 - 1
  const float row[2] = {-34.5f, 0.0f};
  for (uint64_t seed : {uint64_t{0xFFFFFFFFFFFFFFFFull}, uint64_t{0}, uint64_t{1}}) {
    Sampler s({1.0, 1.0, seed});
    for (int step = 0; step < 100; ++step) EXPECT_EQ(s.next(row, 2), 1) << seed << " " << step;
  }
}

TEST(Sampler, GenerationLengthIsCheckedUpFront) {
  check_generation_length("max_tokens", 5, 8187, 8192);
  check_generation_length("max_tokens", 5, 0, 8192);
  testing::expect_error([] { check_generation_length("max_tokens", 5, 1000000000000, 8192); },
                        "max_tokens: 1000000000000 new tokens after a prompt of 5 exceed the context of 8192 tokens (at most 8187)");
  testing::expect_error([] { check_generation_length("--max-tokens", 9000, 1, 8192); }, "(at most 0)");
  testing::expect_error([] { check_generation_length("max_tokens", 5, -1, 8192); }, "max_tokens: must be >= 0, got -1");
}

}  // namespace
}  // namespace attn
