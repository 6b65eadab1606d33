#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <functional>
#include <thread>
#include <vector>

#include "base/parallel.hpp"
#include "base/thread_team.hpp"

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

namespace attn {
namespace {

// The thread team: a region of more items than one claim word counts hands them out in runs,
// each item still exactly once.
TEST(ThreadTeam, MoreItemsThanAClaimWordCounts) {
  const int64_t n = (int64_t{1} << 21) + 7;
  std::vector<std::atomic<uint8_t>> hits(static_cast<size_t>(n));
  parallel_for(n, 2, [&](int64_t i, int) { hits[static_cast<size_t>(i)]++; });
  for (auto& h : hits) ASSERT_EQ(h.load(), 1);
}

// A thread index is a scratch slot: never two items at once in one slot, never one past `threads`.
TEST(ThreadTeam, NoTwoItemsShareAThreadIndexAtOnce) {
  for (int threads : {2, 3, 5}) {
    std::vector<std::atomic<int>> busy(static_cast<size_t>(threads));
    std::atomic<int> overlaps{0}, outside{0};
    for (int round = 0; round < 200; ++round)
      parallel_for(64, threads, [&](int64_t, int tid) {
        if (tid >= threads) return void(outside++);
        if (busy[static_cast<size_t>(tid)]++ != 0) overlaps++;
        if (!in_team_region()) outside++;
        busy[static_cast<size_t>(tid)]--;
      });
    EXPECT_EQ(overlaps.load(), 0) << threads << " threads";
    EXPECT_EQ(outside.load(), 0) << threads << " threads";
  }
  EXPECT_FALSE(in_team_region());
}

// A loop inside an item runs on that item's thread, whole, as index 0.
TEST(ThreadTeam, NestedLoopsRunOnTheCallingThread) {
  std::vector<std::atomic<int>> hits(16 * 16);
  std::atomic<int> nested_index_not_zero{0};
  parallel_for(16, 2, [&](int64_t i, int) {
    const std::thread::id me = std::this_thread::get_id();
    parallel_for(16, 2, [&](int64_t j, int tid) {
      if (tid != 0 || std::this_thread::get_id() != me) nested_index_not_zero++;
      hits[static_cast<size_t>(i * 16 + j)]++;
    });
  });
  EXPECT_EQ(nested_index_not_zero.load(), 0);
  for (auto& h : hits) ASSERT_EQ(h.load(), 1);
}

// Two threads of the caller's program running loops at once: each loop does all its items (the
// one that finds the team busy runs alone).
TEST(ThreadTeam, ConcurrentCallersEachDoEveryItem) {
  constexpr int kRounds = 300, kItems = 37;
  std::vector<std::atomic<int>> a(kItems), b(kItems);
  auto loops = [](std::vector<std::atomic<int>>& hits) {
    for (int r = 0; r < kRounds; ++r) parallel_for(kItems, 2, [&](int64_t i, int) { hits[static_cast<size_t>(i)]++; });
  };
  std::thread other(loops, std::ref(b));
  loops(a);
  other.join();
  for (int i = 0; i < kItems; ++i) {
    ASSERT_EQ(a[static_cast<size_t>(i)].load(), kRounds);
    ASSERT_EQ(b[static_cast<size_t>(i)].load(), kRounds);
  }
}

}  // namespace
}  // namespace attn
