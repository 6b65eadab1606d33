// Hardening, classes 2 and 3: non-finite inputs and options that would overflow downstream
// arithmetic. A non-finite input that reaches a visible score makes that row NaN (output and
// LSE) on every form and ISA, as in the reference; it never leaks into other rows; LSE -inf
// stays reserved for rows that see no key.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "families/internal_api.hpp"
#include "support/random_inputs.hpp"

namespace attn {
namespace {

constexpr int64_t B = 2, H = 4, Hkv = 2, N = 3, M = 40, D = 8;

struct Poisoned {
  std::mt19937 rng{17};
  testing::Buffer q = testing::random_tensor(rng, DType::f32, B, H, N, D);
  testing::Buffer k = testing::random_tensor(rng, DType::f32, B, Hkv, M, D);
  testing::Buffer v = testing::random_tensor(rng, DType::f32, B, Hkv, M, D);
  std::vector<float> bias = std::vector<float>(static_cast<size_t>(B * H * N * M), 0.0f);
};

// Runs every form on every ISA; `poisoned(b, h, i)` says which rows must be NaN, all others
// must equal the clean run bitwise (same form, same ISA).
void expect_rows(const Poisoned& clean, const Poisoned& bad, const std::string& mech,
                 const std::function<bool(int64_t, int64_t, int64_t)>& poisoned) {
  AttendOptions o;
  o.return_lse = true;
  for (const char* form : {"rows", "tiled", "reference"})
    for (Isa isa : supported_isas()) {
      SCOPED_TRACE(std::string(form) + " " + isa_name(isa) + " " + mech);
      o.form = form;
      o.isa = isa;
      std::vector<float> cb = clean.bias, bb = bad.bias;
      o.bias = make_view(cb.data(), DType::f32, B, H, N, M);
      const AttendResult want = attend(clean.q.view, clean.k.view, clean.v.view, parse_mechanism(mech), o);
      o.bias = make_view(bb.data(), DType::f32, B, H, N, M);
      const AttendResult got = attend(bad.q.view, bad.k.view, bad.v.view, parse_mechanism(mech), o);
      for (int64_t b = 0; b < B; ++b)
        for (int64_t h = 0; h < H; ++h)
          for (int64_t i = 0; i < N; ++i) {
            const float lse = got.lse.at(b, h, i, 0);
            if (poisoned(b, h, i)) {
              EXPECT_TRUE(std::isnan(lse)) << "lse of poisoned row " << b << "," << h << "," << i << " is " << lse;
              for (int64_t c = 0; c < D; ++c) EXPECT_TRUE(std::isnan(got.out.at(b, h, i, c))) << "out row " << i;
            } else {
              EXPECT_EQ(lse, want.lse.at(b, h, i, 0)) << "clean row " << b << "," << h << "," << i;
              for (int64_t c = 0; c < D; ++c) EXPECT_EQ(got.out.at(b, h, i, c), want.out.at(b, h, i, c));
            }
          }
    }
}

TEST(NonFinite, NanInOneQueryPoisonsOnlyThatRow) {
  Poisoned clean, bad;
  testing::fill_token(bad.q.view, 1, 2, 1, testing::nan_f());
  expect_rows(clean, bad, "softmax", [](int64_t b, int64_t h, int64_t i) { return b == 1 && h == 2 && i == 1; });
}

TEST(NonFinite, InfInAKeyPoisonsTheRowsThatSeeIt) {
  Poisoned clean, bad;
  testing::fill_token(bad.k.view, 0, 1, M - 2, INFINITY);  // kv head 1 = query heads 2, 3
  // causal: query i sees j <= i + M - N, so key M - 2 is seen by queries 1 and 2 only
  expect_rows(clean, bad, "softmax:causal",
              [](int64_t b, int64_t h, int64_t i) { return b == 0 && h >= 2 && i >= 1; });
}

TEST(NonFinite, InfOrNanInABiasPoisonsItsRow) {
  for (float x : {INFINITY, std::nanf("")}) {
    Poisoned clean, bad;
    bad.bias[static_cast<size_t>(((1 * H + 3) * N + 0) * M + 7)] = x;
    expect_rows(clean, bad, "softmax:softcap=20", [](int64_t b, int64_t h, int64_t i) { return b == 1 && h == 3 && i == 0; });
  }
}

TEST(NonFinite, ReferenceAgrees) {
  Poisoned bad;
  testing::fill_token(bad.q.view, 0, 0, 0, testing::nan_f());
  const auto r = families::reference_outputs(bad.q.view, bad.k.view, bad.v.view, Softmax{}, {}, core::RefPrecision::f64);
  EXPECT_TRUE(std::isnan(r.l(0, 0, 0)));
  EXPECT_TRUE(std::isnan(r.o(0, 0, 0, 3)));
  EXPECT_FALSE(std::isnan(r.l(0, 0, 1)));
}

// Class 3: a scale finite as a double but infinite as float32 is refused, not turned into zeros.
TEST(Overflow, ScaleAndSoftcapMustFitFloat32) {
  Poisoned s;
  for (const char* mech : {"softmax:scale=1e39", "softmax:scale=1e-50", "softmax:softcap=1e39"})
    EXPECT_THROW(attend(s.q.view, s.k.view, s.v.view, parse_mechanism(mech)), Error) << mech;
  try {
    attend(s.q.view, s.k.view, s.v.view, parse_mechanism("softmax:scale=1e39"));
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("scale must be a positive finite float32"), std::string::npos) << e.what();
  }
}

// Class 3: window bounds near 2^63 mean "unbounded", they do not overflow and mask everything.
TEST(Overflow, HugeWindowsAreUnbounded) {
  Poisoned s;
  AttendOptions o;
  o.return_lse = true;
  const int64_t huge = std::numeric_limits<int64_t>::max();
  for (const char* form : {"rows", "tiled", "reference"}) {
    o.form = form;
    const auto open = attend(s.q.view, s.k.view, s.v.view, parse_mechanism("softmax"), o);
    Softmax w;
    w.window_left = huge, w.window_right = huge;
    const auto wide = attend(s.q.view, s.k.view, s.v.view, w, o);
    EXPECT_EQ(std::memcmp(open.out.view().data, wide.out.view().data, B * H * N * D * sizeof(float)), 0) << form;
    Softmax c;
    c.causal = true, c.window_left = huge - 1, c.window_right = huge;
    const auto causal = attend(s.q.view, s.k.view, s.v.view, parse_mechanism("softmax:causal"), o);
    const auto causal_wide = attend(s.q.view, s.k.view, s.v.view, c, o);
    EXPECT_EQ(std::memcmp(causal.out.view().data, causal_wide.out.view().data, B * H * N * D * sizeof(float)), 0) << form;
    EXPECT_EQ(attention_flops(s.q.view, s.k.view, s.v.view, w), attention_flops(s.q.view, s.k.view, s.v.view, Softmax{}));
  }
}

}  // namespace
}  // namespace attn
