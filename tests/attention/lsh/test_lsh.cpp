// Reformer's LSH attention: the buckets are argmax([xR, -xR]); one chunk holding everything is
// exact attention; on clustered inputs it approaches dense attention. The case list checks the
// chunked form against the dense-mask reference on every ISA.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "attn/pattern.hpp"
#include "support/expect_error.hpp"
#include "support/random_inputs.hpp"

namespace attn {
namespace {

TEST(Lsh, BucketsAreTheArgmaxOfTheRotations) {
  std::mt19937 rng(31);
  const int64_t B = 2, H = 2, N = 50, D = 8, rounds = 3, half = 4;
  auto q = testing::random_tensor(rng, DType::f32, B, H, N, D);
  auto k = testing::random_tensor(rng, DType::f32, B, 1, N, D);
  std::vector<float> rot(static_cast<size_t>(rounds * D * half));
  std::normal_distribution<float> g;
  for (float& x : rot) x = g(rng);
  AttendOptions o;
  o.params["rotations"] = make_array_view(rot.data(), DType::f32, {rounds, D, half});
  Lsh m;
  m.buckets = 2 * half, m.rounds = rounds;
  const LshBuckets got = lsh_buckets(q.view, k.view, k.view, m, o);
  ASSERT_EQ(got.key_heads, 1);
  auto bucket = [&](const TensorView& x, int64_t b, int64_t h, int64_t t, int64_t r) {
    int best = 0;
    double top = -1e300;
    for (int s = 0; s < 2 * half; ++s) {
      double dot = 0;
      for (int64_t c = 0; c < D; ++c) dot += x.at(b, h, t, c) * rot[static_cast<size_t>((r * D + c) * half + s % half)];
      if (s >= half) dot = -dot;
      if (dot > top) top = dot, best = s;
    }
    return best;
  };
  for (int64_t b = 0; b < B; ++b)
    for (int64_t r = 0; r < rounds; ++r)
      for (int64_t t = 0; t < N; ++t) {
        for (int64_t h = 0; h < H; ++h)
          EXPECT_EQ(got.query[static_cast<size_t>(((b * H + h) * rounds + r) * N + t)], bucket(q.view, b, h, t, r));
        EXPECT_EQ(got.key[static_cast<size_t>((b * rounds + r) * N + t)], bucket(k.view, b, 0, t, r));
      }
}

// chunk >= N: every key is in the one chunk, so LSH is exact attention (causal or not); with
// shared_qk, a token skips itself unless it sees nothing else (the first token, causally).
TEST(Lsh, OneChunkIsExactAttention) {
  std::mt19937 rng(32);
  const int64_t B = 1, H = 2, N = 40, D = 16;
  auto q = testing::random_tensor(rng, DType::f32, B, H, N, D);
  auto k = testing::random_tensor(rng, DType::f32, B, H, N, D);
  auto v = testing::random_tensor(rng, DType::f32, B, H, N, D);
  AttendOptions o;
  o.return_lse = true;
  for (const char* causal : {"", ",causal"}) {
    const auto lsh = attend(q.view, k.view, v.view, parse_mechanism(std::string("lsh:chunk=64,rounds=3") + causal), o);
    const auto want = attend(q.view, k.view, v.view, parse_mechanism(std::string("softmax") + (*causal ? ":causal" : "")), o);
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < N; ++i) {
        EXPECT_NEAR(lsh.lse.at(0, h, i, 0), want.lse.at(0, h, i, 0), 1e-5) << causal;
        for (int64_t c = 0; c < D; ++c) EXPECT_NEAR(lsh.out.at(0, h, i, c), want.out.at(0, h, i, c), 1e-5) << causal;
      }
  }
  // shared_qk, causal: row 0 sees only itself; row i > 0 sees keys 0 .. i - 1.
  std::vector<uint8_t> mask(static_cast<size_t>(N * N), 0);
  for (int64_t i = 0; i < N; ++i)
    for (int64_t j = 0; j <= i; ++j) mask[static_cast<size_t>(i * N + j)] = i == 0 || j < i;
  AttendOptions masked = o;
  masked.mask = make_view(mask.data(), DType::boolean, 1, 1, N, N);
  const auto lsh = attend(q.view, k.view, v.view, parse_mechanism("lsh:chunk=64,causal,shared_qk"), o);
  const auto want = attend(q.view, k.view, v.view, Softmax{}, masked);
  for (int64_t h = 0; h < H; ++h)
    for (int64_t i = 0; i < N; ++i)
      for (int64_t c = 0; c < D; ++c) EXPECT_NEAR(lsh.out.at(0, h, i, c), want.out.at(0, h, i, c), 1e-5) << i;
}

// Keys in 16 tight clusters, each query near one of them: the attention mass is inside a
// query's cluster, which hashing finds, so LSH comes close to dense attention, and closer with
// more rounds (the union of the rounds' chunks covers more of the cluster).
TEST(Lsh, ClusteredInputsApproachDenseAttention) {
  std::mt19937 rng(33);
  const int64_t N = 1024, D = 32, clusters = 16;
  std::normal_distribution<float> g;
  std::vector<float> centre(static_cast<size_t>(clusters * D));
  for (float& x : centre) x = g(rng);
  for (int64_t c = 0; c < clusters; ++c) {  // unit centres, scaled so a cluster dominates
    double n2 = 0;
    for (int64_t d = 0; d < D; ++d) n2 += centre[static_cast<size_t>(c * D + d)] * centre[static_cast<size_t>(c * D + d)];
    for (int64_t d = 0; d < D; ++d) centre[static_cast<size_t>(c * D + d)] *= static_cast<float>(8.0 / std::sqrt(n2));
  }
  std::vector<float> qk(static_cast<size_t>(N * D)), v(static_cast<size_t>(N * D));
  for (int64_t t = 0; t < N; ++t) {
    const int64_t c = static_cast<int64_t>(rng() % clusters);
    for (int64_t d = 0; d < D; ++d) {
      qk[static_cast<size_t>(t * D + d)] = centre[static_cast<size_t>(c * D + d)] + 0.3f * g(rng);
      v[static_cast<size_t>(t * D + d)] = g(rng);
    }
  }
  const TensorView x = make_view(qk.data(), DType::f32, 1, 1, N, D), vv = make_view(v.data(), DType::f32, 1, 1, N, D);
  const auto dense = attend(x, x, vv, parse_mechanism("softmax"));
  auto error = [&](const char* mech) {
    const auto lsh = attend(x, x, vv, parse_mechanism(mech));
    double num = 0, den = 0;
    for (int64_t i = 0; i < N; ++i)
      for (int64_t d = 0; d < D; ++d) {
        const double e = lsh.out.at(0, 0, i, d) - dense.out.at(0, 0, i, d);
        num += e * e;
        den += dense.out.at(0, 0, i, d) * dense.out.at(0, 0, i, d);
      }
    return std::sqrt(num / den);
  };
  // Relative to the dense output, which averages ~64 random values (norm ~1/8 of v's): missing a
  // few cluster members shows.
  const double one = error("lsh:buckets=64,rounds=1,chunk=64,seed=1");
  const double eight = error("lsh:buckets=64,rounds=8,chunk=64,seed=1");
  const double tiny_chunks = error("lsh:buckets=2,rounds=1,chunk=8,seed=1");  // little of a cluster
  EXPECT_LT(eight, 0.2);
  EXPECT_LT(eight, one / 4);
  EXPECT_GT(tiny_chunks, 4 * eight);
}

TEST(Lsh, BadInputIsNamed) {
  std::mt19937 rng(34);
  auto q = testing::random_tensor(rng, DType::f32, 1, 2, 5, 8);
  std::vector<float> rot(2 * 8 * 3);
  AttendOptions o;
  o.params["rotations"] = make_array_view(rot.data(), DType::f32, {2, 8, 3});
  testing::expect_error([&] { attend(q.view, q.view, q.view, parse_mechanism("lsh:buckets=8"), o); }, "rotations");
  testing::expect_error([&] { (void)mask_of(parse_mechanism("lsh"), 4, 4); }, "lsh has no fixed key pattern");
}

}  // namespace
}  // namespace attn
