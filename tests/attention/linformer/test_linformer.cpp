// Linformer's exact limits and its own rules; the case list checks it against its float64
// reference on every form and ISA.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "base/counter_random.hpp"
#include "support/expect_error.hpp"
#include "support/random_inputs.hpp"

namespace attn {
namespace {

// E = F = I (k = M): K' = K, V' = V, so Linformer is exact softmax attention.
TEST(Linformer, IdentityProjectionIsExactAttention) {
  std::mt19937 rng(5);
  const int64_t B = 2, H = 4, Hkv = 2, N = 20, M = 31, D = 16;
  auto q = testing::random_tensor(rng, DType::f32, B, H, N, D);
  auto k = testing::random_tensor(rng, DType::f32, B, Hkv, M, D);
  auto v = testing::random_tensor(rng, DType::f32, B, Hkv, M, D);
  std::vector<float> eye(static_cast<size_t>(M * M), 0.0f);
  for (int64_t j = 0; j < M; ++j) eye[static_cast<size_t>(j * M + j)] = 1.0f;
  AttendOptions o;
  o.return_lse = true;
  const auto exact = attend(q.view, k.view, v.view, Softmax{}, o);
  o.params["E"] = make_array_view(eye.data(), DType::f32, {M, M});
  o.params["F"] = o.params["E"];
  Linformer l;
  l.k = M;
  for (const char* form : {"projected", "reference"}) {
    o.form = form;
    const auto low = attend(q.view, k.view, v.view, l, o);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t i = 0; i < N; ++i) {
          EXPECT_NEAR(low.lse.at(b, h, i, 0), exact.lse.at(b, h, i, 0), 2e-6) << form;
          for (int64_t c = 0; c < D; ++c) EXPECT_NEAR(low.out.at(b, h, i, c), exact.out.at(b, h, i, c), 2e-6) << form;
        }
  }
}

TEST(Linformer, SeededProjectionsAreReproducibleAndScaledByOneOverSqrtK) {
  std::mt19937 rng(6);
  auto q = testing::random_tensor(rng, DType::f32, 1, 2, 9, 8);
  auto k = testing::random_tensor(rng, DType::f32, 1, 2, 40, 8);
  const auto a = attend(q.view, k.view, k.view, parse_mechanism("linformer:k=8,seed=4"));
  const auto b = attend(q.view, k.view, k.view, parse_mechanism("linformer:k=8,seed=4"));
  const auto c = attend(q.view, k.view, k.view, parse_mechanism("linformer:k=8,seed=5"));
  EXPECT_EQ(0, std::memcmp(a.out.view().data, b.out.view().data, 2 * 9 * 8 * sizeof(float)));
  EXPECT_NE(0, std::memcmp(a.out.view().data, c.out.view().data, 2 * 9 * 8 * sizeof(float)));
  // The documented rule: E[r][j] = counter_normal(seed, 0, r, j) / sqrt(k), F the same with 1.
  // Passed as params, those matrices give the seeded output bit for bit; without the 1/sqrt(k)
  // they give another.
  const int64_t K = 8, M = 40;
  std::vector<float> e(K * M), f(K * M), e1(K * M), f1(K * M);
  for (int64_t r = 0; r < K; ++r)
    for (int64_t j = 0; j < M; ++j) {
      const size_t at = static_cast<size_t>(r * M + j);
      e1[at] = static_cast<float>(counter_normal(4, 0, static_cast<uint64_t>(r), static_cast<uint64_t>(j)));
      f1[at] = static_cast<float>(counter_normal(4, 1, static_cast<uint64_t>(r), static_cast<uint64_t>(j)));
      e[at] = static_cast<float>(counter_normal(4, 0, static_cast<uint64_t>(r), static_cast<uint64_t>(j)) / std::sqrt(8.0));
      f[at] = static_cast<float>(counter_normal(4, 1, static_cast<uint64_t>(r), static_cast<uint64_t>(j)) / std::sqrt(8.0));
    }
  auto with = [&](std::vector<float>& E, std::vector<float>& F) {
    AttendOptions o;
    o.params["E"] = make_array_view(E.data(), DType::f32, {K, M});
    o.params["F"] = make_array_view(F.data(), DType::f32, {K, M});
    return attend(q.view, k.view, k.view, parse_mechanism("linformer:k=8"), o);
  };
  const auto given = with(e, f), unscaled = with(e1, f1);
  EXPECT_EQ(0, std::memcmp(a.out.view().data, given.out.view().data, 2 * 9 * 8 * sizeof(float)));
  double diff = 0;
  for (int64_t h = 0; h < 2; ++h)
    for (int64_t i = 0; i < 9; ++i)
      for (int64_t d = 0; d < 8; ++d) diff = std::max(diff, double(std::abs(a.out.at(0, h, i, d) - unscaled.out.at(0, h, i, d))));
  EXPECT_GT(diff, 1e-2);
}

TEST(Linformer, BadInputIsNamed) {
  std::mt19937 rng(7);
  auto q = testing::random_tensor(rng, DType::f32, 1, 2, 5, 8);
  auto k = testing::random_tensor(rng, DType::f32, 1, 2, 6, 8);
  auto expect = [&](const char* mech, AttendOptions o, const char* fragment) {
    testing::expect_error([&] { attend(q.view, k.view, k.view, parse_mechanism(mech), o); }, fragment);
  };
  expect("linformer:k=0", {}, "linformer k must be in [1, 2^20], got 0");
  AttendOptions probs;
  probs.return_probs = true;
  expect("linformer", probs, "linformer returns no probabilities");
  std::vector<float> e(4 * 6, 0.1f);
  AttendOptions one;
  one.params["E"] = make_array_view(e.data(), DType::f32, {4, 6});
  expect("linformer:k=4", one, "linformer:k=4 needs params['F'] of shape (k, M)");
  one.params["F"] = make_array_view(e.data(), DType::f32, {4, 6});
  expect("linformer:k=3", one, "params['E'] must have shape (k, M) with k = 3, got (4, 6)");
  AttendOptions alibi;
  alibi.alibi_slopes = {1, 1};
  expect("linformer", alibi, "linformer does not take ALiBi slopes");
  expect("linformer:k=4,causal", {}, "unknown linformer option 'causal'");
}

}  // namespace
}  // namespace attn
