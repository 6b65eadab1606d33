// qsoftmax's backward: the float64 reference against central finite differences of the float64
// forward reference (causal or not, a scale, grouped heads, padding, more keys than queries, the
// initial state's gradient and the final state's), the fast forms against the reference under the
// 3x-plain rule in every dtype on odd sizes and bitwise the same on 1 and 3 threads, a sequence
// split into two calls (the state carried, its gradient carried back) equal to one call, and the
// forms' walk. The case list's backward mode checks the fast forms on every ISA.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "attn/attn.hpp"
#include "families/internal_api.hpp"
#include "qsoftmax/qsoftmax.hpp"
#include "support/expect_error.hpp"
#include "support/gradient_checks.hpp"
#include "support/random_inputs.hpp"

namespace attn {
namespace {

using testing::Buffer;
using testing::random_tensor;

struct Shape {
  std::string mech;
  int64_t B = 1, H = 2, Hkv = 1, N = 6, M = 6, D = 5, Dv = 3;
  bool padding = false, initial = false, dfinal = false;
};

struct Inputs {
  Shape sh;
  Buffer q, k, v, dout;
  std::vector<float> state, dstate;  // (B, H, D, Dv)
  AttendOptions o;
  Mechanism m;
};

Inputs make(const Shape& sh, DType dt, uint32_t seed, float magnitude = 1.0f) {
  std::mt19937 rng(seed);
  Inputs s;
  s.sh = sh;
  s.q = random_tensor(rng, dt, sh.B, sh.H, sh.N, sh.D, Layout::bhnd, magnitude);
  s.k = random_tensor(rng, dt, sh.B, sh.Hkv, sh.M, sh.D);
  s.v = random_tensor(rng, dt, sh.B, sh.Hkv, sh.M, sh.Dv);
  s.dout = random_tensor(rng, dt, sh.B, sh.H, sh.N, sh.Dv);
  s.m = parse_mechanism(sh.mech);
  if (sh.padding) {
    s.o.key_padding_lengths.assign(static_cast<size_t>(sh.B), sh.M);
    s.o.key_padding_lengths.back() = sh.M / 2;
  }
  std::normal_distribution<float> nd;
  const size_t n = static_cast<size_t>(sh.B * sh.H * sh.D * sh.Dv);
  if (sh.initial) {
    s.state.resize(n);
    for (float& x : s.state) x = nd(rng);
    s.o.params["initial_state"] = make_array_view(s.state.data(), DType::f32, {sh.B, sh.H, sh.D, sh.Dv});
  }
  if (sh.dfinal) {
    s.dstate.resize(n);
    for (float& x : s.dstate) x = nd(rng);
  }
  return s;
}

TensorView dstate_view(Inputs& s) { return make_view(s.dstate.data(), DType::f32, s.sh.B, s.sh.H, s.sh.D, s.sh.Dv); }

AttendGradients backward(Inputs& s, const std::string& form, int threads = 0) {
  const AttendResult fwd = attend(s.q.view, s.k.view, s.v.view, s.m, s.o);
  AttendOptions bo = s.o;
  bo.form = form;
  bo.threads = threads;
  const TensorView ds = s.dstate.empty() ? TensorView{} : dstate_view(s);
  return attend_backward(s.dout.view, s.q.view, s.k.view, s.v.view, fwd.out.view(), TensorView{}, s.m, bo, nullptr,
                         s.dstate.empty() ? nullptr : &ds);
}

// sum dout . out + sum dS . final_state of the float64 forward reference.
double loss(const Inputs& s) {
  AttendOptions o = s.o;
  o.return_final_state = true;
  const core::ReferenceResult r = families::reference_outputs(s.q.view, s.k.view, s.v.view, s.m, o, core::RefPrecision::f64);
  double l = testing::dot_with_output(s.dout.view, r);
  for (size_t e = 0; e < s.dstate.size(); ++e) l += static_cast<double>(s.dstate[e]) * r.state[e];
  return l;
}

// Central differences of the loss in each of the n float32 values at data, against grad.
void expect_state_gradient(Inputs& s, std::vector<float>& x, const Tensor& grad) {
  ASSERT_EQ(grad.view().numel(), static_cast<int64_t>(x.size()));
  double worst = 0, largest = 0;
  for (size_t e = 0; e < x.size(); ++e) {
    const float x0 = x[e];
    x[e] = x0 + 1e-2f;
    const double up = loss(s);
    x[e] = x0 - 1e-2f;
    const double down = loss(s);
    x[e] = x0;
    const double fd = (up - down) / ((x0 + 1e-2f) - static_cast<double>(x0 - 1e-2f));
    worst = std::max(worst, std::abs(fd - load_as_float(grad.view().data, DType::f32, static_cast<int64_t>(e))));
    largest = std::max(largest, std::abs(fd));
  }
  EXPECT_LE(worst, 1e-3 * std::max(1.0, largest)) << "d_initial_state: max |finite difference - gradient| = " << worst;
  EXPECT_GT(largest, 1e-3);
}

const std::vector<Shape>& shapes() {
  static const std::vector<Shape> list = {
      {"qsoftmax"},
      {"qsoftmax:causal"},
      {"qsoftmax:scale=0.7", 1, 2, 1, 4, 9},                                 // more keys than queries
      {"qsoftmax:causal,scale=2", 1, 4, 2, 7, 7},                            // grouped heads
      {"qsoftmax:causal", 2, 2, 1, 8, 8, 5, 3, true, true, true},            // padding, both states
      {"qsoftmax", 2, 2, 2, 5, 8, 4, 6, true, true, true},
      {"qsoftmax:causal", 1, 2, 1, 1, 1, 5, 3, false, true, true},           // one token against a state
  };
  return list;
}

class QSoftmaxBackward : public ::testing::TestWithParam<Shape> {};

TEST_P(QSoftmaxBackward, ReferenceMatchesFiniteDifferences) {
  Inputs s = make(GetParam(), DType::f32, 41);
  const AttendGradients g = backward(s, "reference");
  const auto l = [&] { return loss(s); };
  testing::expect_matches_finite_differences(l, s.q, g.dq, "dq");
  testing::expect_matches_finite_differences(l, s.k, g.dk, "dk");
  testing::expect_matches_finite_differences(l, s.v, g.dv, "dv");
  if (GetParam().initial)
    expect_state_gradient(s, s.state, g.d_initial_state);
  else
    EXPECT_TRUE(g.d_initial_state.view().empty());
}

// The reference into float32 tensors, in float64 or plain precision.
AttendGradients reference_f32(Inputs& s, core::RefPrecision precision) {
  const qsoftmax::QSoftmaxProblem p =
      qsoftmax::QSoftmaxFamily::validate(s.q.view, s.k.view, s.v.view, std::get<QSoftmax>(s.m), s.o, core::Outputs{});
  AttendGradients g;
  g.dq = Tensor(DType::f32, {p.B, p.H, p.N, p.D});
  g.dk = Tensor(DType::f32, {p.B, p.Hkv, p.M, p.D});
  g.dv = Tensor(DType::f32, {p.B, p.Hkv, p.M, p.Dv});
  core::BackwardViews views{s.dout.view, {}, {}, g.dq.view(), g.dk.view(), g.dv.view(), {}};
  if (!s.dstate.empty()) views.dfinal_state = dstate_view(s);
  if (p.initial) {
    g.d_initial_state = Tensor(DType::f32, {p.B, p.H, p.D, p.Dv});
    views.d_initial_state = g.d_initial_state.view();
  }
  qsoftmax::QSoftmaxFamily::backward_reference(p, views, precision);
  return g;
}

void expect_same_bits(const Tensor& a, const Tensor& b, const char* name) {
  ASSERT_EQ(a.view().numel(), b.view().numel()) << name;
  EXPECT_EQ(0, std::memcmp(a.view().data, b.view().data, a.view().numel() * dtype_size(a.view().dtype))) << name;
}

bool causal(const Shape& sh) { return sh.mech.find("causal") != std::string::npos; }

// The rule of testing::expect_within_rule plus, for half storage, the fast form's rounding of its
// result to that dtype, 2 max |round(ref) - ref| (the case list's floor): with one token the plain
// baseline sums too little to cover it.
void expect_within_stored_rule(const Tensor& fast, const Tensor& ref, const Tensor& plain, const char* name) {
  const TensorView &a = fast.view(), &r = ref.view(), &pl = plain.view();
  double largest = 0, plain_err = 0, err = 0, stored = 0;
  for (int64_t e = 0; e < r.numel(); ++e) {
    const double want = load_as_float(r.data, r.dtype, e);
    largest = std::max(largest, std::abs(want));
    plain_err = std::max(plain_err, std::abs(double(load_as_float(pl.data, pl.dtype, e)) - want));
    err = std::max(err, std::abs(double(load_as_float(a.data, a.dtype, e)) - want));
    stored = std::max(stored, std::abs(double(round_to(a.dtype, static_cast<float>(want))) - want));
  }
  EXPECT_LE(err, 3 * plain_err + 1e-5 * std::max(1.0, largest) + 2 * stored) << name << " (plain " << plain_err << ")";
}

TEST_P(QSoftmaxBackward, FastFormMatchesTheReferenceInEveryDtype) {
  for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
    SCOPED_TRACE(dtype_name(dt));
    Shape sh = GetParam();
    if (sh.N > 1) sh.N = causal(sh) ? 131 : 67, sh.M = causal(sh) ? 131 : 93;  // odd sizes, several row blocks
    sh.D = 11, sh.Dv = 7;
    Inputs s = make(sh, dt, 42, 3.0f);
    const std::string form = causal(sh) ? "recurrent" : "right";
    const AttendGradients fast = backward(s, form), ref = reference_f32(s, core::RefPrecision::f64),
                          plain = reference_f32(s, core::RefPrecision::plain);
    expect_within_stored_rule(fast.dq, ref.dq, plain.dq, "dq");
    expect_within_stored_rule(fast.dk, ref.dk, plain.dk, "dk");
    expect_within_stored_rule(fast.dv, ref.dv, plain.dv, "dv");
    if (sh.initial) expect_within_stored_rule(fast.d_initial_state, ref.d_initial_state, plain.d_initial_state, "dS0");
    for (int threads : {1, 3}) {
      const AttendGradients t = backward(s, form, threads);
      expect_same_bits(t.dq, fast.dq, "dq");
      expect_same_bits(t.dk, fast.dk, "dk");
      expect_same_bits(t.dv, fast.dv, "dv");
      if (sh.initial) expect_same_bits(t.d_initial_state, fast.d_initial_state, "d_initial_state");
    }
  }
}

std::string name_of(const ::testing::TestParamInfo<Shape>& info) {
  return testing::param_name(info.index, info.param.mech);
}

INSTANTIATE_TEST_SUITE_P(QSoftmax, QSoftmaxBackward, ::testing::ValuesIn(shapes()), name_of);

// A causal sequence split into two calls (the second starts from the first's final state) has the
// gradients of one call: the second call's d_initial_state, fed to the first as the final state's
// gradient, carries the later rows' gradient back.
TEST(QSoftmaxBackwardShape, TwoCallsWithTheStateCarriedEqualOneCall) {
  const int64_t B = 1, H = 2, N = 40, cut = 17, D = 6, Dv = 5;
  Inputs whole = make({"qsoftmax:causal", B, H, 1, N, N, D, Dv}, DType::f32, 43);
  const AttendGradients one = backward(whole, "recurrent");
  auto slice = [&](const Buffer& x, int64_t n0, int64_t n) {  // tokens [n0, n0 + n) of a copy
    Buffer s = x;
    s.view.data = s.bytes.data();  // random_tensor's views start at their bytes
    s.view.data = s.view.ptr(0, 0, n0);
    s.view.shape[2] = n;
    return s;
  };
  Inputs first = whole, second = whole;
  for (auto [part, n0, n] : {std::tuple{&first, int64_t{0}, cut}, {&second, cut, N - cut}}) {
    part->q = slice(whole.q, n0, n), part->k = slice(whole.k, n0, n), part->v = slice(whole.v, n0, n);
    part->dout = slice(whole.dout, n0, n);
  }
  AttendOptions fo;
  fo.return_final_state = true;
  const AttendResult f1 = attend(first.q.view, first.k.view, first.v.view, first.m, fo);
  std::vector<float> state(static_cast<size_t>(B * H * D * Dv));
  for (int64_t e = 0; e < static_cast<int64_t>(state.size()); ++e) state[static_cast<size_t>(e)] = load_as_float(f1.final_state.view().data, DType::f32, e);
  second.o.params["initial_state"] = make_array_view(state.data(), DType::f32, {B, H, D, Dv});
  const AttendGradients g2 = backward(second, "recurrent");
  first.dstate.resize(state.size());
  std::memcpy(first.dstate.data(), g2.d_initial_state.view().data, state.size() * sizeof(float));
  first.sh.D = D, first.sh.Dv = Dv;
  const AttendGradients g1 = backward(first, "recurrent");
  for (int64_t h = 0; h < H; ++h)
    for (int64_t i = 0; i < N; ++i) {
      const AttendGradients& g = i < cut ? g1 : g2;
      const int64_t r = i < cut ? i : i - cut;
      for (int64_t c = 0; c < D; ++c) EXPECT_NEAR(g.dq.at(0, h, r, c), one.dq.at(0, h, i, c), 1e-5) << h << " " << i;
      if (h == 0) {
        for (int64_t c = 0; c < D; ++c) EXPECT_NEAR(g.dk.at(0, 0, r, c), one.dk.at(0, 0, i, c), 1e-5) << i;
        for (int64_t c = 0; c < Dv; ++c) EXPECT_NEAR(g.dv.at(0, 0, r, c), one.dv.at(0, 0, i, c), 1e-5) << i;
      }
    }
}

TEST(QSoftmaxBackwardShape, FormsAndWhatItTakes) {
  Inputs s = make({"qsoftmax:causal"}, DType::f32, 44);
  EXPECT_EQ(explain_backward(s.q.view, s.k.view, s.v.view, s.m).chosen, "recurrent");
  EXPECT_EQ(explain_backward(s.q.view, s.k.view, s.v.view, parse_mechanism("qsoftmax")).chosen, "right");
  EXPECT_TRUE(families::backward_refusal(s.q.view, s.k.view, s.v.view, s.m, s.o).empty());
  AttendOptions right = s.o;
  right.form = "right";
  testing::expect_error([&] { explain_backward(s.q.view, s.k.view, s.v.view, s.m, right); },
                        "causal (each query reads the state up to its own key: recurrent)");
  const AttendResult fwd = attend(s.q.view, s.k.view, s.v.view, s.m, s.o);
  testing::expect_error([&] {
    attend_backward(s.dout.view, s.q.view, s.k.view, s.v.view, fwd.out.view(), fwd.out.view(), s.m, s.o);
  }, "lse does not apply to qsoftmax");
  std::vector<float> wrong(static_cast<size_t>(2 * 5 * 3));
  const TensorView ds = make_view(wrong.data(), DType::f32, 1, 1, 10, 3);
  testing::expect_error([&] {
    attend_backward(s.dout.view, s.q.view, s.k.view, s.v.view, fwd.out.view(), TensorView{}, s.m, s.o, nullptr, &ds);
  }, "dfinal_state must have the final state's shape (B, H, state_rows, state_cols) = (1, 2, 5, 3), got (1, 1, 10, 3)");
  bool has_gradient = false;
  for (const ParamInfo& p : info(s.m).params) has_gradient |= p.name == "initial_state" && p.gradient;
  EXPECT_TRUE(has_gradient) << "attn::info says initial_state gets a gradient";
}

}  // namespace
}  // namespace attn
