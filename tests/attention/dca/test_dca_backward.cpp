// DCA's backward: the float64 reference against central finite differences of the float64 forward
// reference (tiny shapes that reach all three parts: intra, successive, inter; both RoPE styles,
// a scale, grouped heads, padding, more keys than queries, a gradient through the lse), the parts
// form against the reference under the 3x-plain rule in every dtype on odd sizes, bitwise the same
// on 1 and 3 threads, one chunk equal to the softmax backward on RoPE-rotated inputs, and what it
// refuses. The case list's backward mode checks the parts form on every ISA.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "attn/attn.hpp"
#include "dca/dca.hpp"
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
  int64_t B = 1, H = 2, Hkv = 1, N = 11, M = 11, D = 4, Dv = 3;
  bool padding = false, dlse = false;
};

struct Inputs {
  Shape sh;
  Buffer q, k, v, dout, dlse;
  AttendOptions o;
  Mechanism m;
};

Inputs make(const Shape& sh, DType dt, uint32_t seed, float magnitude = 1.0f) {
  std::mt19937 rng(seed);
  Inputs s;
  s.sh = sh;
  s.q = random_tensor(rng, dt, sh.B, sh.H, sh.N, sh.D, Layout::bhnd, magnitude);
  s.k = random_tensor(rng, dt, sh.B, sh.Hkv, sh.M, sh.D, Layout::bhnd, magnitude);
  s.v = random_tensor(rng, dt, sh.B, sh.Hkv, sh.M, sh.Dv);
  s.dout = random_tensor(rng, dt, sh.B, sh.H, sh.N, sh.Dv);
  if (sh.dlse) s.dlse = random_tensor(rng, DType::f32, sh.B, sh.H, sh.N, 1);
  s.m = parse_mechanism(sh.mech);
  if (sh.padding) {
    s.o.key_padding_lengths.assign(static_cast<size_t>(sh.B), sh.M);
    s.o.key_padding_lengths.back() = sh.M / 2;
  }
  return s;
}

AttendGradients backward(const Inputs& s, const std::string& form, int threads = 0) {
  AttendOptions fo = s.o;
  fo.return_lse = true;
  const AttendResult fwd = attend(s.q.view, s.k.view, s.v.view, s.m, fo);
  AttendOptions bo = s.o;
  bo.form = form;
  bo.threads = threads;
  return attend_backward(s.dout.view, s.q.view, s.k.view, s.v.view, fwd.out.view(), fwd.lse.view(), s.m, bo,
                         s.sh.dlse ? &s.dlse.view : nullptr);
}

// sum dout . out (+ sum dlse . lse) of the float64 forward reference.
double loss(const Inputs& s) {
  const core::ReferenceResult r =
      families::reference_outputs(s.q.view, s.k.view, s.v.view, s.m, s.o, core::RefPrecision::f64);
  double l = testing::dot_with_output(s.dout.view, r);
  if (s.sh.dlse)
    for (int64_t b = 0; b < s.sh.B; ++b)
      for (int64_t h = 0; h < s.sh.H; ++h)
        for (int64_t i = 0; i < s.sh.N; ++i) {
          const double x = r.lse[static_cast<size_t>((b * s.sh.H + h) * s.sh.N + i)];
          if (std::isfinite(x)) l += static_cast<double>(s.dlse.view.at(b, h, i, 0)) * x;
        }
  return l;
}

const std::vector<Shape>& shapes() {
  static const std::vector<Shape> list = {
      {"dca:chunk=3,local=2"},                                          // 4 chunks: every part
      {"dca:chunk=4,local=4,theta=50,interleaved"},                     // local = chunk
      {"dca:chunk=3,local=1,scale=0.7", 1, 4, 2, 10, 10},               // grouped heads
      {"dca:chunk=4,local=2", 2, 2, 2, 9, 9, 4, 3, true},               // key padding
      {"dca:chunk=3,local=2,theta=20", 1, 2, 1, 5, 13, 6, 2},           // more keys than queries
      {"dca:chunk=3,local=2", 1, 2, 1, 11, 11, 4, 3, false, true},      // a gradient through lse
  };
  return list;
}

class DcaBackward : public ::testing::TestWithParam<Shape> {};

TEST_P(DcaBackward, ReferenceMatchesFiniteDifferences) {
  Inputs s = make(GetParam(), DType::f32, 31);
  const AttendGradients g = backward(s, "reference");
  const auto l = [&] { return loss(s); };
  testing::expect_matches_finite_differences(l, s.q, g.dq, "dq");
  testing::expect_matches_finite_differences(l, s.k, g.dk, "dk");
  testing::expect_matches_finite_differences(l, s.v, g.dv, "dv");
}

// The reference into float32 tensors, in float64 or plain precision.
AttendGradients reference_f32(const Inputs& s, core::RefPrecision precision) {
  const dca::DcaProblem p = dca::DcaFamily::validate(s.q.view, s.k.view, s.v.view, std::get<Dca>(s.m), s.o, core::Outputs{});
  AttendGradients g;
  g.dq = Tensor(DType::f32, {p.B, p.H, p.N, p.D});
  g.dk = Tensor(DType::f32, {p.B, p.Hkv, p.M, p.D});
  g.dv = Tensor(DType::f32, {p.B, p.Hkv, p.M, p.Dv});
  dca::DcaFamily::backward_reference(
      p, {s.dout.view, {}, {}, g.dq.view(), g.dk.view(), g.dv.view(), s.sh.dlse ? s.dlse.view : TensorView{}}, precision);
  return g;
}

void expect_same_bits(const Tensor& a, const Tensor& b, const char* name) {
  ASSERT_EQ(a.view().numel(), b.view().numel()) << name;
  EXPECT_EQ(0, std::memcmp(a.view().data, b.view().data, a.view().numel() * dtype_size(a.view().dtype))) << name;
}

TEST_P(DcaBackward, PartsFormMatchesTheReferenceInEveryDtype) {
  for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
    SCOPED_TRACE(dtype_name(dt));
    Shape sh = GetParam();
    sh.N = sh.N * 7 + 2, sh.M = sh.M * 7 + 2, sh.D = 10, sh.Dv = 7;  // odd sizes, several 64-row blocks
    const Inputs s = make(sh, dt, 32, 2.0f);
    const AttendGradients fast = backward(s, "parts"), ref = reference_f32(s, core::RefPrecision::f64),
                          plain = reference_f32(s, core::RefPrecision::plain);
    testing::expect_within_rule(fast.dq, ref.dq, plain.dq, "dq");
    testing::expect_within_rule(fast.dk, ref.dk, plain.dk, "dk");
    testing::expect_within_rule(fast.dv, ref.dv, plain.dv, "dv");
    for (int threads : {1, 3}) {
      const AttendGradients t = backward(s, "parts", threads);
      expect_same_bits(t.dq, fast.dq, "dq");
      expect_same_bits(t.dk, fast.dk, "dk");
      expect_same_bits(t.dv, fast.dv, "dv");
    }
  }
}

std::string name_of(const ::testing::TestParamInfo<Shape>& info) {
  return testing::param_name(info.index, info.param.mech);
}

INSTANTIATE_TEST_SUITE_P(Dca, DcaBackward, ::testing::ValuesIn(shapes()), name_of);

// One chunk (chunk >= every position): DCA is causal attention on q and k rotated at their true
// positions, so its gradients are the softmax backward's on the rotated inputs, rotated back.
TEST(DcaBackwardShape, OneChunkIsTheSoftmaxBackwardOnRotatedInputs) {
  const int64_t B = 1, H = 2, N = 37, M = 37, D = 8, Dv = 5;
  Inputs s = make({"dca:chunk=64,local=8,theta=500", B, H, 1, N, M, D, Dv}, DType::f32, 33, 2.0f);
  const AttendGradients g = backward(s, "parts");
  Rope r;
  r.theta = 500;
  Buffer q = s.q, k = s.k;
  q.view.data = q.bytes.data(), k.view.data = k.bytes.data();
  apply_rope(q.view, r);
  apply_rope(k.view, r);
  const Mechanism causal = parse_mechanism("softmax:causal");
  AttendOptions fo;
  fo.return_lse = true;
  const AttendResult fwd = attend(q.view, k.view, s.v.view, causal, fo);
  const AttendGradients want = attend_backward(s.dout.view, q.view, k.view, s.v.view, fwd.out.view(), fwd.lse.view(), causal);
  // the softmax gradients rotated back in float64: pair (a, b) at angle x becomes (a cos x + b sin x, b cos x - a sin x)
  for (int64_t h = 0; h < H; ++h)
    for (int64_t n = 0; n < N; ++n)
      for (int64_t c = 0; c < D / 2; ++c) {
        const double angle = static_cast<double>(n) * std::pow(500.0, -2.0 * static_cast<double>(c) / D);
        for (auto [got, ref, head] : {std::tuple{&g.dq, &want.dq, h}, {&g.dk, &want.dk, int64_t{0}}}) {
          const double a = ref->at(0, head, n, c), b = ref->at(0, head, n, c + D / 2);
          EXPECT_NEAR(got->at(0, head, n, c), a * std::cos(angle) + b * std::sin(angle), 2e-5) << h << " " << n << " " << c;
          EXPECT_NEAR(got->at(0, head, n, c + D / 2), b * std::cos(angle) - a * std::sin(angle), 2e-5) << h << " " << n;
        }
      }
  for (int64_t j = 0; j < M; ++j)
    for (int64_t c = 0; c < Dv; ++c) EXPECT_NEAR(g.dv.at(0, 0, j, c), want.dv.at(0, 0, j, c), 2e-5);
}

TEST(DcaBackwardShape, PaddedKeysGetZeroAndTheirPoisonStaysThere) {
  Inputs s = make({"dca:chunk=5,local=2", 2, 2, 1, 23, 23, 4, 3, true}, DType::f32, 34);
  const AttendGradients clean[2] = {backward(s, "parts"), backward(s, "reference")};
  for (int64_t j = 23 / 2; j < 23; ++j) {  // batch 1's padded keys
    testing::fill_token(s.k.view, 1, 0, j, testing::nan_f());
    testing::fill_token(s.v.view, 1, 0, j, testing::nan_f());
  }
  int which = 0;
  for (const char* form : {"parts", "reference"}) {
    SCOPED_TRACE(form);
    const AttendGradients g = backward(s, form);
    const AttendGradients& c = clean[which++];
    expect_same_bits(g.dq, c.dq, "dq");
    expect_same_bits(g.dk, c.dk, "dk");
    expect_same_bits(g.dv, c.dv, "dv");
    for (int64_t j = 23 / 2; j < 23; ++j) {
      EXPECT_EQ(g.dk.at(1, 0, j, 0), 0.0f) << form;
      EXPECT_EQ(g.dv.at(1, 0, j, 0), 0.0f) << form;
    }
  }
}

TEST(DcaBackwardShape, ExplainListsTheFormsAndLseIsRequired) {
  const Inputs s = make({"dca:chunk=4,local=2"}, DType::f32, 35);
  const Explanation e = explain_backward(s.q.view, s.k.view, s.v.view, s.m);
  EXPECT_EQ(e.chosen, "parts");
  ASSERT_EQ(e.forms.size(), 2u);
  EXPECT_EQ(e.forms.back().form, "reference");
  EXPECT_TRUE(families::backward_refusal(s.q.view, s.k.view, s.v.view, s.m, s.o).empty());
  const AttendResult fwd = attend(s.q.view, s.k.view, s.v.view, s.m, s.o);
  testing::expect_error([&] {
    attend_backward(s.dout.view, s.q.view, s.k.view, s.v.view, fwd.out.view(), TensorView{}, s.m, s.o);
  }, "lse");
  AttendOptions bf16 = s.o;
  bf16.precision = Precision::bf16;
  testing::expect_error([&] { explain_backward(s.q.view, s.k.view, s.v.view, s.m, bf16); },
                        "dca computes in float32 only");
}

}  // namespace
}  // namespace attn
