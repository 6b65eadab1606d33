// The softmax family's backward: the float64 reference against central finite differences of the
// float64 forward reference (tiny shapes, every option), the fast rows form against the reference
// (float32 and half storage), thread-count independence, and bad input.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <stdexcept>
#include <variant>

#include "attn/attn.hpp"
#include "softmax/softmax_backward.hpp"
#include "families/internal_api.hpp"
#include "support/expect_error.hpp"
#include "support/gradient_checks.hpp"
#include "support/random_inputs.hpp"

namespace attn {
namespace {

using testing::Buffer;
using testing::random_tensor;

struct Problem {
  std::string mech;
  int64_t B = 1, H = 2, Hkv = 1, N = 5, M = 7, D = 4, Dv = 3;
  DType dtype = DType::f32;
  bool padding = false, mask = false, bias = false, alibi = false;
};

struct Inputs {
  Buffer q, k, v, dout;
  std::vector<uint8_t> mask;
  std::vector<float> bias;
  AttendOptions o;
  Mechanism m;
};

Inputs make(const Problem& pr, uint32_t seed) {
  std::mt19937 rng(seed);
  Inputs s;
  s.q = random_tensor(rng, pr.dtype, pr.B, pr.H, pr.N, pr.D);
  s.k = random_tensor(rng, pr.dtype, pr.B, pr.Hkv, pr.M, pr.D);
  s.v = random_tensor(rng, pr.dtype, pr.B, pr.Hkv, pr.M, pr.Dv);
  s.dout = random_tensor(rng, pr.dtype, pr.B, pr.H, pr.N, pr.Dv);
  s.m = parse_mechanism(pr.mech);
  if (pr.padding) {
    s.o.key_padding_lengths.assign(static_cast<size_t>(pr.B), pr.M);
    s.o.key_padding_lengths.back() = pr.M / 2;
  }
  if (pr.mask) {
    s.mask.resize(static_cast<size_t>(pr.B * pr.N * pr.M));
    for (auto& x : s.mask) x = (rng() % 10) < 7;
    s.o.mask = make_view(s.mask.data(), DType::boolean, pr.B, 1, pr.N, pr.M);
    s.o.mask->strides[1] = 0;
  }
  if (pr.bias) {
    s.bias.resize(static_cast<size_t>(pr.B * pr.N * pr.M));
    std::normal_distribution<float> nd;
    for (auto& x : s.bias) x = nd(rng);
    s.o.bias = make_view(s.bias.data(), DType::f32, pr.B, 1, pr.N, pr.M);
    s.o.bias->strides[1] = 0;
  }
  if (pr.alibi)
    for (int64_t h = 0; h < pr.H; ++h) s.o.alibi_slopes.push_back(std::pow(2.0f, -8.0f * (h + 1) / pr.H));
  return s;
}

// L = sum dout . out of the float64 forward reference.
double loss(const Inputs& s) { return testing::reference_loss(s); }

AttendGradients backward(const Inputs& s, const std::string& form, int threads = 0) {
  return testing::forward_then_backward(s, form, threads);
}

const std::vector<Problem>& problems() {
  static const std::vector<Problem> list = [] {
    std::vector<Problem> v;
    auto add = [&](std::string m, auto tweak) {
      Problem p;
      p.mech = std::move(m);
      tweak(p);
      v.push_back(p);
    };
    auto none = [](Problem&) {};
    add("softmax", none);
    add("softmax:causal", none);
    add("softmax:causal", [](Problem& p) { p.N = 9, p.M = 6; });  // rows before the first key
    add("softmax:window=2:1", none);
    add("softmax:causal,window=3:0,sinks=1", none);
    add("softmax:softcap=2", none);
    add("softmax:scale=0.7", none);
    add("softmax:entropy_scale=16,causal", none);
    add("softmax:dropout=0.3,seed=5", none);
    add("softmax", [](Problem& p) { p.padding = true, p.B = 2; });
    add("softmax", [](Problem& p) { p.mask = true; });
    add("softmax", [](Problem& p) { p.bias = true; });
    add("softmax:causal", [](Problem& p) { p.alibi = true; });
    add("softmax", [](Problem& p) { p.H = 4, p.Hkv = 2; });  // GQA
    add("softmax:dilation=2,window=4:4", [](Problem& p) { p.N = p.M = 8; });
    add("longformer:window=1:1,global=0;5", [](Problem& p) { p.N = p.M = 8; });
    add("bigbird:block=2,window=1,global=1,random=1,seed=3", [](Problem& p) { p.N = p.M = 8; });
    // several query blocks and key tiles in the fast forms (x5): a ragged last block, segments of
    // query blocks (one kv head), more queries than keys
    add("softmax:causal", [](Problem& p) { p.N = 30, p.M = 41; });
    add("softmax:softcap=3,dropout=0.2,seed=9", [](Problem& p) { p.H = 3, p.Hkv = 1, p.N = 27, p.M = 14; });
    add("softmax:window=9:2,sinks=2", [](Problem& p) { p.B = 2, p.padding = true, p.N = p.M = 28; });
    return v;
  }();
  return list;
}

class Backward : public ::testing::TestWithParam<Problem> {};

TEST_P(Backward, ReferenceMatchesFiniteDifferences) {
  Inputs s = make(GetParam(), 11);
  const AttendGradients g = backward(s, "reference");
  const auto l = [&] { return loss(s); };
  testing::expect_matches_finite_differences(l, s.q, g.dq, "dq");
  testing::expect_matches_finite_differences(l, s.k, g.dk, "dk");
  testing::expect_matches_finite_differences(l, s.v, g.dv, "dv");
}

// The reference in float32 views (so the comparison is not limited by the storage dtype's
// rounding) in float64 or plain precision.
AttendGradients reference_f32(const Inputs& s, core::RefPrecision precision) {
  const exact::Problem p = std::visit(
      [&](const auto& m) -> exact::Problem {
        if constexpr (requires { exact::validate_softmax(s.q.view, s.k.view, s.v.view, m, s.o, core::Outputs{}); })
          return exact::validate_softmax(s.q.view, s.k.view, s.v.view, m, s.o, core::Outputs{});
        else
          throw std::logic_error("not a softmax mechanism");
      },
      s.m);
  AttendGradients g;
  g.dq = Tensor(DType::f32, {p.B, p.H, p.N, p.D});
  g.dk = Tensor(DType::f32, {p.B, p.Hkv, p.M, p.D});
  g.dv = Tensor(DType::f32, {p.B, p.Hkv, p.M, p.Dv});
  exact::softmax_backward_reference(p, {s.dout.view, {}, {}, g.dq.view(), g.dk.view(), g.dv.view()}, precision);
  return g;
}

TEST_P(Backward, FastFormsMatchTheReferenceInEveryDtype) {
  for (DType dt : {DType::f32, DType::bf16, DType::f16})
  for (const char* form : {"tiled", "rows"}) {
    SCOPED_TRACE(dtype_name(dt) + " " + form);
    Problem pr = GetParam();
    pr.dtype = dt;
    pr.N *= 5, pr.M *= 5, pr.D = 16, pr.Dv = 12;  // longer rows than the finite differences take
    if (pr.mech.rfind("longformer", 0) == 0 || pr.mech.rfind("bigbird", 0) == 0 || pr.mech.find("dilation") != std::string::npos)
      pr.N = pr.M = 40;
    Inputs s = make(pr, 12);
    const AttendGradients fast = backward(s, form), ref = reference_f32(s, core::RefPrecision::f64),
                          plain = reference_f32(s, core::RefPrecision::plain);
    testing::expect_within_rule(fast.dq, ref.dq, plain.dq, "dq");
    testing::expect_within_rule(fast.dk, ref.dk, plain.dk, "dk");
    testing::expect_within_rule(fast.dv, ref.dv, plain.dv, "dv");
    // and bitwise the same for any thread count
    for (int threads : {1, 3}) {
      const AttendGradients t = backward(s, form, threads);
      EXPECT_EQ(0, std::memcmp(t.dq.view().data, fast.dq.view().data, fast.dq.view().numel() * dtype_size(dt)));
      EXPECT_EQ(0, std::memcmp(t.dk.view().data, fast.dk.view().data, fast.dk.view().numel() * dtype_size(dt)));
      EXPECT_EQ(0, std::memcmp(t.dv.view().data, fast.dv.view().data, fast.dv.view().numel() * dtype_size(dt)));
    }
  }
}

std::string name_of(const ::testing::TestParamInfo<Problem>& info) {
  return testing::param_name(info.index, info.param.mech);
}

INSTANTIATE_TEST_SUITE_P(Softmax, Backward, ::testing::ValuesIn(problems()), name_of);

TEST(BackwardShape, RowsWithoutKeysGetZeroGradientsAndNaNPropagates) {
  Problem pr;
  pr.mech = "softmax:causal";
  pr.N = 9, pr.M = 6;  // queries 0..2 see no key
  Inputs s = make(pr, 3);
  for (const char* form : {"tiled", "rows"}) {
    const AttendGradients g = backward(s, form);
    for (int64_t c = 0; c < pr.D; ++c) EXPECT_EQ(g.dq.at(0, 0, 1, c), 0.0f) << form;
  }
  // a NaN in dout poisons the gradients it reaches
  store_from_float(s.dout.view.data, DType::f32, s.dout.view.offset(0, 0, 8, 0), std::nanf(""));
  for (const char* form : {"tiled", "rows", "reference"}) {
    const AttendGradients n = backward(s, form);
    EXPECT_TRUE(std::isnan(n.dq.at(0, 0, 8, 0))) << form;
    EXPECT_TRUE(std::isnan(n.dv.at(0, 0, 5, 0))) << form;
    EXPECT_FALSE(std::isnan(n.dq.at(0, 1, 8, 0))) << form << ": another head";
    // and only keys the poisoned row sees: with the window, key 0 is hidden from row 8
    AttendOptions fo;
    fo.return_lse = true;
    const Mechanism w = parse_mechanism("softmax:causal,window=2:0");
    const AttendResult fwd = attend(s.q.view, s.k.view, s.v.view, w, fo);
    AttendOptions bo;
    bo.form = form;
    const AttendGradients gw =
        attend_backward(s.dout.view, s.q.view, s.k.view, s.v.view, fwd.out.view(), fwd.lse.view(), w, bo);
    EXPECT_TRUE(std::isnan(gw.dv.at(0, 0, 5, 0))) << form;
    EXPECT_FALSE(std::isnan(gw.dv.at(0, 0, 0, 0))) << form << ": a key the NaN row does not see";
    EXPECT_FALSE(std::isnan(gw.dk.at(0, 0, 0, 0))) << form << ": a key the NaN row does not see";
  }
}

// A regression test: with no query rows the tiled form walked the block mask of a query tile that
// does not exist (a read past its run table). Every form gives empty dq and zero dk, dv.
TEST(BackwardShape, NoQueriesGiveZeroGradients) {
  Problem pr;
  pr.mech = "softmax:causal";
  pr.N = 0;
  const Inputs s = make(pr, 6);
  for (const char* form : {"tiled", "rows", "reference"}) {
    const AttendGradients g = backward(s, form);
    EXPECT_EQ(g.dq.view().numel(), 0) << form;
    for (const Tensor* t : {&g.dk, &g.dv})
      for (int64_t e = 0; e < t->view().numel(); ++e) EXPECT_EQ(load_as_float(t->view().data, DType::f32, e), 0.0f) << form;
  }
}

// Keys past the valid length are never read: NaN there leaves every gradient bitwise as it was, and
// the tiled form still runs (its non-finite scan reads only valid keys).
TEST(BackwardShape, NaNPastTheValidKeysChangesNothing) {
  Problem pr;
  pr.mech = "softmax:causal,window=20:0";
  pr.B = 2, pr.padding = true, pr.N = pr.M = 90;  // batch entry 1 sees 45 keys
  Inputs s = make(pr, 7);
  const AttendGradients clean = backward(s, "tiled");
  for (int64_t j = 45; j < 90; ++j) {
    testing::fill_token(s.k.view, 1, 0, j, testing::nan_f());
    testing::fill_token(s.v.view, 1, 0, j, testing::nan_f());
  }
  AttendOptions o = s.o;
  EXPECT_EQ(explain_backward(s.q.view, s.k.view, s.v.view, s.m, o).chosen, "tiled");
  const AttendGradients poisoned = backward(s, "tiled");
  for (auto [a, b] : {std::pair{&clean.dq, &poisoned.dq}, {&clean.dk, &poisoned.dk}, {&clean.dv, &poisoned.dv}})
    EXPECT_EQ(0, std::memcmp(a->view().data, b->view().data, a->view().numel() * sizeof(float)));
}

TEST(BackwardShape, BadInputIsNamed) {
  Problem pr;
  pr.mech = "softmax";
  Inputs s = make(pr, 4);
  AttendOptions fo;
  fo.return_lse = true;
  const AttendResult fwd = attend(s.q.view, s.k.view, s.v.view, s.m, fo);
  auto call = [&](const TensorView& dout, const Mechanism& m, AttendOptions o) {
    return attend_backward(dout, s.q.view, s.k.view, s.v.view, fwd.out.view(), fwd.lse.view(), m, o);
  };
  testing::expect_error([&] { call(s.q.view, s.m, {}); }, "dout must have out's shape (B, H, N, Dv)");
  AttendOptions probs;
  probs.return_probs = true;
  testing::expect_error([&] { call(s.dout.view, s.m, probs); }, "return_probs does not apply");
  AttendOptions form;
  form.form = "fast";
  testing::expect_error([&] { call(s.dout.view, s.m, form); },
                        "attend_backward: form must be one of tiled_bf16, tiled, rows, scores, reference for softmax, got 'fast'");
  testing::expect_error([&] { call(s.dout.view, parse_mechanism("linear"), {}); }, "lse does not apply to linear");
  AttendOptions tiled;
  tiled.form = "tiled";  // cosine and additive scores are the scores form's
  testing::expect_error([&] { call(s.dout.view, parse_mechanism("softmax:score=cosine"), tiled); },
                        "score=cosine (dot only: the scores form takes it)");
  testing::expect_error([&] {
    attend_backward(s.dout.view, s.q.view, s.k.view, s.v.view, fwd.out.view(), fwd.out.view(), s.m, {});
  }, "attend_backward: lse must have shape (B, H, N, 1)");  // the forward's checks, said as the backward's
}

TEST(BackwardShape, ExplainListsTheBackwardFormsWithTheirReasons) {
  Problem pr;
  pr.mech = "softmax:causal";
  const Inputs s = make(pr, 5);
  const Explanation e = explain_backward(s.q.view, s.k.view, s.v.view, s.m);
  ASSERT_EQ(e.forms.size(), 5u);
  EXPECT_EQ(e.chosen, "tiled");  // float32 inputs: tiled_bf16, first, refuses (precision auto)
  EXPECT_EQ(e.forms.front().form, "tiled_bf16");
  EXPECT_FALSE(e.forms.front().reasons.empty());
  EXPECT_EQ(e.forms.back().form, "reference");
  AttendOptions forced;
  forced.form = "reference";
  EXPECT_EQ(explain_backward(s.q.view, s.k.view, s.v.view, s.m, forced).chosen, "reference");
  EXPECT_EQ(explain_backward(s.q.view, s.k.view, s.v.view, parse_mechanism("softmax:score=cosine")).chosen, "scores");
  EXPECT_EQ(explain_backward(s.q.view, s.k.view, s.v.view, parse_mechanism("qsoftmax")).chosen, "right");
}

}  // namespace
}  // namespace attn
