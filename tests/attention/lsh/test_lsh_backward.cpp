// LSH attention's backward: the float64 reference against central finite differences of the
// float64 forward reference (dout . out + dlse . lse), the buckets held fixed (an element whose
// step moves a bucket is left out: the hashing is piecewise constant, its gradient no part of the
// backward); the chunked form against the reference under the 3x-plain rule in float32 and half
// storage on odd sizes, bitwise the same on 1 and 3 threads; keys past the padding length with
// zero gradient.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <variant>

#include "attn/attn.hpp"
#include "attn/pattern.hpp"
#include "families/internal_api.hpp"
#include "support/gradient_checks.hpp"
#include "support/random_inputs.hpp"

namespace attn {
namespace {

using testing::Buffer;
using testing::random_tensor;

struct Shape {
  std::string mech;
  int64_t B = 1, H = 2, Hkv = 1, N = 9, M = 11, D = 5, Dv = 3;
  bool padding = false;
};

struct Inputs {
  Shape sh;
  Buffer q, k, v, dout, dlse;
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
  s.dlse = random_tensor(rng, DType::f32, sh.B, sh.H, sh.N, 1);
  s.m = parse_mechanism(sh.mech);
  if (sh.padding) {
    s.o.key_padding_lengths.assign(static_cast<size_t>(sh.B), sh.M);
    s.o.key_padding_lengths.back() = sh.M / 2;
  }
  return s;
}

// sum dout . out + dlse . lse of the float64 forward reference (rows with no key: lse = -inf, left out)
double loss(const Inputs& s) {
  const core::ReferenceResult r =
      families::reference_outputs(s.q.view, s.k.view, s.v.view, s.m, s.o, core::RefPrecision::f64);
  double l = testing::dot_with_output(s.dout.view, r);
  for (int64_t b = 0; b < s.sh.B; ++b)
    for (int64_t h = 0; h < s.sh.H; ++h)
      for (int64_t i = 0; i < s.sh.N; ++i) {
        const double x = r.lse[static_cast<size_t>((b * s.sh.H + h) * s.sh.N + i)];
        if (std::isfinite(x)) l += x * s.dlse.view.at(b, h, i, 0);
      }
  return l;
}

AttendGradients backward(const Inputs& s, const std::string& form, int threads = 0, bool with_dlse = false) {
  AttendOptions fo = s.o;
  fo.return_lse = true;
  const AttendResult fwd = attend(s.q.view, s.k.view, s.v.view, s.m, fo);
  AttendOptions bo = s.o;
  bo.form = form;
  bo.threads = threads;
  return attend_backward(s.dout.view, s.q.view, s.k.view, s.v.view, fwd.out.view(), fwd.lse.view(), s.m, bo,
                         with_dlse ? &s.dlse.view : nullptr);
}

// Central differences in the elements of x whose +-step leaves every bucket as it is.
void expect_matches_finite_differences(const Inputs& s, Buffer& x, const Tensor& grad, const char* name) {
  const Lsh& mech = std::get<Lsh>(s.m);
  const LshBuckets base = lsh_buckets(s.q.view, s.k.view, s.v.view, mech, s.o);
  const TensorView& v = x.view;
  double worst = 0, largest = 0;
  int64_t used = 0, total = 0;
  for (int64_t b = 0; b < v.shape[0]; ++b)
    for (int64_t h = 0; h < v.shape[1]; ++h)
      for (int64_t n = 0; n < v.shape[2]; ++n)
        for (int64_t c = 0; c < v.shape[3]; ++c) {
          const int64_t at = v.offset(b, h, n, c);
          const float x0 = v.at(b, h, n, c), up = x0 + 1e-3f, down = x0 - 1e-3f;
          ++total;
          store_from_float(v.data, v.dtype, at, up);
          const LshBuckets bu = lsh_buckets(s.q.view, s.k.view, s.v.view, mech, s.o);
          const double lu = loss(s);
          store_from_float(v.data, v.dtype, at, down);
          const LshBuckets bd = lsh_buckets(s.q.view, s.k.view, s.v.view, mech, s.o);
          const double ld = loss(s);
          store_from_float(v.data, v.dtype, at, x0);
          if (bu.query != base.query || bu.key != base.key || bd.query != base.query || bd.key != base.key) continue;
          ++used;
          const double fd = (lu - ld) / (static_cast<double>(up) - down);
          worst = std::max(worst, std::abs(fd - grad.at(b, h, n, c)));
          largest = std::max(largest, std::abs(fd));
        }
  EXPECT_LE(worst, 1e-3 * std::max(1.0, largest)) << name << ": max |finite difference - gradient| = " << worst;
  EXPECT_GT(largest, 1e-3) << name << ": a gradient that is all zeros checks nothing";
  EXPECT_GE(used * 10, total * 8) << name << ": most steps moved a bucket (" << used << " of " << total << " used)";
}

std::vector<Shape> shapes() {
  std::vector<Shape> v;
  v.push_back({"lsh:buckets=4,rounds=2,chunk=3,seed=1"});
  Shape causal{"lsh:buckets=4,rounds=3,chunk=2,seed=2,causal,shared_qk"};
  causal.N = causal.M = 10, causal.H = causal.Hkv = 2;  // shared_qk: a lone query attends to itself
  v.push_back(causal);
  Shape gqa{"lsh:buckets=6,rounds=2,chunk=4,seed=3,scale=0.6"};
  gqa.H = 4, gqa.Hkv = 2, gqa.N = 7, gqa.M = 13, gqa.Dv = 4;
  v.push_back(gqa);
  Shape pad{"lsh:buckets=4,rounds=2,chunk=3,seed=4,causal"};
  pad.B = 2, pad.N = pad.M = 10, pad.padding = true;  // batch entry 1: 5 valid keys
  v.push_back(pad);
  return v;
}

class LshBackward : public ::testing::TestWithParam<Shape> {};

TEST_P(LshBackward, ReferenceMatchesFiniteDifferences) {
  Inputs s = make(GetParam(), DType::f32, 41);
  for (bool with_dlse : {false, true}) {
    SCOPED_TRACE(with_dlse ? "through out and lse" : "through out");
    Inputs t = s;
    t.q.view.data = t.q.bytes.data(), t.k.view.data = t.k.bytes.data(), t.v.view.data = t.v.bytes.data();
    t.dout.view.data = t.dout.bytes.data(), t.dlse.view.data = t.dlse.bytes.data();
    if (!with_dlse) std::fill(t.dlse.bytes.begin(), t.dlse.bytes.end(), uint8_t{0});
    const AttendGradients g = backward(t, "reference", 0, with_dlse);
    expect_matches_finite_differences(t, t.q, g.dq, "dq");
    expect_matches_finite_differences(t, t.k, g.dk, "dk");
    expect_matches_finite_differences(t, t.v, g.dv, "dv");
    const AttendGradients fast = backward(t, "chunked", 0, with_dlse);  // the same within float32
    testing::expect_within_rule(fast.dq, g.dq, g.dq, "dq");
    testing::expect_within_rule(fast.dk, g.dk, g.dk, "dk");
    testing::expect_within_rule(fast.dv, g.dv, g.dv, "dv");
  }
  if (GetParam().padding) {
    const AttendGradients g = backward(s, "chunked");
    for (int64_t j = GetParam().M / 2; j < GetParam().M; ++j)
      for (int64_t c = 0; c < GetParam().D; ++c) {
        EXPECT_EQ(g.dk.at(1, 0, j, c), 0.0f);
        if (c < GetParam().Dv) EXPECT_EQ(g.dv.at(1, 0, j, c), 0.0f);
      }
  }
}

void expect_same_bits(const Tensor& a, const Tensor& b, const std::string& name) {
  ASSERT_EQ(a.view().numel(), b.view().numel()) << name;
  EXPECT_EQ(0, std::memcmp(a.view().data, b.view().data, a.view().numel() * dtype_size(a.view().dtype))) << name;
}

TEST_P(LshBackward, ChunkedMatchesTheReferenceInEveryDtypeOnOddSizes) {
  for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
    SCOPED_TRACE(dtype_name(dt));
    Shape sh = GetParam();
    sh.N = sh.padding || sh.mech.find("shared_qk") != std::string::npos ? 67 : 37;
    sh.M = sh.N == 67 ? 67 : 53, sh.D = 7, sh.Dv = 5;
    Inputs s = make(sh, dt, 42);
    const AttendGradients fast = backward(s, "chunked", 1);
    const AttendGradients ref = families::reference_gradients(s.dout.view, s.q.view, s.k.view, s.v.view, s.m, s.o,
                                                              core::RefPrecision::f64);
    const AttendGradients plain = families::reference_gradients(s.dout.view, s.q.view, s.k.view, s.v.view, s.m, s.o,
                                                                core::RefPrecision::plain);
    testing::expect_within_rule(fast.dq, ref.dq, plain.dq, "dq");
    testing::expect_within_rule(fast.dk, ref.dk, plain.dk, "dk");
    testing::expect_within_rule(fast.dv, ref.dv, plain.dv, "dv");
    const AttendGradients three = backward(s, "chunked", 3);
    expect_same_bits(fast.dq, three.dq, "dq");
    expect_same_bits(fast.dk, three.dk, "dk");
    expect_same_bits(fast.dv, three.dv, "dv");
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, LshBackward, ::testing::ValuesIn(shapes()),
                         [](const auto& info) { return testing::param_name(info.index, info.param.mech); });

// One chunk holding every key and one round: exact softmax attention, gradients included.
TEST(LshBackwardLimits, OneChunkIsTheSoftmaxGradient) {
  Shape sh{"lsh:buckets=2,rounds=1,chunk=64,seed=5"};
  sh.N = 13, sh.M = 17;
  Inputs s = make(sh, DType::f32, 43);
  const AttendGradients got = backward(s, "chunked");
  const Mechanism exact = parse_mechanism("softmax");
  const AttendGradients want = families::reference_gradients(s.dout.view, s.q.view, s.k.view, s.v.view, exact, s.o,
                                                             core::RefPrecision::f64);
  testing::expect_within_rule(got.dq, want.dq, want.dq, "dq");
  testing::expect_within_rule(got.dk, want.dk, want.dk, "dk");
  testing::expect_within_rule(got.dv, want.dv, want.dv, "dv");
}

TEST(LshBackwardLimits, RotationsGetNoGradientAndTheFactsSaySo) {
  const MechanismInfo i = info(parse_mechanism("lsh"));
  ASSERT_FALSE(i.params.empty());
  for (const auto& p : i.params) EXPECT_FALSE(p.gradient) << p.name << ": the hashing is piecewise constant";
}

}  // namespace
}  // namespace attn

namespace attn {
namespace {

// A non-finite query makes its head's buckets undefined (the forward's rows are NaN): its dq rows
// and its kv head's valid dk, dv rows are NaN in both forms, the other kv head's stay finite and
// equal to a clean run's.
TEST(LshBackwardLimits, ANonFiniteHeadPoisonsItsGroupOnly) {
  Shape sh{"lsh:buckets=4,rounds=2,chunk=3,seed=6"};
  sh.H = 4, sh.Hkv = 2, sh.N = 10, sh.M = 12;
  Inputs s = make(sh, DType::f32, 44);
  const AttendGradients clean_fast = backward(s, "chunked"), clean_ref = backward(s, "reference");
  store_from_float(s.q.view.data, DType::f32, s.q.view.offset(0, 1, 3, 2), std::nanf(""));  // head 1: kv head 0
  for (const char* form : {"chunked", "reference"}) {
    SCOPED_TRACE(form);
    const AttendGradients g = backward(s, form);
    const AttendGradients& clean = std::string(form) == "chunked" ? clean_fast : clean_ref;
    for (int64_t i = 0; i < sh.N; ++i) {
      EXPECT_TRUE(std::isnan(g.dq.at(0, 1, i, 0)));
      EXPECT_TRUE(std::isfinite(g.dq.at(0, 2, i, 0)));
      EXPECT_EQ(g.dq.at(0, 3, i, 1), clean.dq.at(0, 3, i, 1));
    }
    for (int64_t j = 0; j < sh.M; ++j) {
      EXPECT_TRUE(std::isnan(g.dk.at(0, 0, j, 0)) && std::isnan(g.dv.at(0, 0, j, 0)));
      EXPECT_TRUE(std::isfinite(g.dk.at(0, 1, j, 0)) && std::isfinite(g.dv.at(0, 1, j, 0)));
    }
  }
  const AttendGradients fast = backward(s, "chunked");
  for (int64_t j = 0; j < sh.M; ++j) EXPECT_EQ(fast.dk.at(0, 1, j, 3), clean_fast.dk.at(0, 1, j, 3));
}

}  // namespace
}  // namespace attn
