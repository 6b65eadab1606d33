// Dual Chunk Attention: its remapped positions mean what the paper says, and with one chunk it is
// causal RoPE attention. The case list checks the parts form against the float64 reference
// on every ISA.
#include <gtest/gtest.h>

#include "attn/rope.hpp"
#include "dca/dca.hpp"
#include "support/expect_error.hpp"
#include "support/random_inputs.hpp"

namespace attn {
namespace {

using dca::dca_part;
using dca::dca_query_position;

// The relative distance DCA gives the pair (p, j), j <= p: query index minus key index j mod s.
int64_t distance(const Dca& m, int64_t p, int64_t j) {
  return dca_query_position(m, dca_part(m, p, j), p) - j % m.chunk;
}

TEST(Dca, DistancesFollowThePaper) {
  Dca m;
  m.chunk = 12, m.local = 5;
  for (int64_t p = 0; p < 80; ++p)
    for (int64_t j = 0; j <= p; ++j) {
      const int64_t d = distance(m, p, j);
      if (p / 12 == j / 12) EXPECT_EQ(d, p - j) << p << " " << j;  // intra: the true distance
      if (p / 12 == j / 12 + 1 && p % 12 < 5) EXPECT_EQ(d, p - j) << p << " " << j;  // successive, local
      if (p / 12 == j / 12 + 1 && p % 12 >= 5) EXPECT_EQ(d, 12 + 5 - 1 - j % 12) << p << " " << j;
      if (p / 12 >= j / 12 + 2) EXPECT_EQ(d, 12 + 5 - 1 - j % 12) << p << " " << j;  // inter
      // no distance reaches the pretraining window s + local, and none is negative
      EXPECT_GE(d, 0) << p << " " << j;
      EXPECT_LT(d, 12 + 5) << p << " " << j;
    }
}

// With chunk >= every position, there is one chunk: causal attention on RoPE-rotated q and k.
TEST(Dca, OneChunkIsCausalRopeAttention) {
  std::mt19937 rng(21);
  for (int64_t N : {int64_t{37}, int64_t{1}}) {
    const int64_t B = 2, H = 4, Hkv = 2, M = 37, D = 16;
    auto q = testing::random_tensor(rng, DType::f32, B, H, N, D, Layout::bhnd, 2.0f);
    auto k = testing::random_tensor(rng, DType::f32, B, Hkv, M, D, Layout::bhnd, 2.0f);
    auto v = testing::random_tensor(rng, DType::f32, B, Hkv, M, D);
    AttendOptions o;
    o.return_lse = true;
    const auto dca = attend(q.view, k.view, v.view, parse_mechanism("dca:chunk=64,local=8,theta=500"), o);
    Rope r;
    r.theta = 500, r.offset = M - N;  // queries sit bottom-right
    apply_rope(q.view, r);
    r.offset = 0;
    apply_rope(k.view, r);
    const auto want = attend(q.view, k.view, v.view, parse_mechanism("softmax:causal"), o);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t i = 0; i < N; ++i) {
          EXPECT_NEAR(dca.lse.at(b, h, i, 0), want.lse.at(b, h, i, 0), 2e-5);
          for (int64_t c = 0; c < D; ++c) EXPECT_NEAR(dca.out.at(b, h, i, c), want.out.at(b, h, i, c), 2e-5);
        }
  }
}

// chunk 16, local 8: queries 0..23 see every key at its true distance (their own chunk, or the
// previous one within the local window), so they match one big chunk; later queries do not.
TEST(Dca, OnlyQueriesBeyondTheLocalWindowAreRemapped) {
  std::mt19937 rng(22);
  const int64_t M = 40, D = 8;
  auto q = testing::random_tensor(rng, DType::f32, 1, 1, M, D, Layout::bhnd, 2.0f);
  auto k = testing::random_tensor(rng, DType::f32, 1, 1, M, D, Layout::bhnd, 2.0f);
  auto v = testing::random_tensor(rng, DType::f32, 1, 1, M, D);
  const auto one = attend(q.view, k.view, v.view, parse_mechanism("dca:chunk=40,local=8"));
  const auto two = attend(q.view, k.view, v.view, parse_mechanism("dca:chunk=16,local=8"));
  double near = 0, later = 0;
  for (int64_t i = 0; i < M; ++i)
    for (int64_t c = 0; c < D; ++c) {
      const double d = std::abs(one.out.at(0, 0, i, c) - two.out.at(0, 0, i, c));
      double& worst = i < 24 ? near : later;
      worst = std::max(worst, d);
    }
  EXPECT_LE(near, 1e-5);
  EXPECT_GT(later, 1e-3);
}

TEST(Dca, BadInputIsNamed) {
  std::mt19937 rng(23);
  auto q = testing::random_tensor(rng, DType::f32, 1, 2, 5, 8);
  auto expect = [&](const char* mech, AttendOptions o, const char* fragment) {
    testing::expect_error([&] { attend(q.view, q.view, q.view, parse_mechanism(mech), o); }, fragment);
  };
  expect("dca:chunk=0", {}, "dca chunk must be >= 1, got 0");
  expect("dca:chunk=4,local=0", {}, "dca local must be in [1, chunk = 4], got 0");
  AttendOptions probs;
  probs.return_probs = true;
  probs.form = "parts";
  expect("dca:chunk=4,local=2", probs, "returns no probabilities (the reference form does)");
}

}  // namespace
}  // namespace attn
