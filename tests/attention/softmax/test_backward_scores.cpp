// The softmax family's backward for cosine and additive scores: the float64 reference against
// central finite differences of the float64 forward reference (q, k, v and, for additive scores,
// the params wq, wk and w), the scores form against the reference under the 3x-plain rule in every
// storage dtype (parameter gradients included), bitwise the same on 1 and 3 threads (a problem with
// one kv head, whose query blocks split into segments, and one with many), rows without keys, keys
// past the padding, and clamped norms.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "attn/attn.hpp"
#include "families/internal_api.hpp"
#include "support/expect_error.hpp"
#include "support/gradient_checks.hpp"
#include "support/random_inputs.hpp"

namespace attn {
namespace {

using testing::Buffer;
using testing::random_tensor;

struct Shape {
  std::string mech;
  int64_t B = 1, H = 2, Hkv = 1, N = 5, M = 7, D = 4, Dv = 3, A = 3;
  bool padding = false, bias = false;
};

struct Inputs {
  Buffer q, k, v, dout, wq, wk, w;  // wq, wk (1, 1, A, D), w (1, 1, 1, A) float32, passed as (A, D), (A)
  std::vector<float> bias;
  AttendOptions o;
  Mechanism m;
};

bool additive(const Shape& sh) { return sh.mech.find("additive") != std::string::npos; }

Inputs make(const Shape& sh, DType dt, uint32_t seed) {
  std::mt19937 rng(seed);
  Inputs s;
  s.q = random_tensor(rng, dt, sh.B, sh.H, sh.N, sh.D);
  s.k = random_tensor(rng, dt, sh.B, sh.Hkv, sh.M, sh.D);
  s.v = random_tensor(rng, dt, sh.B, sh.Hkv, sh.M, sh.Dv);
  s.dout = random_tensor(rng, dt, sh.B, sh.H, sh.N, sh.Dv);
  s.m = parse_mechanism(sh.mech);
  if (additive(sh)) {
    s.wq = random_tensor(rng, DType::f32, 1, 1, sh.A, sh.D);
    s.wk = random_tensor(rng, DType::f32, 1, 1, sh.A, sh.D);
    s.w = random_tensor(rng, DType::f32, 1, 1, 1, sh.A);
    s.o.params["wq"] = make_array_view(s.wq.view.data, DType::f32, {sh.A, sh.D});
    s.o.params["wk"] = make_array_view(s.wk.view.data, DType::f32, {sh.A, sh.D});
    s.o.params["w"] = make_array_view(s.w.view.data, DType::f32, {sh.A});
  }
  if (sh.padding) {
    s.o.key_padding_lengths.assign(static_cast<size_t>(sh.B), sh.M);
    s.o.key_padding_lengths.back() = sh.M / 2;
  }
  if (sh.bias) {
    s.bias.resize(static_cast<size_t>(sh.B * sh.N * sh.M));
    std::normal_distribution<float> nd;
    for (auto& x : s.bias) x = nd(rng);
    s.o.bias = make_view(s.bias.data(), DType::f32, sh.B, 1, sh.N, sh.M);
    s.o.bias->strides[1] = 0;
  }
  return s;
}

double loss(const Inputs& s) { return testing::reference_loss(s); }

AttendGradients backward(const Inputs& s, const std::string& form, int threads = 0) {
  return testing::forward_then_backward(s, form, threads);
}

std::vector<Shape> shapes() {
  std::vector<Shape> v;
  for (const char* score : {"cosine", "additive"}) {
    const std::string m = std::string("softmax:score=") + score;
    v.push_back({m});
    v.push_back({m + ",causal"});
    v.push_back({m + ",softcap=2,scale=1.5"});
    v.push_back({m + ",causal,window=2:0,entropy_scale=16"});
    v.push_back({m + ",dropout=0.3,seed=5"});
    Shape gqa{m};
    gqa.H = 4, gqa.Hkv = 2;
    v.push_back(gqa);
    Shape pad{m};
    pad.B = 2, pad.padding = true, pad.bias = true;  // batch entry 1: 3 valid keys
    v.push_back(pad);
    Shape rows{m + ",causal"};
    rows.N = 9, rows.M = 6;  // three rows before the first key
    v.push_back(rows);
  }
  return v;
}

class ScoresBackward : public ::testing::TestWithParam<Shape> {};

TEST_P(ScoresBackward, ReferenceMatchesFiniteDifferences) {
  Inputs s = make(GetParam(), DType::f32, 11);
  const AttendGradients g = backward(s, "reference");
  const auto l = [&] { return loss(s); };
  testing::expect_matches_finite_differences(l, s.q, g.dq, "dq");
  testing::expect_matches_finite_differences(l, s.k, g.dk, "dk");
  testing::expect_matches_finite_differences(l, s.v, g.dv, "dv");
  if (!additive(GetParam())) {
    EXPECT_TRUE(g.dparams.empty());
    return;
  }
  ASSERT_EQ(g.dparams.size(), 3u);
  EXPECT_EQ(g.dparams.at("wq").view().shape, (std::array<int64_t, 4>{1, 1, GetParam().A, GetParam().D}));
  EXPECT_EQ(g.dparams.at("w").view().shape, (std::array<int64_t, 4>{1, 1, 1, GetParam().A}));
  testing::expect_matches_finite_differences(l, s.wq, g.dparams.at("wq"), "dwq");
  testing::expect_matches_finite_differences(l, s.wk, g.dparams.at("wk"), "dwk");
  testing::expect_matches_finite_differences(l, s.w, g.dparams.at("w"), "dw");
}

void expect_same_bits(const Tensor& a, const Tensor& b, const std::string& name) {
  ASSERT_EQ(a.view().numel(), b.view().numel()) << name;
  EXPECT_EQ(0, std::memcmp(a.view().data, b.view().data, a.view().numel() * dtype_size(a.view().dtype))) << name;
}

TEST_P(ScoresBackward, ScoresFormMatchesTheReferenceInEveryDtype) {
  for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
    SCOPED_TRACE(dtype_name(dt));
    Shape sh = GetParam();
    sh.N *= 15, sh.M *= 11, sh.D = 16, sh.Dv = 12, sh.A = 7;  // several query blocks: segments of tasks
    Inputs s = make(sh, dt, 32);
    AttendOptions walk = s.o;
    EXPECT_EQ(explain_backward(s.q.view, s.k.view, s.v.view, s.m, walk).chosen, "scores");
    const AttendGradients fast = backward(s, "scores");
    const AttendGradients ref = families::reference_gradients(s.dout.view, s.q.view, s.k.view, s.v.view, s.m, s.o,
                                                              core::RefPrecision::f64);
    const AttendGradients plain = families::reference_gradients(s.dout.view, s.q.view, s.k.view, s.v.view, s.m, s.o,
                                                                core::RefPrecision::plain);
    testing::expect_within_rule(fast.dq, ref.dq, plain.dq, "dq");
    testing::expect_within_rule(fast.dk, ref.dk, plain.dk, "dk");
    testing::expect_within_rule(fast.dv, ref.dv, plain.dv, "dv");
    ASSERT_EQ(fast.dparams.size(), ref.dparams.size());
    for (const auto& [name, t] : ref.dparams)
      testing::expect_within_rule(fast.dparams.at(name), t, plain.dparams.at(name), name.c_str());
    for (int threads : {1, 3}) {
      const AttendGradients t = backward(s, "scores", threads);
      expect_same_bits(t.dq, fast.dq, "dq");
      expect_same_bits(t.dk, fast.dk, "dk");
      expect_same_bits(t.dv, fast.dv, "dv");
      for (const auto& [name, d] : fast.dparams) expect_same_bits(t.dparams.at(name), d, name);
    }
  }
}

std::string name_of(const ::testing::TestParamInfo<Shape>& info) {
  return testing::param_name(info.index, info.param.mech);
}

INSTANTIATE_TEST_SUITE_P(Softmax, ScoresBackward, ::testing::ValuesIn(shapes()), name_of);

// Keys past the valid length get zero gradients and contribute nothing to the params' gradients: a
// NaN there changes no bit of any gradient.
TEST(ScoresBackwardShape, NaNPastTheValidKeysChangesNothing) {
  for (const char* m : {"softmax:score=cosine,causal", "softmax:score=additive"}) {
    SCOPED_TRACE(m);
    Shape sh{m};
    sh.B = 2, sh.padding = true, sh.N = sh.M = 40;
    Inputs s = make(sh, DType::f32, 7);
    const AttendGradients clean = backward(s, "scores");
    for (int64_t j = 20; j < 40; ++j) {
      testing::fill_token(s.k.view, 1, 0, j, testing::nan_f());
      testing::fill_token(s.v.view, 1, 0, j, testing::nan_f());
    }
    const AttendGradients poisoned = backward(s, "scores");
    expect_same_bits(clean.dq, poisoned.dq, "dq");
    expect_same_bits(clean.dk, poisoned.dk, "dk");
    expect_same_bits(clean.dv, poisoned.dv, "dv");
    for (const auto& [name, d] : clean.dparams) expect_same_bits(poisoned.dparams.at(name), d, name);
    for (int64_t c = 0; c < sh.D; ++c) EXPECT_EQ(clean.dk.at(1, 0, 30, c), 0.0f);
  }
}

// A zero query or key: its norm is clamped (the forward's 1e-30 on the squared norm), the score 0
// and linear in the vector there (a gradient of order 1e15: the clamp's 1 / 1e-15); the gradients
// stay finite and equal the reference's.
TEST(ScoresBackwardShape, ZeroVectorsGiveFiniteGradients) {
  Shape sh{"softmax:score=cosine"};
  Inputs s = make(sh, DType::f32, 9);
  testing::fill_token(s.q.view, 0, 1, 2, 0.0f);
  testing::fill_token(s.k.view, 0, 0, 3, 0.0f);
  const AttendGradients fast = backward(s, "scores"), ref = backward(s, "reference");
  for (const auto* pair : {&fast.dq, &fast.dk}) {
    const TensorView& t = pair->view();
    for (int64_t e = 0; e < t.numel(); ++e) EXPECT_TRUE(std::isfinite(load_as_float(t.data, t.dtype, e)));
  }
  for (auto [a, b] : {std::pair{&fast.dq, &ref.dq}, {&fast.dk, &ref.dk}, {&fast.dv, &ref.dv}})
    for (int64_t e = 0; e < a->view().numel(); ++e) {
      const double want = load_as_float(b->view().data, DType::f32, e);
      EXPECT_NEAR(load_as_float(a->view().data, DType::f32, e), want, 1e-5 * std::max(1.0, std::abs(want)));
    }
}

// The tile and row forms take dot scores only, and say so; the scores form takes no dot score.
TEST(ScoresBackwardShape, FormsSayWhichScoresTheyTake) {
  Shape sh{"softmax:score=additive"};
  const Inputs s = make(sh, DType::f32, 3);
  const Explanation e = explain_backward(s.q.view, s.k.view, s.v.view, s.m, s.o);
  EXPECT_EQ(e.chosen, "scores");
  for (const FormVerdict& f : e.forms) {
    if (f.form == "scores" || f.form == "reference") {
      EXPECT_TRUE(f.reasons.empty()) << f.form;
    } else {
      ASSERT_FALSE(f.reasons.empty()) << f.form;
      EXPECT_NE(f.reasons.back().find("score=additive (dot only"), std::string::npos) << f.reasons.back();
    }
  }
  Shape dot{"softmax"};
  const Inputs d = make(dot, DType::f32, 3);
  AttendOptions forced;
  forced.form = "scores";
  testing::expect_error([&] { explain_backward(d.q.view, d.k.view, d.v.view, d.m, forced); },
                        "score=dot (the tiled and rows forms take it)");
}

}  // namespace
}  // namespace attn
