// The KV pool's blocks: holders, the free lists, the prefix cache's keys (collisions checked by
// tokens) and its least-recently-used eviction.
#include <gtest/gtest.h>

#include <vector>

#include "serve/kv_blocks.hpp"
#include "support/expect_error.hpp"

namespace attn::serve {
namespace {

std::vector<int32_t> run(int32_t from, int64_t n) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) t[static_cast<size_t>(i)] = from + static_cast<int32_t>(i);
  return t;
}

TEST(KvBlocks, HandsOutEveryBlockButTheNullOneOnce) {
  KvBlocks b(5, 4);
  EXPECT_EQ(b.total(), 4);
  std::vector<int32_t> got;
  for (int i = 0; i < 4; ++i) got.push_back(b.take());
  EXPECT_EQ(got, (std::vector<int32_t>{1, 2, 3, 4}));
  EXPECT_EQ(b.take(), -1);
  EXPECT_EQ(b.in_use(), 4);
  b.release(3);
  EXPECT_EQ(b.available(), 1);
  EXPECT_EQ(b.take(), 3);
  testing::expect_error([&] { KvBlocks(1, 4); }, "at least 2");
}

TEST(KvBlocks, APublishedPrefixIsMatchedAndSharedAndCachedWhenReleased) {
  KvBlocks b(8, 4);
  const std::vector<int32_t> prompt = run(10, 11);  // two full blocks and 3 tokens
  const int32_t a = b.take(), c = b.take();
  const uint64_t ka = b.publish(a, 0, std::span(prompt).subspan(0, 4));
  const uint64_t kc = b.publish(c, ka, std::span(prompt).subspan(4, 4));
  EXPECT_NE(ka, kc);
  const KvBlocks::Match both = b.match(prompt, 10);
  EXPECT_EQ(both.ids, (std::vector<int32_t>{a, c}));
  EXPECT_EQ(both.keys, (std::vector<uint64_t>{ka, kc}));
  EXPECT_EQ(b.holders(a), 2);
  // a prompt that differs in the second block shares the first only
  std::vector<int32_t> other = prompt;
  other[5] = 99;
  EXPECT_EQ(b.match(other, 10).ids, (std::vector<int32_t>{a}));
  EXPECT_EQ(b.match(prompt, 1).ids, (std::vector<int32_t>{a}));  // max_blocks
  for (int i = 0; i < 4; ++i) b.release(a);  // the first take and three matches
  b.release(c), b.release(c);
  EXPECT_EQ(b.in_use(), 0);
  EXPECT_EQ(b.cached(), 2);
  // cached blocks are found again and held out of the free list
  EXPECT_EQ(b.match(prompt, 10).ids.size(), 2u);
  EXPECT_EQ(b.cached(), 0);
  EXPECT_EQ(b.in_use(), 2);
}

TEST(KvBlocks, UnkeyedBlocksGoFirstThenTheLeastRecentlyReleasedCachedOne) {
  KvBlocks b(4, 2);
  const std::vector<int32_t> t1 = run(0, 2), t2 = run(50, 2);
  const int32_t x = b.take(), y = b.take(), z = b.take();
  b.publish(x, 0, t1), b.publish(y, 0, t2);
  b.release(x), b.release(y), b.release(z);  // x released before y; z has no key
  EXPECT_EQ(b.take(), z);
  EXPECT_EQ(b.take(), x);  // evicted: t1 is no longer cached
  EXPECT_TRUE(b.match(t1, 1).ids.empty());
  EXPECT_EQ(b.match(t2, 1).ids, (std::vector<int32_t>{y}));
}

TEST(KvBlocks, AnEqualBlockPublishedTwiceKeepsTheFirstAndTheCopyIsFreedNotCached) {
  KvBlocks b(4, 2);
  const std::vector<int32_t> t = run(7, 2);
  const int32_t x = b.take(), y = b.take();
  const uint64_t first = b.publish(x, 0, t);
  EXPECT_EQ(b.publish(y, 0, t), first);
  b.release(y);
  EXPECT_EQ(b.cached(), 0);
  EXPECT_EQ(b.match(t, 1).ids, (std::vector<int32_t>{x}));
}

}  // namespace
}  // namespace attn::serve
