#include <gtest/gtest.h>

#include <atomic>
#include <vector>

#include "base/parallel.hpp"

namespace attn {
namespace {

TEST(Parallel, EveryItemExactlyOnce) {
  for (int threads : {1, 2, 3, 8}) {
    std::vector<std::atomic<int>> hits(1000);
    parallel_for(1000, threads, [&](int64_t i, int tid) {
      EXPECT_LT(tid, threads);
      hits[static_cast<size_t>(i)]++;
    });
    for (auto& h : hits) ASSERT_EQ(h.load(), 1);
  }
  parallel_for(0, 2, [](int64_t, int) { FAIL() << "no items expected"; });
}

}  // namespace
}  // namespace attn
