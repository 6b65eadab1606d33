// Greedy and nucleus sampling: choices, reproducibility by seed, frequencies, bad options.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "attn/sampler.hpp"
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
}

}  // namespace
}  // namespace attn
