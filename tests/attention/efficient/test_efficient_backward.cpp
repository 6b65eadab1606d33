// Efficient attention's backward: the float64 reference against central finite differences of the
// float64 forward reference (dout . out + dS . final state) in q, k, v and the initial state; the
// online form against the reference under the 3x-plain rule in float32 and half storage on odd
// sizes (an initial state with an empty feature too), bitwise the same on 1 and 3 threads; keys
// past the padding length with zero gradient.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "attn/attn.hpp"
#include "families/internal_api.hpp"
#include "support/gradient_checks.hpp"
#include "support/random_inputs.hpp"

namespace attn {
namespace {

using testing::Buffer;
using testing::random_tensor;

struct Shape {
  std::string mech;
  int64_t B = 1, H = 2, Hkv = 1, N = 7, M = 9, D = 5, Dv = 3;
  bool padding = false, initial = false, final_grad = false;
};

struct Inputs {
  Shape sh;
  Buffer q, k, v, dout, dfinal;
  std::vector<float> s0;  // (B, H, D, Dv + 2): [C0 | z0 | m0]
  AttendOptions o;
  Mechanism m;
};

Inputs make(const Shape& sh, DType dt, uint32_t seed, bool empty_feature = false) {
  std::mt19937 rng(seed);
  Inputs s;
  s.sh = sh;
  s.q = random_tensor(rng, dt, sh.B, sh.H, sh.N, sh.D, Layout::bhnd, 2.0f);
  s.k = random_tensor(rng, dt, sh.B, sh.Hkv, sh.M, sh.D, Layout::bhnd, 2.0f);
  s.v = random_tensor(rng, dt, sh.B, sh.Hkv, sh.M, sh.Dv);
  s.dout = random_tensor(rng, dt, sh.B, sh.H, sh.N, sh.Dv);
  s.dfinal = random_tensor(rng, DType::f32, sh.B, sh.H, sh.D, sh.Dv + 2);
  s.m = parse_mechanism(sh.mech);
  if (sh.initial) {
    const int64_t W = sh.Dv + 2;
    s.s0.resize(static_cast<size_t>(sh.B * sh.H * sh.D * W));
    std::normal_distribution<float> n;
    std::uniform_real_distribution<float> u(0.5f, 2.0f);
    for (size_t at = 0; at < s.s0.size(); ++at) {
      const int64_t c = static_cast<int64_t>(at) % W;
      s.s0[at] = c == sh.Dv ? u(rng) : n(rng);
    }
    if (empty_feature) s.s0[static_cast<size_t>(sh.Dv)] = 0.0f;  // (0, 0, feature 0): z0 = 0
    s.o.params["initial_state"] = make_array_view(s.s0.data(), DType::f32, {sh.B, sh.H, sh.D, W});
  }
  if (sh.padding) {
    s.o.key_padding_lengths.assign(static_cast<size_t>(sh.B), sh.M);
    s.o.key_padding_lengths.back() = sh.M / 2;
  }
  return s;
}

// sum dout . out (+ dS . final state) of the float64 forward reference
double loss(const Inputs& s) {
  const core::ReferenceResult r =
      families::reference_outputs(s.q.view, s.k.view, s.v.view, s.m, s.o, core::RefPrecision::f64);
  double l = testing::dot_with_output(s.dout.view, r);
  if (s.sh.final_grad) {
    const TensorView& d = s.dfinal.view;
    for (int64_t b = 0; b < d.shape[0]; ++b)
      for (int64_t h = 0; h < d.shape[1]; ++h)
        for (int64_t f = 0; f < d.shape[2]; ++f)
          for (int64_t c = 0; c < d.shape[3]; ++c)
            l += d.at(b, h, f, c) * r.state[static_cast<size_t>(((b * d.shape[1] + h) * d.shape[2] + f) * d.shape[3] + c)];
  }
  return l;
}

AttendGradients backward(const Inputs& s, const std::string& form, int threads = 0) {
  const AttendResult fwd = attend(s.q.view, s.k.view, s.v.view, s.m, s.o);
  AttendOptions bo = s.o;
  bo.form = form;
  bo.threads = threads;
  return attend_backward(s.dout.view, s.q.view, s.k.view, s.v.view, fwd.out.view(), TensorView{}, s.m, bo, nullptr,
                         s.sh.final_grad ? &s.dfinal.view : nullptr);
}

// Central differences of loss() in every element of the initial state, against d_initial_state.
void expect_state_matches_finite_differences(Inputs& s, const Tensor& grad) {
  const int64_t W = s.sh.Dv + 2;
  double worst = 0, largest = 0;
  for (size_t at = 0; at < s.s0.size(); ++at) {
    const float x0 = s.s0[at];
    const float up = x0 + 1e-3f, down = x0 - 1e-3f;
    s.s0[at] = up;
    const double lu = loss(s);
    s.s0[at] = down;
    const double ld = loss(s);
    s.s0[at] = x0;
    const double fd = (lu - ld) / (static_cast<double>(up) - down);
    const int64_t c = static_cast<int64_t>(at) % W, f = static_cast<int64_t>(at) / W % s.sh.D,
                  h = static_cast<int64_t>(at) / W / s.sh.D % s.sh.H, b = static_cast<int64_t>(at) / W / s.sh.D / s.sh.H;
    worst = std::max(worst, std::abs(fd - grad.at(b, h, f, c)));
    largest = std::max(largest, std::abs(fd));
  }
  EXPECT_LE(worst, 1e-3 * std::max(1.0, largest)) << "d_initial_state: max |finite difference - gradient| = " << worst;
  EXPECT_GT(largest, 1e-3);
}

std::vector<Shape> shapes() {
  std::vector<Shape> v;
  v.push_back({"efficient"});
  Shape causal{"efficient:causal"};
  causal.N = causal.M = 8;
  v.push_back(causal);
  Shape gqa{"efficient:scale=0.6"};
  gqa.H = 4, gqa.Hkv = 2, gqa.N = 6, gqa.M = 10, gqa.Dv = 4, gqa.final_grad = true;
  v.push_back(gqa);
  Shape state{"efficient:causal"};  // a state passed in and one taken out, padded keys
  state.B = 2, state.N = state.M = 6, state.initial = state.final_grad = state.padding = true;
  v.push_back(state);
  Shape right{"efficient"};
  right.N = 5, right.M = 7, right.initial = right.final_grad = true;
  v.push_back(right);
  return v;
}

class EfficientBackward : public ::testing::TestWithParam<Shape> {};

TEST_P(EfficientBackward, ReferenceMatchesFiniteDifferences) {
  Inputs s = make(GetParam(), DType::f32, 51);
  const AttendGradients g = backward(s, "reference");
  auto l = [&] { return loss(s); };
  testing::expect_matches_finite_differences(l, s.q, g.dq, "dq");
  testing::expect_matches_finite_differences(l, s.k, g.dk, "dk");
  testing::expect_matches_finite_differences(l, s.v, g.dv, "dv");
  const AttendGradients fast = backward(s, "online");  // the same within float32
  testing::expect_within_rule(fast.dq, g.dq, g.dq, "dq");
  testing::expect_within_rule(fast.dk, g.dk, g.dk, "dk");
  testing::expect_within_rule(fast.dv, g.dv, g.dv, "dv");
  if (GetParam().initial) {
    ASSERT_FALSE(g.d_initial_state.view().empty());
    expect_state_matches_finite_differences(s, g.d_initial_state);
    testing::expect_within_rule(fast.d_initial_state, g.d_initial_state, g.d_initial_state, "d_initial_state");
  } else {
    EXPECT_TRUE(g.d_initial_state.view().empty());
  }
  if (GetParam().padding)
    for (int64_t j = GetParam().M / 2; j < GetParam().M; ++j)
      for (int64_t c = 0; c < GetParam().D; ++c) {
        EXPECT_EQ(fast.dk.at(1, 0, j, c), 0.0f);
        if (c < GetParam().Dv) EXPECT_EQ(fast.dv.at(1, 0, j, c), 0.0f);
      }
}

void expect_same_bits(const Tensor& a, const Tensor& b, const std::string& name) {
  ASSERT_EQ(a.view().numel(), b.view().numel()) << name;
  EXPECT_EQ(0, std::memcmp(a.view().data, b.view().data, a.view().numel() * dtype_size(a.view().dtype))) << name;
}

TEST_P(EfficientBackward, OnlineMatchesTheReferenceInEveryDtypeOnOddSizes) {
  for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
    SCOPED_TRACE(dtype_name(dt));
    Shape sh = GetParam();
    const bool causal = sh.mech.find("causal") != std::string::npos;
    sh.N = 37, sh.M = causal ? 37 : 53, sh.D = 7, sh.Dv = 5;
    Inputs s = make(sh, dt, 52, /*empty_feature=*/true);
    const AttendGradients fast = backward(s, "online", 1);
    const AttendGradients ref = backward(s, "reference", 1);
    const AttendGradients plain = families::reference_gradients(s.dout.view, s.q.view, s.k.view, s.v.view, s.m, s.o,
                                                                core::RefPrecision::plain);
    const AttendGradients ref64 = families::reference_gradients(s.dout.view, s.q.view, s.k.view, s.v.view, s.m, s.o,
                                                                core::RefPrecision::f64);
    if (!sh.final_grad) {  // reference_gradients takes no dfinal_state
      testing::expect_within_rule(fast.dq, ref64.dq, plain.dq, "dq");
      testing::expect_within_rule(fast.dk, ref64.dk, plain.dk, "dk");
      testing::expect_within_rule(fast.dv, ref64.dv, plain.dv, "dv");
    } else {  // the float64 form in q's dtype: a storage-dtype rounding floor of 1 %
      for (int w = 0; w < 3; ++w) {
        const Tensor& a = w == 0 ? fast.dq : w == 1 ? fast.dk : fast.dv;
        const Tensor& r = w == 0 ? ref.dq : w == 1 ? ref.dk : ref.dv;
        double err = 0, largest = 0;
        for (int64_t e = 0; e < r.view().numel(); ++e) {
          const double want = load_as_float(r.view().data, r.view().dtype, e);
          largest = std::max(largest, std::abs(want));
          err = std::max(err, std::abs(double(load_as_float(a.view().data, a.view().dtype, e)) - want));
        }
        EXPECT_LE(err, (dt == DType::f32 ? 1e-5 : 1e-2) * std::max(1.0, largest)) << "gradient " << w;
      }
    }
    if (sh.initial) testing::expect_within_rule(fast.d_initial_state, ref.d_initial_state, ref.d_initial_state, "ds0");
    const AttendGradients three = backward(s, "online", 3);
    expect_same_bits(fast.dq, three.dq, "dq");
    expect_same_bits(fast.dk, three.dk, "dk");
    expect_same_bits(fast.dv, three.dv, "dv");
    if (sh.initial) expect_same_bits(fast.d_initial_state, three.d_initial_state, "d_initial_state");
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, EfficientBackward, ::testing::ValuesIn(shapes()),
                         [](const auto& info) { return testing::param_name(info.index, info.param.mech); });

TEST(EfficientBackwardFacts, TheInitialStateHasAGradient) {
  const MechanismInfo i = info(parse_mechanism("efficient"));
  ASSERT_EQ(i.params.size(), 1u);
  EXPECT_EQ(i.params[0].name, "initial_state");
  EXPECT_TRUE(i.params[0].gradient);
}

}  // namespace
}  // namespace attn
