// Row measures on rows whose values are known by hand.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "attn/concentration.hpp"
#include "support/expect_error.hpp"

namespace attn::concentration {
namespace {

TEST(RowMeasures, UniformAndOneHotRows) {
  const int64_t n = 50;
  std::vector<double> uniform(n, 0.02), one_hot(n, 0.0);
  one_hot[17] = 3.0;
  EXPECT_NEAR(sparsity(uniform.data(), n), 1.0, 1e-15);
  EXPECT_NEAR(entropy(uniform.data(), n), std::log(50.0), 1e-13);
  EXPECT_NEAR(max_weight(uniform.data(), n), 1.0 / 50, 1e-15);
  EXPECT_NEAR(topk_mass(uniform.data(), n, 8), 8.0 / 50, 1e-14);
  EXPECT_NEAR(sparsity(one_hot.data(), n), 1.0 / std::sqrt(50.0), 1e-15);
  EXPECT_EQ(entropy(one_hot.data(), n), 0.0);
  EXPECT_EQ(max_weight(one_hot.data(), n), 1.0);
  EXPECT_EQ(topk_mass(one_hot.data(), n, 1), 1.0);
}

TEST(RowMeasures, SignedAndUnnormalisedRows) {
  // S uses magnitudes: (1, -1, 2, -2): l1 = 6, l2 = sqrt(10), n = 4 -> 6 / sqrt(10) / 2
  const std::vector<double> a = {1, -1, 2, -2};
  EXPECT_NEAR(sparsity(a.data(), 4), 6 / std::sqrt(10.0) / 2, 1e-15);
  EXPECT_NEAR(max_weight(a.data(), 4), 2.0 / 6, 1e-15);
  EXPECT_NEAR(topk_mass(a.data(), 4, 2), 4.0 / 6, 1e-15);
  EXPECT_EQ(topk_mass(a.data(), 4, 9), 1.0);
  // scale does not matter; entropy normalises: (1, 3) -> p = (1/4, 3/4)
  const std::vector<double> b = {10, 30};
  EXPECT_NEAR(entropy(b.data(), 2), -(0.25 * std::log(0.25) + 0.75 * std::log(0.75)), 1e-15);
  const std::vector<double> c = {1, 3};
  EXPECT_EQ(sparsity(b.data(), 2), sparsity(c.data(), 2));
}

TEST(RowMeasures, UndefinedRowsAndBadArguments) {
  const std::vector<double> zero(5, 0.0);
  EXPECT_TRUE(std::isnan(sparsity(zero.data(), 5)));
  EXPECT_TRUE(std::isnan(entropy(zero.data(), 5)));
  EXPECT_TRUE(std::isnan(max_weight(zero.data(), 5)));
  EXPECT_TRUE(std::isnan(topk_mass(zero.data(), 5, 2)));
  const std::vector<double> neg = {0.5, -0.1, 0.6};
  testing::expect_error([&] { entropy(neg.data(), 3); }, "weights must be non-negative");
  testing::expect_error([&] { topk_mass(neg.data(), 3, 0); }, "k must be >= 1, got 0");
}

}  // namespace
}  // namespace attn::concentration
