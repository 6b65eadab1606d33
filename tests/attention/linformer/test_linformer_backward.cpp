// Linformer's backward: the float64 reference against central finite differences of the float64
// forward reference (q, k, v, and E and F when they are params), the projected form against the
// reference under the 3x-plain rule in float32 and half storage, bitwise the same on 1 and 3
// threads, keys past the padding length with zero gradient, and dparams only for given params.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <variant>

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
  int64_t B = 1, H = 2, Hkv = 1, N = 5, M = 7, D = 4, Dv = 3, k = 3;
  bool padding = false, given = true;
};

struct Inputs {
  Shape sh;
  Buffer q, k, v, dout, E, F;  // E, F: (1, 1, k, M) float32, passed as (k, M) params
  AttendOptions o;
  Mechanism m;
};

Inputs make(const Shape& sh, DType dt, uint32_t seed) {
  std::mt19937 rng(seed);
  Inputs s;
  s.sh = sh;
  s.q = random_tensor(rng, dt, sh.B, sh.H, sh.N, sh.D);
  s.k = random_tensor(rng, dt, sh.B, sh.Hkv, sh.M, sh.D);
  s.v = random_tensor(rng, dt, sh.B, sh.Hkv, sh.M, sh.Dv);
  s.dout = random_tensor(rng, dt, sh.B, sh.H, sh.N, sh.Dv);
  s.E = random_tensor(rng, DType::f32, 1, 1, sh.k, sh.M);
  s.F = random_tensor(rng, DType::f32, 1, 1, sh.k, sh.M);
  Linformer l = std::get<Linformer>(parse_mechanism(sh.mech));
  l.k = sh.k;  // the shape's (its projections' rows)
  s.m = l;
  if (sh.given) {
    s.o.params["E"] = make_array_view(s.E.view.data, DType::f32, {sh.k, sh.M});
    s.o.params["F"] = make_array_view(s.F.view.data, DType::f32, {sh.k, sh.M});
  }
  if (sh.padding) {
    s.o.key_padding_lengths.assign(static_cast<size_t>(sh.B), sh.M);
    s.o.key_padding_lengths.back() = sh.M / 2;
  }
  return s;
}

double loss(const Inputs& s) { return testing::reference_loss(s); }

AttendGradients backward(const Inputs& s, const std::string& form, int threads = 0) {
  return testing::forward_then_backward(s, form, threads);
}

std::vector<Shape> shapes() {
  std::vector<Shape> v;
  v.push_back({"linformer:k=3"});
  Shape gqa{"linformer:k=4,scale=0.7"};
  gqa.H = 4, gqa.Hkv = 2, gqa.Dv = 5, gqa.k = 4;
  v.push_back(gqa);
  Shape pad{"linformer:k=3"};
  pad.B = 2, pad.padding = true;  // batch entry 1: 3 valid keys
  v.push_back(pad);
  Shape drawn{"linformer:k=2,seed=4"};  // E and F from the seed: no dparams
  drawn.given = false, drawn.k = 2;
  v.push_back(drawn);
  return v;
}

class LinformerBackward : public ::testing::TestWithParam<Shape> {};

TEST_P(LinformerBackward, ReferenceMatchesFiniteDifferences) {
  Inputs s = make(GetParam(), DType::f32, 31);
  const AttendGradients g = backward(s, "reference");
  auto l = [&] { return loss(s); };
  testing::expect_matches_finite_differences(l, s.q, g.dq, "dq");
  testing::expect_matches_finite_differences(l, s.k, g.dk, "dk");
  testing::expect_matches_finite_differences(l, s.v, g.dv, "dv");
  if (!GetParam().given) {
    EXPECT_TRUE(g.dparams.empty());
    return;
  }
  ASSERT_EQ(g.dparams.size(), 2u);
  EXPECT_EQ(g.dparams.at("E").view().shape, (std::array<int64_t, 4>{1, 1, GetParam().k, GetParam().M}));
  testing::expect_matches_finite_differences(l, s.E, g.dparams.at("E"), "dE");
  testing::expect_matches_finite_differences(l, s.F, g.dparams.at("F"), "dF");
  if (GetParam().padding)  // keys past batch entry 1's length: no gradient, and they add nothing to dE
    for (int64_t j = GetParam().M / 2; j < GetParam().M; ++j) {
      EXPECT_EQ(g.dk.at(1, 0, j, 0), 0.0f);
      EXPECT_EQ(g.dv.at(1, 0, j, 0), 0.0f);
    }
}

void expect_same_bits(const Tensor& a, const Tensor& b, const std::string& name) {
  ASSERT_EQ(a.view().numel(), b.view().numel()) << name;
  EXPECT_EQ(0, std::memcmp(a.view().data, b.view().data, a.view().numel() * dtype_size(a.view().dtype))) << name;
}

TEST_P(LinformerBackward, ProjectedMatchesTheReferenceInEveryDtype) {
  for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
    SCOPED_TRACE(dtype_name(dt));
    Shape sh = GetParam();
    sh.N = 37, sh.M = 53, sh.D = 8, sh.Dv = sh.Dv == 3 ? 6 : sh.Dv, sh.k = 19;  // several 16-row blocks of dE
    Inputs s = make(sh, dt, 32);
    const AttendGradients fast = backward(s, "projected");
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
      const AttendGradients t = backward(s, "projected", threads);
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

INSTANTIATE_TEST_SUITE_P(Linformer, LinformerBackward, ::testing::ValuesIn(shapes()), name_of);

TEST(LinformerBackwardShape, ExplainListsTheForms) {
  Inputs s = make(Shape{"linformer:k=3"}, DType::f32, 5);
  const Explanation e = explain_backward(s.q.view, s.k.view, s.v.view, s.m, s.o);
  EXPECT_EQ(e.chosen, "projected");
  EXPECT_EQ(e.forms.back().form, "reference");
}

}  // namespace
}  // namespace attn
