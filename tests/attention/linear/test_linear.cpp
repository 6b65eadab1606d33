// Linear attention's own promises beyond the case list (which checks every form against the
// quadratic float64 reference, final states included): a sequence split into calls with the
// state passed along equals one call; a zero denominator gives a zero row; long decays stay
// finite; results do not depend on the thread count; the state may be updated in place.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "support/expect_error.hpp"
#include "linear/linear.hpp"
#include "support/random_inputs.hpp"

namespace attn {
namespace {

struct Qkv {
  testing::Buffer q, k, v;
};

Qkv random_qkv(uint32_t seed, int64_t B, int64_t H, int64_t Hkv, int64_t N, int64_t D, int64_t Dv) {
  std::mt19937 rng(seed);
  Qkv x;
  x.q = testing::random_tensor(rng, DType::f32, B, H, N, D);
  x.k = testing::random_tensor(rng, DType::f32, B, Hkv, N, D);
  x.v = testing::random_tensor(rng, DType::f32, B, Hkv, N, Dv);
  return x;
}

// Tokens [t0, t0 + n) of a (B, H, N, D) view.
TensorView tokens(TensorView t, int64_t t0, int64_t n) {
  t.data = t.ptr(0, 0, t0);
  t.shape[2] = n;
  return t;
}

ArrayView state_param(const Tensor& s) {
  const TensorView& v = s.view();
  return make_array_view(v.data, DType::f32, {v.shape[0], v.shape[1], v.shape[2], v.shape[3]});
}

TEST(Linear, SplitCallsWithTheStateEqualOneCall) {
  const int64_t B = 2, H = 4, Hkv = 2, N = 57, D = 16, Dv = 12, cut = 23;
  const Qkv x = random_qkv(3, B, H, Hkv, N, D, Dv);
  for (const char* mech : {"linear:map=elu,causal,chunk=8", "retention:decay=0.9,chunk=16",
                           "linear:map=relu2,causal,decay=0.7,chunk=5", "polaformer:power=2,causal,chunk=8",
                           "performer:features=20,seed=2,causal,chunk=8"})
    for (const char* form : {"chunked", "recurrent"}) {
      AttendOptions o;
      o.form = form;
      o.return_final_state = true;
      const Mechanism m = parse_mechanism(mech);
      const AttendResult whole = attend(x.q.view, x.k.view, x.v.view, m, o);
      const AttendResult first =
          attend(tokens(x.q.view, 0, cut), tokens(x.k.view, 0, cut), tokens(x.v.view, 0, cut), m, o);
      o.params["initial_state"] = state_param(first.final_state);
      const AttendResult second = attend(tokens(x.q.view, cut, N - cut), tokens(x.k.view, cut, N - cut),
                                         tokens(x.v.view, cut, N - cut), m, o);
      for (int64_t b = 0; b < B; ++b)
        for (int64_t h = 0; h < H; ++h)
          for (int64_t i = 0; i < N; ++i)
            for (int64_t c = 0; c < Dv; ++c) {
              const float want = whole.out.at(b, h, i, c);
              const float got = i < cut ? first.out.at(b, h, i, c) : second.out.at(b, h, i - cut, c);
              ASSERT_NEAR(got, want, 2e-5f * (1 + std::abs(want))) << mech << " " << form << " token " << i;
            }
      const TensorView& s = whole.final_state.view();
      ASSERT_EQ(s.shape, second.final_state.view().shape);
      for (int64_t e = 0; e < s.numel(); ++e) {
        const float want = static_cast<const float*>(s.data)[e];
        EXPECT_NEAR(static_cast<const float*>(second.final_state.view().data)[e], want, 2e-5f * (1 + std::abs(want)))
            << mech << " " << form;
      }
    }
}

TEST(Linear, ZeroDenominatorGivesAZeroRow) {
  // relu features: a query with no positive component has phi(q) = 0, so its weights sum to 0.
  const int64_t N = 9, D = 4;
  Qkv x = random_qkv(4, 1, 1, 1, N, D, D);
  testing::fill_token(x.q.view, 0, 0, 3, -1.0f);
  for (const char* mech : {"linear:map=relu", "linear:map=relu,causal", "linear:map=relu,causal,decay=0.5"})
    for (const char* form : {"right", "recurrent", "chunked", "reference"}) {
      AttendOptions o;
      const Mechanism m = parse_mechanism(mech);
      bool supported = false;
      for (const auto& f : explain(x.q.view, x.k.view, x.v.view, m, o).forms)
        supported |= f.form == form && f.reasons.empty();
      if (!supported) continue;
      o.form = form;
      const AttendResult r = attend(x.q.view, x.k.view, x.v.view, m, o);
      for (int64_t c = 0; c < D; ++c) EXPECT_EQ(r.out.at(0, 0, 3, c), 0.0f) << mech << " " << form;
      for (int64_t c = 0; c < D; ++c) EXPECT_NE(r.out.at(0, 0, 4, c), 0.0f) << mech << " " << form;
    }
}

TEST(Linear, StrongDecayOverALongSequenceStaysExact) {
  // lambda = 0.5 over 3000 tokens: lambda^-n would overflow float long before; the chunked form
  // only ever multiplies by powers <= 1.
  const int64_t N = 3000, D = 4;
  const Qkv x = random_qkv(5, 1, 1, 1, N, D, D);
  const Mechanism m = parse_mechanism("retention:decay=0.5,chunk=64");
  AttendOptions o;
  o.return_final_state = true;
  const AttendResult fast = attend(x.q.view, x.k.view, x.v.view, m, o);
  o.form = "reference";
  const AttendResult ref = attend(x.q.view, x.k.view, x.v.view, m, o);
  for (int64_t i = 0; i < N; ++i)
    for (int64_t c = 0; c < D; ++c) {
      ASSERT_TRUE(std::isfinite(fast.out.at(0, 0, i, c)));
      ASSERT_NEAR(fast.out.at(0, 0, i, c), ref.out.at(0, 0, i, c), 1e-5f) << i;
    }
}

TEST(Linear, BitwiseAcrossThreadCounts) {
  const Qkv x = random_qkv(6, 2, 3, 3, 300, 16, 16);
  for (const char* mech : {"linear:map=elu", "linear:map=elu,causal", "retention:decay=0.95"}) {
    AttendOptions o;
    o.return_final_state = true;
    o.threads = 1;
    const AttendResult one = attend(x.q.view, x.k.view, x.v.view, parse_mechanism(mech), o);
    o.threads = 3;
    const AttendResult three = attend(x.q.view, x.k.view, x.v.view, parse_mechanism(mech), o);
    EXPECT_EQ(std::memcmp(one.out.view().data, three.out.view().data, one.out.view().numel() * sizeof(float)), 0)
        << mech;
    EXPECT_EQ(std::memcmp(one.final_state.view().data, three.final_state.view().data,
                          one.final_state.view().numel() * sizeof(float)),
              0)
        << mech;
  }
}

TEST(Linear, TheStateMayBeUpdatedInPlace) {
  // Decoding: final_state written over the initial_state it was given.
  const int64_t N = 5, D = 8;
  const Qkv x = random_qkv(7, 1, 2, 2, N, D, D);
  const Mechanism m = parse_mechanism("linear:map=elu,causal");
  AttendOptions o;
  o.return_final_state = true;
  const AttendResult whole = attend(x.q.view, x.k.view, x.v.view, m, o);
  Tensor state(DType::f32, {1, 2, D, D + 1});  // zeros: no earlier tokens
  Tensor out(DType::f32, {1, 2, 1, D});
  AttendOptions step;
  step.params["initial_state"] = state_param(state);
  for (int64_t t = 0; t < N; ++t) {
    attend_into(tokens(x.q.view, t, 1), tokens(x.k.view, t, 1), tokens(x.v.view, t, 1), m, step, out.view(), nullptr,
                nullptr, &state.view());
    for (int64_t h = 0; h < 2; ++h)
      for (int64_t c = 0; c < D; ++c) EXPECT_NEAR(out.at(0, h, 0, c), whole.out.at(0, h, t, c), 1e-5f) << t;
  }
  for (int64_t e = 0; e < state.view().numel(); ++e)
    EXPECT_NEAR(static_cast<const float*>(state.view().data)[e], static_cast<const float*>(whole.final_state.view().data)[e],
                1e-4f);
}

TEST(Linear, RetentionIsAnAliasOfLinear) {
  EXPECT_EQ(parse_mechanism("retention:decay=0.97"), parse_mechanism("linear:map=identity,causal,normalize=0,decay=0.97"));
  EXPECT_EQ(to_string(parse_mechanism("retention:decay=0.97,chunk=128")),
            "linear:map=identity,causal,normalize=0,decay=0.97,chunk=128");
  testing::expect_error([] { parse_mechanism("linear:map=tanh"); }, "map");
  testing::expect_error([] { parse_mechanism("linear:normalize=2"); }, "linear normalize must be 0 or 1, got 2");
  testing::expect_error([] { parse_mechanism("retention:map=elu"); }, "map");
}

TEST(Linear, PerHeadDecaysAndTheirErrors) {
  const Qkv x = random_qkv(8, 1, 2, 2, 6, 4, 4);
  std::vector<float> decays = {0.5f, 1.0f};
  AttendOptions o;
  o.params["decay"] = make_array_view(decays.data(), DType::f32, {2});
  // head 1 has decay 1: the same as no decay at all
  const AttendResult r = attend(x.q.view, x.k.view, x.v.view, parse_mechanism("retention"), o);
  const AttendResult plain = attend(x.q.view, x.k.view, x.v.view, parse_mechanism("retention"));
  for (int64_t i = 0; i < 6; ++i)
    for (int64_t c = 0; c < 4; ++c) EXPECT_NEAR(r.out.at(0, 1, i, c), plain.out.at(0, 1, i, c), 1e-6f);
  testing::expect_error([&] { attend(x.q.view, x.k.view, x.v.view, parse_mechanism("retention:decay=0.9"), o); },
                        "has a decay in its text and params['decay'] too");
  decays[0] = 0.0f;
  testing::expect_error([&] { attend(x.q.view, x.k.view, x.v.view, parse_mechanism("retention"), o); },
                        "params['decay'][0] must be in (0, 1], got 0");
}

}  // namespace
}  // namespace attn

namespace attn::linear {
namespace {

TEST(Performer, FeatureRowsAreOrthogonalBlocksWithChiNorms) {
  const int64_t D = 16, F = 40;  // two full blocks and a part
  double mean_sq = 0;
  int rows = 0;
  for (uint64_t seed = 1; seed <= 50; ++seed) {
    const std::vector<double> w = performer_omega(F, D, seed);
    for (int64_t f = 0; f < F; ++f) {
      double n2 = 0;
      for (int64_t c = 0; c < D; ++c) n2 += w[static_cast<size_t>(f * D + c)] * w[static_cast<size_t>(f * D + c)];
      mean_sq += n2, ++rows;
      for (int64_t g = f - f % D; g < f; ++g) {  // earlier rows of the same block
        double dot = 0;
        for (int64_t c = 0; c < D; ++c) dot += w[static_cast<size_t>(f * D + c)] * w[static_cast<size_t>(g * D + c)];
        EXPECT_NEAR(dot, 0.0, 1e-9 * n2) << seed << " " << f << " " << g;
      }
    }
  }
  EXPECT_NEAR(mean_sq / rows, static_cast<double>(D), 0.05 * D);  // E |g|^2 = D for g ~ N(0, I_D)
}

TEST(Performer, EstimateApproachesSoftmaxAsFeaturesGrow) {
  const int64_t N = 64, D = 16;
  std::mt19937 rng(9);
  auto q = testing::random_tensor(rng, DType::f32, 1, 2, N, D, Layout::bhnd, 0.7f);
  auto k = testing::random_tensor(rng, DType::f32, 1, 2, N, D, Layout::bhnd, 0.7f);
  auto v = testing::random_tensor(rng, DType::f32, 1, 2, N, D);
  const AttendResult exact = attend(q.view, k.view, v.view, Softmax{});
  double last = INFINITY;
  for (int64_t features : {16, 64, 256, 1024}) {
    double err = 0;  // mean |performer - softmax| over outputs and 8 seeds
    for (uint64_t seed = 1; seed <= 8; ++seed) {
      Performer m;
      m.features = features, m.seed = seed;
      const AttendResult r = attend(q.view, k.view, v.view, m);
      for (int64_t h = 0; h < 2; ++h)
        for (int64_t i = 0; i < N; ++i)
          for (int64_t c = 0; c < D; ++c) err += std::abs(r.out.at(0, h, i, c) - exact.out.at(0, h, i, c));
    }
    err /= 8.0 * 2 * N * D;
    EXPECT_LT(err, 0.75 * last) << features << " features";
    last = err;
  }
  EXPECT_LT(last, 0.03);
}

TEST(NormAttnAndSana, MatchTheirDefinitions) {
  // normattn = unnormalised linear attention, each output row RMS-normalised; sana = relu linear
  // attention with eps in the denominator.
  const int64_t N = 20, D = 8;
  std::mt19937 rng(10);
  auto q = testing::random_tensor(rng, DType::f32, 1, 1, N, D);
  auto k = testing::random_tensor(rng, DType::f32, 1, 1, N, D);
  auto v = testing::random_tensor(rng, DType::f32, 1, 1, N, D);
  const AttendResult plain = attend(q.view, k.view, v.view, parse_mechanism("linear:map=elu,causal,normalize=0"));
  const AttendResult norm = attend(q.view, k.view, v.view, parse_mechanism("normattn:map=elu,causal"));
  for (int64_t i = 0; i < N; ++i) {
    double sq = 0;
    for (int64_t c = 0; c < D; ++c) sq += std::pow(plain.out.at(0, 0, i, c), 2);
    const double inv = 1 / std::sqrt(sq / D + 1e-6);
    for (int64_t c = 0; c < D; ++c) EXPECT_NEAR(norm.out.at(0, 0, i, c), plain.out.at(0, 0, i, c) * inv, 1e-5);
  }
  const AttendResult relu = attend(q.view, k.view, v.view, parse_mechanism("linear:map=relu"));
  const AttendResult sana = attend(q.view, k.view, v.view, parse_mechanism("sana"));
  for (int64_t i = 0; i < N; ++i)
    for (int64_t c = 0; c < D; ++c) EXPECT_NEAR(sana.out.at(0, 0, i, c), relu.out.at(0, 0, i, c), 1e-6);
  testing::expect_error([&] { attend(q.view, k.view, v.view, parse_mechanism("sana:eps=-1")); },
                        "sana eps must be in [0, 1e+30], got -1");
  testing::expect_error([&] { attend(q.view, k.view, v.view, parse_mechanism("performer:features=0")); },
                        "performer features must be in [1, 65536], got 0");
  testing::expect_error([&] { attend(q.view, k.view, v.view, parse_mechanism("polaformer:power=1")); },
                        "polaformer power must be in (1, 10], got 1");
}

TEST(PolaFormer, StreamsOnValueHalvesWithPowersAndCoefficients) {
  // Written out: same-sign weights on the first half of v, opposite-sign on the second, each
  // normalised, times the coefficients.
  const int64_t N = 11, D = 4, Dv = 6;
  std::mt19937 rng(12);
  auto q = testing::random_tensor(rng, DType::f32, 1, 1, N, D);
  auto k = testing::random_tensor(rng, DType::f32, 1, 1, N, D);
  auto v = testing::random_tensor(rng, DType::f32, 1, 1, N, Dv);
  std::vector<float> power = {1.5f, 2.0f, 3.0f, 2.5f}, coef = {1, 2, 3, 4, 5, 6};
  AttendOptions o;
  o.params["power"] = make_array_view(power.data(), DType::f32, {D});
  o.params["coefficients"] = make_array_view(coef.data(), DType::f32, {Dv});
  o.return_final_state = true;
  const AttendResult r = attend(q.view, k.view, v.view, parse_mechanism("polaformer:causal"), o);
  EXPECT_EQ(r.final_state.view().shape, (std::array<int64_t, 4>{1, 1, 4 * D, Dv / 2 + 1}));
  auto pos = [&](float x, int64_t c) { return x > 0 ? std::pow(double(x), double(power[static_cast<size_t>(c)])) : 0.0; };
  auto neg = [&](float x, int64_t c) { return x < 0 ? std::pow(double(-x), double(power[static_cast<size_t>(c)])) : 0.0; };
  for (int64_t i = 0; i < N; ++i)
    for (int s = 0; s < 2; ++s) {
      std::vector<double> num(Dv / 2, 0.0);
      double den = 0;
      for (int64_t j = 0; j <= i; ++j) {
        double w = 0;
        for (int64_t c = 0; c < D; ++c) {
          const float a = q.view.at(0, 0, i, c), b = k.view.at(0, 0, j, c);
          w += s == 0 ? pos(a, c) * pos(b, c) + neg(a, c) * neg(b, c) : pos(a, c) * neg(b, c) + neg(a, c) * pos(b, c);
        }
        den += w;
        for (int64_t c = 0; c < Dv / 2; ++c) num[static_cast<size_t>(c)] += w * v.view.at(0, 0, j, s * Dv / 2 + c);
      }
      for (int64_t c = 0; c < Dv / 2; ++c) {
        const int64_t ch = s * Dv / 2 + c;
        const double want = den != 0 ? num[static_cast<size_t>(c)] / den * coef[static_cast<size_t>(ch)] : 0.0;
        EXPECT_NEAR(r.out.at(0, 0, i, ch), want, 1e-5 * (1 + std::abs(want))) << i << " " << ch;
      }
    }
}

}  // namespace
}  // namespace attn::linear

namespace attn {
namespace {

TEST(Efficient, SplitCallsWithTheStateEqualOneCall) {
  const int64_t B = 2, H = 2, N = 30, D = 8, cut = 11;
  std::mt19937 rng(13);
  auto q = testing::random_tensor(rng, DType::f32, B, H, N, D, Layout::bhnd, 3.0f);
  auto k = testing::random_tensor(rng, DType::f32, B, H, N, D, Layout::bhnd, 3.0f);
  auto v = testing::random_tensor(rng, DType::f32, B, H, N, D);
  auto part = [](TensorView t, int64_t t0, int64_t n) {
    t.data = t.ptr(0, 0, t0);
    t.shape[2] = n;
    return t;
  };
  for (const char* mech : {"efficient:causal", "efficient"}) {
    const bool causal = std::string(mech).find("causal") != std::string::npos;
    AttendOptions o;
    o.return_final_state = true;
    const Mechanism m = parse_mechanism(mech);
    const AttendResult whole = attend(q.view, k.view, v.view, m, o);
    // non-causal: the first call's keys enter the second call's queries through the state
    const AttendResult first = attend(part(q.view, 0, cut), part(k.view, 0, cut), part(v.view, 0, cut), m, o);
    const TensorView& s = first.final_state.view();
    o.params["initial_state"] = make_array_view(s.data, DType::f32, {s.shape[0], s.shape[1], s.shape[2], s.shape[3]});
    const AttendResult second = attend(part(q.view, cut, N - cut), part(k.view, cut, N - cut), part(v.view, cut, N - cut), m, o);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t i = cut; i < N; ++i)
          for (int64_t c = 0; c < D; ++c)
            ASSERT_NEAR(second.out.at(b, h, i - cut, c), whole.out.at(b, h, i, c), 2e-5f) << mech << " " << i;
    if (causal)
      for (int64_t i = 0; i < cut; ++i)
        for (int64_t c = 0; c < D; ++c) ASSERT_NEAR(first.out.at(0, 0, i, c), whole.out.at(0, 0, i, c), 2e-5f);
    const TensorView& w = whole.final_state.view();
    for (int64_t e = 0; e < w.numel(); ++e) {
      const float want = static_cast<const float*>(w.data)[e];
      EXPECT_NEAR(static_cast<const float*>(second.final_state.view().data)[e], want, 2e-5f * (1 + std::abs(want)));
    }
  }
}

}  // namespace
}  // namespace attn
