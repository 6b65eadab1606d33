// The pattern's three views (the definition visible(), the kernels' column() and
// column_interval(), the block mask's classify() and candidates()) agree on every pattern the
// mechanisms produce, over shapes with N < M, N = M, N > M and sizes that are not multiples of
// the tiles; and each pattern means what its paper says. The case list checks the kernels that
// use them against the dense-mask reference.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "support/expect_error.hpp"
#include "attn/attn.hpp"
#include "attn/error.hpp"
#include "harness/inputs.hpp"
#include "attn/mechanism.hpp"
#include "mask/block_mask.hpp"
#include "mask/patterns.hpp"

namespace attn::mask {
namespace {

// The pattern of a pattern mechanism (softmax, Longformer, BigBird); the others have none here.
Pattern compile(const std::string& text, int64_t N, int64_t M) {
  return std::visit(
      [&](const auto& m) -> Pattern {
        if constexpr (requires { pattern_of(m, N, M); })
          return pattern_of(m, N, M);
        else
          throw std::logic_error("no pattern");
      },
      parse_mechanism(text));
}

const std::vector<std::string> kTexts = {
    "softmax",
    "softmax:causal",
    "softmax:window=5:3",
    "softmax:causal,window=7:0",
    "softmax:causal,window=7:0,sinks=3",
    "softmax:sinks=2,window=4:4",
    "softmax:causal,dilation=4",
    "softmax:causal,window=20:0,dilation=3",
    "softmax:dilation=5",
    "softmax:causal,strided=6",
    "softmax:strided=9",
    "softmax:chunk=11",
    "softmax:causal,chunk=8",
    "softmax:chunk=10,window=3:3,sinks=1",
    "longformer:window=4:4,global=0;17;33",
    "longformer:window=6:2,dilation=2,global=5",
    "longformer:window=3:0,global=1;40,causal",
    "bigbird:block=8,window=3,global=1,random=2,seed=7",
    "bigbird:block=5,window=1,global=0,random=3,seed=1,causal",
    "bigbird:block=16,window=5,global=2,random=1",
};

// The mechanisms' patterns, plus the chunk lags no text form reaches (Dual Chunk Attention's
// successive and inter-chunk parts, and others).
std::vector<std::pair<std::string, Pattern>> all_patterns(int64_t N, int64_t M) {
  std::vector<std::pair<std::string, Pattern>> out;
  for (const auto& text : kTexts) out.emplace_back(text, compile(text, N, M));
  const struct {
    bool causal;
    int64_t chunk, lag_min, lag_max, left;
  } lags[] = {{true, 8, 1, 1, -1}, {true, 8, 2, -1, -1}, {false, 7, 0, 2, -1}, {true, 11, 1, -1, 30},
              {false, 64, 1, 1, -1}, {true, 5, 3, 4, -1}};
  for (const auto& l : lags) {
    Pattern p;
    p.causal = l.causal;
    p.band->chunk = l.chunk, p.band->lag_min = l.lag_min, p.band->lag_max = l.lag_max, p.band->left = l.left;
    out.emplace_back("chunk " + std::to_string(l.chunk) + " lag " + std::to_string(l.lag_min) + ":" +
                         std::to_string(l.lag_max) + (l.causal ? " causal" : "") + " left " + std::to_string(l.left),
                     p);
  }
  return out;
}

struct Shape {
  int64_t N, M;
};
const std::vector<Shape> kShapes = {{70, 70}, {1, 90}, {13, 77}, {90, 41}, {129, 129}};

TEST(Pattern, ColumnsAreTheDefinition) {
  for (const auto [N, M] : kShapes)
    for (const auto& [text, p] : all_patterns(N, M)) {
      const int64_t offset = M - N;
      std::vector<uint8_t> vis(64);
      for (int64_t i0 = 0; i0 < N; i0 += 64) {
        const int64_t n = std::min<int64_t>(64, N - i0), p0 = i0 + offset;
        for (int64_t j = 0; j < M; ++j) {
          p.column(j, p0, n, vis.data());
          int64_t lo, hi;
          const bool interval = p.column_interval(j, p0, n, lo, hi);
          for (int64_t i = 0; i < n; ++i) {
            ASSERT_EQ(vis[i] != 0, p.visible(p0 + i, j)) << text << " N=" << N << " M=" << M << " i=" << i0 + i << " j=" << j;
            if (interval) ASSERT_EQ(vis[i] != 0, i >= lo && i < hi) << text << " interval, i=" << i0 + i << " j=" << j;
          }
        }
      }
    }
}

TEST(Pattern, ClassifyNeverOverstates) {
  std::mt19937 rng(11);
  for (const auto [N, M] : kShapes)
    for (const auto& [text, p] : all_patterns(N, M)) {
      const int64_t offset = M - N;
      for (int trial = 0; trial < 300; ++trial) {
        const int64_t i0 = static_cast<int64_t>(rng() % N), i1 = std::min<int64_t>(N - 1, i0 + rng() % 40);
        const int64_t j0 = static_cast<int64_t>(rng() % M), j1 = std::min<int64_t>(M - 1, j0 + rng() % 40);
        int64_t seen = 0;
        for (int64_t i = i0; i <= i1; ++i)
          for (int64_t j = j0; j <= j1; ++j) seen += p.visible(i + offset, j);
        const Coverage c = p.classify(i0 + offset, i1 + offset, j0, j1);
        if (c == Coverage::hidden) ASSERT_EQ(seen, 0) << text << " [" << i0 << "," << i1 << "]x[" << j0 << "," << j1 << "]";
        if (c == Coverage::full)
          ASSERT_EQ(seen, (i1 - i0 + 1) * (j1 - j0 + 1)) << text << " [" << i0 << "," << i1 << "]x[" << j0 << "," << j1 << "]";
      }
    }
}

// Every visible pair lies in a run of its query tile; full runs hold only visible pairs; the
// pair count matches the definition.
TEST(Pattern, BlockMaskCoversExactlyTheVisiblePairs) {
  for (const auto [N, M] : kShapes)
    for (const auto& [text, p] : all_patterns(N, M))
      for (int64_t tile : {int64_t{1}, int64_t{16}, int64_t{64}}) {
        const int64_t offset = M - N;
        const BlockMask mask(p, N, M, offset, tile, tile);
        double count = 0;
        for (int64_t i = 0; i < N; ++i) {
          const auto runs = mask.runs(i / tile);
          for (int64_t j = 0; j < M; ++j) {
            const bool v = p.visible(i + offset, j);
            count += v;
            const mask::Run* in = nullptr;
            for (const mask::Run& r : runs)
              if (j >= r.begin && j < r.end) in = &r;
            if (v) ASSERT_NE(in, nullptr) << text << " tile " << tile << ": (" << i << ", " << j << ") in no run";
            if (in && in->full) ASSERT_TRUE(v) << text << " tile " << tile << ": (" << i << ", " << j << ") in a full run";
          }
        }
        EXPECT_EQ(visible_pairs(p, N, M, offset, M), count) << text << " N=" << N << " M=" << M;
      }
}

// candidates_into (no allocation: row_scale calls it inside parallel regions) gives candidates()
// into the caller's array, and -1 when the array is too small.
TEST(Pattern, CandidatesIntoIsCandidates) {
  for (const auto [N, M] : kShapes)
    for (const auto& [text, p] : all_patterns(N, M))
      for (int64_t pos = M - N; pos < M; pos += 5) {
        const auto want = p.candidates(pos, pos + 6, M);
        std::pair<int64_t, int64_t> got[256];
        ASSERT_EQ(p.candidates_into(pos, pos + 6, M, got, 256), static_cast<int64_t>(want.size())) << text;
        for (size_t k = 0; k < want.size(); ++k) EXPECT_EQ(got[k], want[k]) << text << " position " << pos;
        if (!want.empty()) EXPECT_EQ(p.candidates_into(pos, pos + 6, M, got, 0), -1) << text;
      }
}

// What the patterns mean, position by position (N = M, so p = i).
TEST(Pattern, Meanings) {
  const int64_t n = 100;
  const Pattern sinks = compile("softmax:causal,window=7:0,sinks=3", n, n);
  const Pattern dilated = compile("softmax:causal,dilation=4", n, n);
  const Pattern strided = compile("softmax:causal,strided=6", n, n);
  const Pattern chunked = compile("softmax:chunk=10", n, n);
  const Pattern longformer = compile("longformer:window=2:2,global=0;17", n, n);
  Pattern previous_chunk = chunked, older_chunks = chunked;
  previous_chunk.band->lag_min = previous_chunk.band->lag_max = 1;
  older_chunks.band->lag_min = 2, older_chunks.band->lag_max = -1;
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < n; ++j) {
      EXPECT_EQ(sinks.visible(i, j), j <= i && (i - j <= 7 || j < 3)) << i << " " << j;
      EXPECT_EQ(dilated.visible(i, j), j <= i && (i - j) % 4 == 0) << i << " " << j;
      EXPECT_EQ(strided.visible(i, j), j <= i && (i - j <= 6 || (i - j) % 6 == 0)) << i << " " << j;
      EXPECT_EQ(chunked.visible(i, j), i / 10 == j / 10) << i << " " << j;
      EXPECT_EQ(previous_chunk.visible(i, j), i / 10 == j / 10 + 1) << i << " " << j;
      EXPECT_EQ(older_chunks.visible(i, j), i / 10 >= j / 10 + 2) << i << " " << j;
      EXPECT_EQ(longformer.visible(i, j), std::abs(i - j) <= 2 || i == 0 || i == 17 || j == 0 || j == 17) << i << " " << j;
    }
}

TEST(Pattern, BigBirdBlocks) {
  const int64_t n = 160, block = 8, blocks = n / block;
  const Pattern a = compile("bigbird:block=8,window=3,global=2,random=3,seed=7", n, n);
  const Pattern again = compile("bigbird:block=8,window=3,global=2,random=3,seed=7", n, n);
  const Pattern other = compile("bigbird:block=8,window=3,global=2,random=3,seed=8", n, n);
  ASSERT_EQ(a.blocks->random_of, again.blocks->random_of);  // reproducible for a seed
  EXPECT_NE(a.blocks->random_of, other.blocks->random_of);
  for (int64_t qb = 0; qb < blocks; ++qb) {
    const auto& r = a.blocks->random_of[static_cast<size_t>(qb)];
    if (qb < 2) {
      EXPECT_TRUE(r.empty());  // global rows see everything already
      continue;
    }
    ASSERT_EQ(r.size(), 3u) << qb;
    for (int64_t c : r) {
      EXPECT_GT(std::abs(c - qb), 1) << "random block inside the window";
      EXPECT_GE(c, 2) << "random block among the globals";
    }
    int64_t visible_blocks = 0;
    for (int64_t kb = 0; kb < blocks; ++kb) {
      const bool v = a.visible(qb * block + 3, kb * block + 5);
      // the whole block pair is visible or hidden together
      for (int64_t di = 0; di < block; ++di) ASSERT_EQ(a.visible(qb * block + di, kb * block), v);
      visible_blocks += v;
    }
    const int64_t window = std::min(qb + 1, blocks - 1) - std::max<int64_t>(qb - 1, 2) + 1;  // outside the globals
    EXPECT_EQ(visible_blocks, 2 + window + 3) << qb;  // globals + window + random
  }
  // causal random blocks are drawn from the past
  const Pattern c = compile("bigbird:block=8,window=1,global=0,random=2,seed=3,causal", n, n);
  for (int64_t qb = 0; qb < blocks; ++qb)
    for (int64_t kb : c.blocks->random_of[static_cast<size_t>(qb)]) EXPECT_LT(kb, qb);
}

TEST(Pattern, BadOptionsNameThemselves) {
  auto expect = [](const std::string& text, const std::string& fragment) {
    attn::testing::expect_error([&] { compile(text, 16, 16); }, fragment);
  };
  expect("softmax:dilation=0", "dilation must be >= 1");
  expect("softmax:sinks=-1", "sinks must be >= 0");
  expect("softmax:strided=4,dilation=2", "strided and dilation cannot be combined");
  expect("softmax:chunk=-5", "chunk must be >= 0");
  expect("longformer:window=-2:3", "longformer window must be LEFT:RIGHT");
  expect("longformer:global=3;-1", "longformer global position must be >= 0");
  expect("bigbird:window=2", "bigbird window must be an odd number");
  expect("bigbird:block=0", "bigbird block must be >= 1");
  expect("bigbird:block=1,random=2000000", "more than 2^24");
}

TEST(Pattern, IntegersAtTheTopOfTheRangeActAsThePastEveryDistance) {
  // dilation, strided, chunk (and Longformer's dilation) of 2^63 - 1 are the same pattern as N + M + 1.
  const int64_t N = 37, M = 50, far = N + M + 1;
  const std::string top = std::to_string(INT64_MAX);
  for (const auto& [huge, small] : std::vector<std::pair<std::string, std::string>>{
           {"softmax:causal,dilation=" + top, "softmax:causal,dilation=" + std::to_string(far)},
           {"softmax:strided=" + top, "softmax:strided=" + std::to_string(far)},
           {"softmax:chunk=" + top + ",sinks=" + top, "softmax:chunk=" + std::to_string(far) + ",sinks=" + std::to_string(M)},
           {"longformer:window=4:4,dilation=" + top, "longformer:window=4:4,dilation=" + std::to_string(far)}}) {
    SCOPED_TRACE(huge);
    const Tensor a = mask_of(parse_mechanism(huge), N, M), b = mask_of(parse_mechanism(small), N, M);
    EXPECT_EQ(std::memcmp(a.view().data, b.view().data, static_cast<size_t>(N * M)), 0);
    std::mt19937 rng(3);
    const harness::Buffer q = harness::random_tensor(rng, DType::f32, 1, 2, N, 8), k = harness::random_tensor(rng, DType::f32, 1, 2, M, 8),
                          v = harness::random_tensor(rng, DType::f32, 1, 2, M, 8);
    const Tensor oa = attend(q.view, k.view, v.view, parse_mechanism(huge)).out;
    const Tensor ob = attend(q.view, k.view, v.view, parse_mechanism(small)).out;
    EXPECT_EQ(std::memcmp(oa.view().data, ob.view().data, static_cast<size_t>(2 * N * 8) * sizeof(float)), 0);
    EXPECT_EQ(info(parse_mechanism(huge), 1000).cache_rows, 1000);  // bounds nothing a cache holds
  }
}

}  // namespace
}  // namespace attn::mask
