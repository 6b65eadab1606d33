// GAU's backward: the float64 reference against finite differences of the float64 forward
// reference, the tiled form against the reference under the 3x rule in every dtype and bitwise the
// same for any thread count, and what it is given and refuses.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "attn/attn.hpp"
#include "families/internal_api.hpp"
#include "gau/gau.hpp"
#include "support/expect_error.hpp"
#include "support/gradient_checks.hpp"
#include "support/random_inputs.hpp"

namespace attn {
namespace {

using testing::Buffer;
using testing::random_tensor;

struct Shape {
  std::string mech;
  int64_t B = 1, H = 2, Hkv = 1, N = 5, M = 7, D = 4, Dv = 3;
  bool padding = false;
};

struct Inputs {
  Buffer q, k, v, dout;
  AttendOptions o;
  Mechanism m;
};

Inputs make(const Shape& sh, DType dt, uint32_t seed) {
  std::mt19937 rng(seed);
  Inputs s;
  s.q = random_tensor(rng, dt, sh.B, sh.H, sh.N, sh.D);
  s.k = random_tensor(rng, dt, sh.B, sh.Hkv, sh.M, sh.D);
  s.v = random_tensor(rng, dt, sh.B, sh.Hkv, sh.M, sh.Dv);
  s.dout = random_tensor(rng, dt, sh.B, sh.H, sh.N, sh.Dv);
  s.m = parse_mechanism(sh.mech);
  if (sh.padding) {
    s.o.key_padding_lengths.assign(static_cast<size_t>(sh.B), sh.M);
    s.o.key_padding_lengths.back() = sh.M / 2;
  }
  return s;
}

AttendGradients backward(const Inputs& s, const std::string& form, int threads = 0) {
  const AttendResult fwd = attend(s.q.view, s.k.view, s.v.view, s.m, s.o);
  AttendOptions bo = s.o;
  bo.form = form;
  bo.threads = threads;
  return attend_backward(s.dout.view, s.q.view, s.k.view, s.v.view, fwd.out.view(), TensorView{}, s.m, bo);
}

const std::vector<Shape>& shapes() {
  static const std::vector<Shape> list = {
      {"gau"},
      {"gau:causal"},
      {"gau:causal,bias=0.3", 1, 2, 1, 9, 6},     // queries before the first key
      {"gau:scale=0.8", 2, 2, 2, 5, 7, 4, 3, true},  // key padding
      {"gau:causal", 1, 4, 2, 6, 6},              // grouped heads
  };
  return list;
}

class GauBackward : public ::testing::TestWithParam<Shape> {};

TEST_P(GauBackward, ReferenceMatchesFiniteDifferences) {
  Inputs s = make(GetParam(), DType::f32, 21);
  const AttendGradients g = backward(s, "reference");
  const auto loss = [&] {  // sum dout . out of the float64 forward reference
    return testing::dot_with_output(
        s.dout.view, families::reference_outputs(s.q.view, s.k.view, s.v.view, s.m, s.o, core::RefPrecision::f64));
  };
  testing::expect_matches_finite_differences(loss, s.q, g.dq, "dq");
  testing::expect_matches_finite_differences(loss, s.k, g.dk, "dk");
  testing::expect_matches_finite_differences(loss, s.v, g.dv, "dv");
}

// The reference into float32 tensors, in float64 or plain precision.
AttendGradients reference_f32(const Inputs& s, core::RefPrecision precision) {
  const gau::GauProblem p =
      gau::GauFamily::validate(s.q.view, s.k.view, s.v.view, std::get<Gau>(s.m), s.o, core::Outputs{});
  AttendGradients g;
  g.dq = Tensor(DType::f32, {p.B, p.H, p.N, p.D});
  g.dk = Tensor(DType::f32, {p.B, p.Hkv, p.M, p.D});
  g.dv = Tensor(DType::f32, {p.B, p.Hkv, p.M, p.Dv});
  gau::GauFamily::backward_reference(p, {s.dout.view, {}, {}, g.dq.view(), g.dk.view(), g.dv.view()}, precision);
  return g;
}

TEST_P(GauBackward, TiledFormMatchesTheReferenceInEveryDtype) {
  for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
    SCOPED_TRACE(dtype_name(dt));
    Shape sh = GetParam();
    sh.N *= 19, sh.M *= 19, sh.D = 16, sh.Dv = 12;  // several 64-row blocks, ragged ends
    const Inputs s = make(sh, dt, 22);
    const AttendGradients fast = backward(s, "tiled"), ref = reference_f32(s, core::RefPrecision::f64),
                          plain = reference_f32(s, core::RefPrecision::plain);
    testing::expect_within_rule(fast.dq, ref.dq, plain.dq, "dq");
    testing::expect_within_rule(fast.dk, ref.dk, plain.dk, "dk");
    testing::expect_within_rule(fast.dv, ref.dv, plain.dv, "dv");
    for (int threads : {1, 3}) {
      const AttendGradients t = backward(s, "tiled", threads);
      for (auto [a, b] : {std::pair{&t.dq, &fast.dq}, {&t.dk, &fast.dk}, {&t.dv, &fast.dv}})
        EXPECT_EQ(0, std::memcmp(a->view().data, b->view().data, b->view().numel() * dtype_size(dt))) << threads;
    }
  }
}

std::string name_of(const ::testing::TestParamInfo<Shape>& info) {
  return testing::param_name(info.index, info.param.mech);
}

INSTANTIATE_TEST_SUITE_P(Gau, GauBackward, ::testing::ValuesIn(shapes()), name_of);

TEST(GauBackwardShape, NaNReachesOnlyTheGradientsThatDependOnIt) {
  Inputs s = make({"gau:causal", 1, 1, 1, 70, 70}, DType::f32, 23);
  testing::fill_token(s.v.view, 0, 0, 40, testing::nan_f());  // key 40: seen by rows 40..69
  for (const char* form : {"tiled", "reference"}) {
    const AttendGradients g = backward(s, form);
    EXPECT_TRUE(std::isnan(g.dq.at(0, 0, 45, 0))) << form;
    EXPECT_FALSE(std::isnan(g.dq.at(0, 0, 39, 0))) << form << ": a row that does not see key 40";
    EXPECT_FALSE(std::isnan(g.dv.at(0, 0, 41, 0))) << form << ": dV does not read V";
    EXPECT_TRUE(std::isnan(g.dk.at(0, 0, 40, 0))) << form;
    EXPECT_FALSE(std::isnan(g.dk.at(0, 0, 3, 0))) << form << ": dK of a clean key";
  }
}

TEST(GauBackwardShape, TakesNoLse) {
  const Inputs s = make({"gau"}, DType::f32, 24);
  const AttendResult fwd = attend(s.q.view, s.k.view, s.v.view, s.m, s.o);
  testing::expect_error([&] {
    attend_backward(s.dout.view, s.q.view, s.k.view, s.v.view, fwd.out.view(), fwd.out.view(), s.m, s.o);
  }, "lse does not apply to gau");
  const Explanation e = explain_backward(s.q.view, s.k.view, s.v.view, s.m);
  EXPECT_EQ(e.chosen, "tiled");
  EXPECT_EQ(e.forms.back().form, "reference");
}

}  // namespace
}  // namespace attn
