#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <thread>
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

namespace attn {
namespace {

// Hardening, class 1: thread counts are decided in one place and never exceed what can be honoured.
TEST(Parallel, ResolveThreadsCapsAtItemsCpusAndTheLimit) {
  EXPECT_EQ(resolve_threads(100000, 1 << 20), kMaxThreads);
  EXPECT_EQ(resolve_threads(8, 3), 3);   // no thread (or scratch) without an item
  EXPECT_EQ(resolve_threads(5, 0), 1);
  EXPECT_GE(resolve_threads(0, 1 << 20), 1);
  EXPECT_LE(resolve_threads(0, 1 << 20), std::max(1, static_cast<int>(std::thread::hardware_concurrency())));
}

}  // namespace
}  // namespace attn
