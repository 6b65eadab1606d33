// The linear family's backward: the float64 reference against central finite differences of the
// float64 forward reference (tiny shapes: every feature map, normalised or not, causal or not,
// decays, padding, grouped heads, scale, the initial state and the final state's gradient), the
// fast forms against the reference under the 3x-plain rule in float32 and half storage, thread
// count independence, and bad input.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <stdexcept>
#include <variant>

#include "attn/attn.hpp"
#include "families/internal_api.hpp"
#include "linear/linear_backward.hpp"
#include "support/expect_error.hpp"
#include "support/gradient_checks.hpp"
#include "support/random_inputs.hpp"

namespace attn {
namespace {

using testing::Buffer;
using testing::random_tensor;
using testing::expect_within_rule;

struct Problem {
  std::string mech;
  int64_t B = 1, H = 2, Hkv = 1, N = 6, M = 6, D = 4, Dv = 3;
  DType dtype = DType::f32;
  bool padding = false, initial = false, dfinal = false, head_decay = false;
  bool learned = false;  // polaformer: params power (D) and coefficients (Dv), their gradients checked
};

struct Inputs {
  Problem pr;
  Buffer q, k, v, dout;
  std::vector<float> state, dstate, decay;  // initial state, the final state's gradient (B, H, F, cols)
  std::vector<float> power, coef;           // polaformer's learned params
  int64_t F = 0, cols = 0;
  AttendOptions o;
  Mechanism m;
};

linear::LinearProblem validated(const Inputs& s) {
  return std::visit(
      [&](const auto& m) -> linear::LinearProblem {
        if constexpr (requires { linear::LinearFamily::validate(s.q.view, s.k.view, s.v.view, m, s.o, core::Outputs{}); })
          return linear::LinearFamily::validate(s.q.view, s.k.view, s.v.view, m, s.o, core::Outputs{});
        else
          throw std::logic_error("not a linear mechanism");
      },
      s.m);
}

Inputs make(const Problem& pr, uint32_t seed) {
  std::mt19937 rng(seed);
  Inputs s;
  s.pr = pr;
  s.q = random_tensor(rng, pr.dtype, pr.B, pr.H, pr.N, pr.D);
  s.k = random_tensor(rng, pr.dtype, pr.B, pr.Hkv, pr.M, pr.D);
  s.v = random_tensor(rng, pr.dtype, pr.B, pr.Hkv, pr.M, pr.Dv);
  s.dout = random_tensor(rng, pr.dtype, pr.B, pr.H, pr.N, pr.Dv);
  s.m = parse_mechanism(pr.mech);
  if (pr.padding) {
    s.o.key_padding_lengths.assign(static_cast<size_t>(pr.B), pr.M);
    s.o.key_padding_lengths.back() = pr.M / 2;
  }
  if (pr.head_decay) {
    for (int64_t h = 0; h < pr.H; ++h) s.decay.push_back(0.95f - 0.1f * static_cast<float>(h));
    s.o.params["decay"] = make_array_view(s.decay.data(), DType::f32, {pr.H});
  }
  if (pr.learned) {
    std::uniform_real_distribution<float> up(1.5f, 3.0f);
    std::normal_distribution<float> nd;
    for (int64_t c = 0; c < pr.D; ++c) s.power.push_back(up(rng));
    for (int64_t c = 0; c < pr.Dv; ++c) s.coef.push_back(nd(rng));
    s.o.params["power"] = make_array_view(s.power.data(), DType::f32, {pr.D});
    s.o.params["coefficients"] = make_array_view(s.coef.data(), DType::f32, {pr.Dv});
  }
  const auto shape = linear::LinearFamily::state_shape(validated(s));
  s.F = shape[2], s.cols = shape[3];
  std::uniform_real_distribution<float> ud(0.1f, 1.0f);  // positive: denominators stay away from 0
  if (pr.initial) {
    s.state.resize(static_cast<size_t>(pr.B * pr.H * s.F * s.cols));
    for (auto& x : s.state) x = ud(rng);
    s.o.params["initial_state"] = make_array_view(s.state.data(), DType::f32, {pr.B, pr.H, s.F, s.cols});
  }
  if (pr.dfinal) {
    std::normal_distribution<float> nd;
    s.dstate.resize(static_cast<size_t>(pr.B * pr.H * s.F * s.cols));
    for (auto& x : s.dstate) x = nd(rng);
  }
  return s;
}

TensorView dstate_view(Inputs& s) {
  return make_view(s.dstate.data(), DType::f32, s.pr.B, s.pr.H, s.F, s.cols);
}

// L = sum dout . out + sum dS . final_state of the float64 forward reference.
double loss(const Inputs& s) {
  AttendOptions o = s.o;
  o.return_final_state = true;
  const auto r = families::reference_outputs(s.q.view, s.k.view, s.v.view, s.m, o, core::RefPrecision::f64);
  double l = testing::dot_with_output(s.dout.view, r);
  for (size_t e = 0; e < s.dstate.size(); ++e) l += static_cast<double>(s.dstate[e]) * r.state[e];
  return l;
}

AttendGradients backward(Inputs& s, const std::string& form, int threads = 0) {
  const AttendResult fwd = attend(s.q.view, s.k.view, s.v.view, s.m, s.o);
  AttendOptions bo = s.o;
  bo.form = form;
  bo.threads = threads;
  TensorView ds = s.dstate.empty() ? TensorView{} : dstate_view(s);
  return attend_backward(s.dout.view, s.q.view, s.k.view, s.v.view, fwd.out.view(), TensorView{}, s.m, bo, nullptr,
                         s.dstate.empty() ? nullptr : &ds);
}

// Central differences of L in every element of x (n values at data, float32), against grad.
// kinked: skip elements within a step of 0, where relu and relu2 have a kink (the difference
// there is not the derivative on either side).
void expect_matches_finite_differences(Inputs& s, float* data, int64_t n, DType dt, const Tensor& grad, const char* name,
                                       bool kinked = false) {
  ASSERT_EQ(grad.view().numel(), n) << name;
  double worst = 0, largest = 0;
  for (int64_t e = 0; e < n; ++e) {
    const float x0 = load_as_float(data, dt, e);
    if (kinked && std::abs(x0) < 2e-2f) continue;
    const float up = x0 + 1e-2f, down = x0 - 1e-2f;
    store_from_float(data, dt, e, up);
    const double lu = loss(s);
    store_from_float(data, dt, e, down);
    const double ld = loss(s);
    store_from_float(data, dt, e, x0);
    const double fd = (lu - ld) / (static_cast<double>(up) - down);
    const double got = load_as_float(grad.view().data, grad.view().dtype, e);
    worst = std::max(worst, std::abs(fd - got));
    largest = std::max(largest, std::abs(fd));
  }
  // second-order error of a 1e-2 step on unit-scale inputs
  EXPECT_LE(worst, 2e-3 * std::max(1.0, largest)) << name << ": max |finite difference - gradient| = " << worst;
  EXPECT_GT(largest, 1e-3) << name << ": a gradient that is all zeros checks nothing";
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
    add("linear", none);
    add("linear:causal", none);
    add("linear:map=relu,causal", none);
    add("linear:map=identity,normalize=0", none);
    add("linear:map=exp,causal,scale=0.5", none);
    add("linear:map=relu2,normalize=0,causal", none);
    add("linear:causal,decay=0.8,chunk=4", none);
    add("retention:decay=0.9,chunk=2", [](Problem& p) { p.initial = true, p.dfinal = true; });
    add("linear:causal,chunk=4", [](Problem& p) { p.head_decay = true, p.initial = true, p.dfinal = true; });
    add("linear:causal,chunk=4", [](Problem& p) { p.padding = true, p.B = 2, p.dfinal = true, p.initial = true; });
    add("linear", [](Problem& p) { p.padding = true, p.B = 2, p.N = 4, p.dfinal = true, p.initial = true; });
    add("linear:causal,chunk=4", [](Problem& p) { p.H = 4, p.Hkv = 2; });  // GQA
    add("linear:map=identity,normalize=0,causal,chunk=3", [](Problem& p) { p.N = p.M = 1, p.initial = true, p.dfinal = true; });
    add("sana:causal", [](Problem& p) { p.initial = true; });
    add("normattn:causal,chunk=4", [](Problem& p) { p.initial = true, p.dfinal = true; });
    add("normattn:norm=layer,map=relu2", none);
    // performer: random features (F != D), the keys' shift differentiated, the queries' a constant
    add("performer:features=8", none);
    add("performer:features=3,causal,chunk=4", [](Problem& p) { p.initial = true, p.dfinal = true; });
    add("performer:features=8,causal,chunk=4", [](Problem& p) { p.H = 4, p.Hkv = 2, p.head_decay = true; });
    add("performer:features=8,causal,chunk=4", [](Problem& p) { p.padding = true, p.B = 2, p.dfinal = true; });
    add("performer:features=12,seed=3", [](Problem& p) { p.padding = true, p.B = 2, p.N = 4, p.initial = true; });
    // polaformer: two streams (even Dv), per-channel powers, coefficients
    add("polaformer", [](Problem& p) { p.Dv = 4; });
    add("polaformer:power=2.5,causal,chunk=4", [](Problem& p) { p.Dv = 4, p.initial = true, p.dfinal = true; });
    add("polaformer:causal,chunk=4", [](Problem& p) { p.Dv = 4, p.learned = true, p.H = 4, p.Hkv = 2; });
    add("polaformer", [](Problem& p) { p.Dv = 4, p.learned = true, p.padding = true, p.B = 2, p.dfinal = true; });
    return v;
  }();
  return list;
}

bool is_causal(const std::string& mech) {
  return mech.find("causal") != std::string::npos || mech.rfind("retention", 0) == 0;
}

class LinearBackward : public ::testing::TestWithParam<Problem> {};

TEST_P(LinearBackward, ReferenceMatchesFiniteDifferences) {
  Inputs s = make(GetParam(), 21);
  const AttendGradients g = backward(s, "reference");
  expect_matches_finite_differences(s, static_cast<float*>(s.q.view.data), s.q.view.numel(), s.q.view.dtype, g.dq, "dq", true);
  expect_matches_finite_differences(s, static_cast<float*>(s.k.view.data), s.k.view.numel(), s.k.view.dtype, g.dk, "dk", true);
  expect_matches_finite_differences(s, static_cast<float*>(s.v.view.data), s.v.view.numel(), s.v.view.dtype, g.dv, "dv");
  if (GetParam().initial)
    expect_matches_finite_differences(s, s.state.data(), static_cast<int64_t>(s.state.size()), DType::f32,
                                      g.d_initial_state, "d_initial_state");
  else
    EXPECT_TRUE(g.d_initial_state.view().empty());
  if (GetParam().learned) {
    ASSERT_EQ(g.dparams.size(), 2u);
    expect_matches_finite_differences(s, s.power.data(), GetParam().D, DType::f32, g.dparams.at("power"), "dpower");
    expect_matches_finite_differences(s, s.coef.data(), GetParam().Dv, DType::f32, g.dparams.at("coefficients"),
                                      "dcoefficients");
  } else {
    EXPECT_TRUE(g.dparams.empty());
  }
}


// The reference in float32 views, float64 or plain (intermediates rounded to the storage dtype).
AttendGradients reference_f32(Inputs& s, core::RefPrecision precision) {
  const linear::LinearProblem p = validated(s);
  AttendGradients g;
  g.dq = Tensor(DType::f32, {p.B, p.H, p.N, p.D});
  g.dk = Tensor(DType::f32, {p.B, p.Hkv, p.M, p.D});
  g.dv = Tensor(DType::f32, {p.B, p.Hkv, p.M, p.Dv});
  core::BackwardViews views{s.dout.view, {}, {}, g.dq.view(), g.dk.view(), g.dv.view(), {}};
  if (!s.dstate.empty()) views.dfinal_state = dstate_view(s);
  if (p.initial) {
    g.d_initial_state = Tensor(DType::f32, {p.B, p.H, s.F, s.cols});
    views.d_initial_state = g.d_initial_state.view();
  }
  core::allocate_dparams<linear::LinearFamily>(p, g.dparams, views);
  linear::linear_backward_reference(p, views, precision);
  return g;
}

void expect_same_bits(const Tensor& a, const Tensor& b, const char* name) {
  ASSERT_EQ(a.view().numel(), b.view().numel()) << name;
  EXPECT_EQ(0, std::memcmp(a.view().data, b.view().data, a.view().numel() * dtype_size(a.view().dtype))) << name;
}

TEST_P(LinearBackward, FastFormMatchesTheReferenceInEveryDtype) {
  for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
    SCOPED_TRACE(dtype_name(dt));
    Problem pr = GetParam();
    pr.dtype = dt;
    if (pr.N > 1) pr.N = pr.M = 37;  // several chunks and a ragged last one
    if (!is_causal(pr.mech)) pr.N = 29;
    pr.D = 8, pr.Dv = pr.mech.rfind("polaformer", 0) == 0 ? 6 : 5;  // polaformer: an even Dv
    Inputs s = make(pr, 22);
    const std::string form = is_causal(pr.mech) ? "chunked" : "right";
    const AttendGradients fast = backward(s, form), ref = reference_f32(s, core::RefPrecision::f64),
                          plain = reference_f32(s, core::RefPrecision::plain);
    expect_within_rule(fast.dq, ref.dq, plain.dq, "dq");
    expect_within_rule(fast.dk, ref.dk, plain.dk, "dk");
    expect_within_rule(fast.dv, ref.dv, plain.dv, "dv");
    if (pr.initial) expect_within_rule(fast.d_initial_state, ref.d_initial_state, plain.d_initial_state, "d_initial_state");
    for (const auto& [name, t] : ref.dparams)
      expect_within_rule(fast.dparams.at(name), t, plain.dparams.at(name), name.c_str());
    for (int threads : {1, 3}) {  // bitwise the same for any thread count
      const AttendGradients t = backward(s, form, threads);
      expect_same_bits(t.dq, fast.dq, "dq");
      expect_same_bits(t.dk, fast.dk, "dk");
      expect_same_bits(t.dv, fast.dv, "dv");
      if (pr.initial) expect_same_bits(t.d_initial_state, fast.d_initial_state, "d_initial_state");
      for (const auto& [name, d] : fast.dparams) expect_same_bits(t.dparams.at(name), d, name.c_str());
    }
  }
}

std::string name_of(const ::testing::TestParamInfo<Problem>& info) {
  return testing::param_name(info.index, info.param.mech);
}

INSTANTIATE_TEST_SUITE_P(Linear, LinearBackward, ::testing::ValuesIn(problems()), name_of);

TEST(LinearBackwardShape, PaddedKeysGetZeroGradientAndNaNPropagates) {
  Problem pr;
  pr.mech = "linear:causal,chunk=4";
  pr.B = 2, pr.N = pr.M = 9, pr.padding = true;  // batch 1 has 4 valid keys
  Inputs s = make(pr, 3);
  for (const char* form : {"chunked", "reference"}) {
    const AttendGradients g = backward(s, form);
    for (int64_t j = 4; j < 9; ++j)
      for (int64_t c = 0; c < pr.D; ++c) EXPECT_EQ(g.dk.at(1, 0, j, c), 0.0f) << form;
    for (int64_t c = 0; c < pr.Dv; ++c) EXPECT_EQ(g.dv.at(1, 0, 8, c), 0.0f) << form;
  }
  // one block of 16 holds every row: a NaN must not leak through the block's masked products
  // to rows or keys that never meet it
  pr.mech = "linear:causal,chunk=16";
  for (int poisoned = 0; poisoned < 3; ++poisoned) {  // query 5, key 6, value 6
    Inputs t = make(pr, 3);
    testing::fill_token(poisoned == 0 ? t.q.view : poisoned == 1 ? t.k.view : t.v.view, 0, 0, poisoned ? 6 : 5,
                        testing::nan_f());
    for (const char* form : {"chunked", "reference"}) {
      SCOPED_TRACE(std::string(form) + (poisoned == 0 ? ": NaN query" : poisoned == 1 ? ": NaN key" : ": NaN value"));
      const AttendGradients g = backward(t, form);
      EXPECT_TRUE(std::isnan(g.dq.at(0, 0, poisoned ? 7 : 5, 0))) << "a row that meets the NaN";
      EXPECT_TRUE(std::isnan(g.dk.at(0, 0, 2, 0))) << "a key seen with it";
      EXPECT_FALSE(std::isnan(g.dq.at(0, 0, 3, 0))) << "a row before it";
      if (poisoned == 0) {  // a NaN query: the keys after it meet it nowhere, nor do the other rows
        EXPECT_FALSE(std::isnan(g.dk.at(0, 0, 7, 0))) << "a key after it";
        EXPECT_FALSE(std::isnan(g.dv.at(0, 0, 8, 0))) << "a value after it";
        EXPECT_FALSE(std::isnan(g.dq.at(0, 0, 7, 0))) << "a row after it";
      }
      EXPECT_FALSE(std::isnan(g.dq.at(0, 1, 5, 0))) << "another head";
      EXPECT_FALSE(std::isnan(g.dq.at(1, 0, 5, 0))) << "another batch entry";
    }
  }
}

TEST(LinearBackwardShape, BadInputIsNamed) {
  Problem pr;
  pr.mech = "linear:causal";
  pr.initial = true, pr.dfinal = true, pr.Dv = 4;  // even: polaformer's two halves
  Inputs s = make(pr, 4);
  const AttendResult fwd = attend(s.q.view, s.k.view, s.v.view, s.m, s.o);
  std::vector<float> wrong(static_cast<size_t>(s.F * s.cols));
  const TensorView bad = make_view(wrong.data(), DType::f32, 1, 1, s.F, s.cols);
  testing::expect_error([&] {
    attend_backward(s.dout.view, s.q.view, s.k.view, s.v.view, fwd.out.view(), TensorView{}, s.m, s.o, nullptr, &bad);
  }, "dfinal_state must have the final state's shape (B, H, state_rows, state_cols) = (1, 2, 4, 5), got (1, 1, 4, 5)");
  testing::expect_error([&] {
    attend_backward(s.dout.view, s.q.view, s.k.view, s.v.view, fwd.out.view(), fwd.out.view(), s.m, s.o);
  }, "lse does not apply to linear");
  {
    AttendOptions o;
    const Mechanism mech = parse_mechanism("qsoftmax");
    const AttendResult f = attend(s.q.view, s.k.view, s.v.view, mech, o);
    testing::expect_error([&] {
      attend_backward(s.dout.view, s.q.view, s.k.view, s.v.view, f.out.view(), f.out.view(), mech, o);
    }, "lse does not apply to qsoftmax");
  }
  // and the softmax family does not take a final state's gradient
  Inputs t = make(Problem{"linear"}, 5);
  AttendOptions lo;
  lo.return_lse = true;
  const Mechanism soft = parse_mechanism("softmax");
  const AttendResult sf = attend(t.q.view, t.k.view, t.v.view, soft, lo);
  std::vector<float> d(static_cast<size_t>(4 * 4));
  const TensorView dv = make_view(d.data(), DType::f32, 1, 1, 4, 4);
  testing::expect_error([&] {
    attend_backward(t.dout.view, t.q.view, t.k.view, t.v.view, sf.out.view(), sf.lse.view(), soft, {}, nullptr, &dv);
  }, "dfinal_state does not apply to softmax");
}

TEST(LinearBackwardShape, ExplainListsTheForms) {
  Problem pr;
  pr.mech = "linear:causal";
  const Inputs s = make(pr, 5);
  const Explanation e = explain_backward(s.q.view, s.k.view, s.v.view, s.m);
  EXPECT_EQ(e.chosen, "chunked");
  EXPECT_EQ(explain_backward(s.q.view, s.k.view, s.v.view, parse_mechanism("linear")).chosen, "right");
  EXPECT_EQ(e.forms.back().form, "reference");
}

}  // namespace
}  // namespace attn
