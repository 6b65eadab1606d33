// The backward of packed sequences (attend_varlen_backward), mostly the linear family's (fla's
// cu_seqlens: the state starts afresh at every boundary): a packed batch's gradients equal each
// sequence's alone, bitwise (q, k, v, the per-sequence initial states, through the per-sequence
// final states); the float64 reference form against central finite differences of the float64
// forward reference of the whole packed loss (outputs and final states); the fast forms against
// the reference form; bitwise the same on 1 and 3 threads; learned params summed over the
// sequences; empty sequences; bad input named.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "attn/attn.hpp"
#include "core/reference_result.hpp"
#include "families/internal_api.hpp"
#include "support/expect_error.hpp"
#include "support/gradient_checks.hpp"
#include "support/random_inputs.hpp"

namespace attn {
namespace {

using testing::Buffer;
using testing::random_tensor;

struct Packed {
  std::string mech;
  std::vector<int64_t> cu;  // the same offsets for queries and keys
  int64_t H = 2, Hkv = 1, D = 4, Dv = 3;
  bool with_state = true;
};

struct Inputs {
  Packed pk;
  Buffer q, k, v, dout, s0, dfinal;  // s0, dfinal: (S, H, F, C) float32
  AttendOptions o;
  Mechanism m;
  std::array<int64_t, 4> state{};
  int64_t S = 0, T = 0;
};

int64_t longest(const std::vector<int64_t>& cu) {
  int64_t n = 0;
  for (size_t b = 1; b < cu.size(); ++b) n = std::max(n, cu[b] - cu[b - 1]);
  return n;
}

Inputs make(const Packed& pk, uint32_t seed) {
  std::mt19937 rng(seed);
  Inputs s;
  s.pk = pk;
  s.m = parse_mechanism(pk.mech);
  s.S = static_cast<int64_t>(pk.cu.size()) - 1, s.T = pk.cu.back();
  s.q = random_tensor(rng, DType::f32, 1, pk.H, s.T, pk.D);
  s.k = random_tensor(rng, DType::f32, 1, pk.Hkv, s.T, pk.D);
  s.v = random_tensor(rng, DType::f32, 1, pk.Hkv, s.T, pk.Dv);
  s.dout = random_tensor(rng, DType::f32, 1, pk.H, s.T, pk.Dv);
  std::array<int64_t, 4> one{1, pk.H, 0, 0};  // (1, H, F, C); F = 0: no state (softmax)
  if (pk.mech.rfind("softmax", 0) != 0) one = state_shape(s.q.view, s.k.view, s.v.view, s.m);
  s.state = {s.S, one[1], one[2], one[3]};
  if (one[2] > 0) {
    s.dfinal = random_tensor(rng, DType::f32, s.S, one[1], one[2], one[3]);
    s.s0 = random_tensor(rng, DType::f32, s.S, one[1], one[2], one[3]);
    for (int64_t e = 0; e < s.s0.view.numel(); ++e)  // positive: normalisers stay away from 0
      store_from_float(s.s0.view.data, DType::f32, e, std::abs(load_as_float(s.s0.view.data, DType::f32, e)) + 0.5f);
    if (pk.with_state) s.o.params["initial_state"] = make_array_view(s.s0.view.data, DType::f32, {s.S, one[1], one[2], one[3]});
  }
  return s;
}

bool stateful(const Inputs& s) { return s.state[2] > 0; }

AttendGradients packed_backward(const Inputs& s, const std::string& form, int threads = 0) {
  AttendOptions fo = s.o;
  fo.return_final_state = stateful(s);
  fo.return_lse = info(s.m).has_lse;
  const int64_t n = longest(s.pk.cu);
  const AttendResult fwd = attend_varlen(s.q.view, s.k.view, s.v.view, s.pk.cu, s.pk.cu, n, n, s.m, fo);
  AttendOptions bo = s.o;
  bo.form = form, bo.threads = threads;
  return attend_varlen_backward(s.dout.view, s.q.view, s.k.view, s.v.view, fwd.out.view(), fwd.lse.view(), s.pk.cu,
                                s.pk.cu, n, n, s.m, bo, nullptr, stateful(s) ? &s.dfinal.view : nullptr);
}

TensorView rows(TensorView t, int64_t from, int64_t n) {
  t.data = t.ptr(0, 0, from, 0);
  t.shape[2] = n;
  return t;
}

TensorView entry(TensorView t, int64_t b) {
  t.data = t.ptr(b, 0, 0, 0);
  t.shape[0] = 1;
  return t;
}

void expect_same(const TensorView& a, const TensorView& b, const std::string& what) {
  ASSERT_EQ(a.shape, b.shape) << what;
  for (int64_t i = 0; i < a.shape[0]; ++i)
    for (int64_t h = 0; h < a.shape[1]; ++h)
      for (int64_t n = 0; n < a.shape[2]; ++n)
        for (int64_t c = 0; c < a.shape[3]; ++c) {
          const float x = a.at(i, h, n, c), y = b.at(i, h, n, c);
          ASSERT_EQ(std::memcmp(&x, &y, sizeof x), 0) << what << " at (" << i << ", " << h << ", " << n << ", " << c << ")";
        }
}

std::vector<Packed> packs() {
  return {{"linear:causal,chunk=4", {0, 5, 5, 16, 19}},          // an empty sequence, chunks cut at boundaries
          {"retention:decay=0.8,chunk=3", {0, 7, 8, 20}},
          {"linear:map=relu2,causal,normalize=0,scale=0.3", {0, 9, 13}},
          {"normattn:causal,chunk=4", {0, 6, 15}},               // (no relu features: finite differences)
          {"linear:map=exp", {0, 4, 11, 12}},                     // non-causal: the right form
          {"linear:causal", {0, 10, 17}, 4, 2, 5, 4, false},      // GQA, no initial state
          {"softmax:score=cosine,causal", {0, 6, 15, 21}},      // any family with a backward
          {"softmax:score=additive", {0, 3, 11}}};
}

class VarlenBackward : public ::testing::TestWithParam<Packed> {};

// Additive scores take their params (shared by the sequences); random, the same for every sequence.
void add_additive_params(Inputs& s, std::vector<float>& store) {
  if (s.pk.mech.find("additive") == std::string::npos) return;
  const int64_t A = 3, D = s.pk.D;
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.0f, 0.5f);
  store.resize(static_cast<size_t>(2 * A * D + A));
  for (float& x : store) x = nd(rng);
  s.o.params["wq"] = make_array_view(store.data(), DType::f32, {A, D});
  s.o.params["wk"] = make_array_view(store.data() + A * D, DType::f32, {A, D});
  s.o.params["w"] = make_array_view(store.data() + 2 * A * D, DType::f32, {A});
}

TEST_P(VarlenBackward, PackedGradientsAreEachSequencesAlone) {
  Inputs s = make(GetParam(), 21);
  std::vector<float> weights;
  add_additive_params(s, weights);
  const AttendGradients packed = packed_backward(s, "");
  ASSERT_EQ(packed.dq.view().shape, s.q.view.shape);
  EXPECT_EQ(packed.d_initial_state.defined(), stateful(s) && GetParam().with_state);
  std::map<std::string, std::vector<double>> summed;
  for (int64_t b = 0; b < s.S; ++b) {
    SCOPED_TRACE("sequence " + std::to_string(b));
    const int64_t at = s.pk.cu[b], n = s.pk.cu[b + 1] - at;
    if (n == 0) {  // nothing to run: zero gradients, and the initial state's is the final state's
      if (packed.d_initial_state.defined())
        expect_same(entry(packed.d_initial_state.view(), b), entry(s.dfinal.view, b), "d_initial_state");
      continue;
    }
    const TensorView q = rows(s.q.view, at, n), k = rows(s.k.view, at, n), v = rows(s.v.view, at, n);
    AttendOptions o = s.o;
    if (o.params.contains("initial_state")) {
      ArrayView& row = o.params.at("initial_state");
      row.data = entry(s.s0.view, b).data, row.shape[0] = 1;
    }
    AttendOptions fo = o;
    fo.return_lse = info(s.m).has_lse;
    const AttendResult fwd = attend(q, k, v, s.m, fo);
    const TensorView df = stateful(s) ? entry(s.dfinal.view, b) : TensorView{};
    const AttendGradients alone = attend_backward(rows(s.dout.view, at, n), q, k, v, fwd.out.view(), fwd.lse.view(),
                                                  s.m, o, nullptr, stateful(s) ? &df : nullptr);
    expect_same(rows(packed.dq.view(), at, n), alone.dq.view(), "dq");
    expect_same(rows(packed.dk.view(), at, n), alone.dk.view(), "dk");
    expect_same(rows(packed.dv.view(), at, n), alone.dv.view(), "dv");
    if (packed.d_initial_state.defined())
      expect_same(entry(packed.d_initial_state.view(), b), alone.d_initial_state.view(), "d_initial_state");
    for (const auto& [name, t] : alone.dparams) {
      auto& sum = summed[name];
      sum.resize(static_cast<size_t>(t.view().numel()));
      for (int64_t e = 0; e < t.view().numel(); ++e) sum[e] += load_as_float(t.view().data, DType::f32, e);
    }
  }
  ASSERT_EQ(packed.dparams.size(), summed.size());
  for (const auto& [name, sum] : summed)
    for (size_t e = 0; e < sum.size(); ++e)
      EXPECT_NEAR(load_as_float(packed.dparams.at(name).view().data, DType::f32, static_cast<int64_t>(e)), sum[e],
                  1e-5 * (1 + std::abs(sum[e])))
          << name;
}

// L = sum dout . out + sum dfinal . final_state of the float64 forward reference, sequence by
// sequence (the packed call's loss, without its kernels).
double packed_loss(const Inputs& s) {
  double l = 0;
  for (int64_t b = 0; b < s.S; ++b) {
    const int64_t at = s.pk.cu[b], n = s.pk.cu[b + 1] - at;
    AttendOptions o = s.o;
    if (o.params.contains("initial_state")) {
      ArrayView& row = o.params.at("initial_state");
      row.data = entry(s.s0.view, b).data, row.shape[0] = 1;
    }
    if (n == 0) {
      if (stateful(s) && s.pk.with_state)
        for (int64_t e = 0; e < s.dfinal.view.numel() / s.S; ++e)
          l += static_cast<double>(static_cast<const float*>(entry(s.dfinal.view, b).data)[e]) *
               static_cast<const float*>(entry(s.s0.view, b).data)[e];
      continue;
    }
    const core::ReferenceResult r = families::reference_outputs(rows(s.q.view, at, n), rows(s.k.view, at, n),
                                                                rows(s.v.view, at, n), s.m, o, core::RefPrecision::f64);
    l += testing::dot_with_output(rows(s.dout.view, at, n), r);
    if (stateful(s)) {
      const TensorView df = entry(s.dfinal.view, b);
      for (size_t e = 0; e < r.state.size(); ++e) l += static_cast<double>(static_cast<const float*>(df.data)[e]) * r.state[e];
    }
  }
  return l;
}

TEST_P(VarlenBackward, ReferenceMatchesFiniteDifferencesOfThePackedLoss) {
  Inputs s = make(GetParam(), 22);
  std::vector<float> weights;
  add_additive_params(s, weights);
  const AttendGradients g = packed_backward(s, "reference");
  const auto l = [&] { return packed_loss(s); };
  testing::expect_matches_finite_differences(l, s.q, g.dq, "dq");
  testing::expect_matches_finite_differences(l, s.k, g.dk, "dk");
  testing::expect_matches_finite_differences(l, s.v, g.dv, "dv");
  if (g.d_initial_state.defined()) testing::expect_matches_finite_differences(l, s.s0, g.d_initial_state, "d_initial_state");
}

TEST_P(VarlenBackward, FastFormsAgreeWithTheReferenceOnAnyThreadCount) {
  Packed pk = GetParam();
  for (int64_t& x : pk.cu) x *= 9;  // longer sequences: several chunks and query blocks
  pk.D = 8, pk.Dv = 6;
  Inputs s = make(pk, 23);
  std::vector<float> weights;
  add_additive_params(s, weights);
  const AttendGradients fast = packed_backward(s, ""), ref = packed_backward(s, "reference");
  auto close = [](const Tensor& a, const Tensor& b, const char* name) {
    double err = 0, largest = 0;
    for (int64_t e = 0; e < b.view().numel(); ++e) {
      const double y = load_as_float(b.view().data, DType::f32, e);
      err = std::max(err, std::abs(load_as_float(a.view().data, DType::f32, e) - y));
      largest = std::max(largest, std::abs(y));
    }
    EXPECT_LE(err, 2e-5 * std::max(1.0, largest)) << name;
  };
  close(fast.dq, ref.dq, "dq");
  close(fast.dk, ref.dk, "dk");
  close(fast.dv, ref.dv, "dv");
  if (ref.d_initial_state.defined()) close(fast.d_initial_state, ref.d_initial_state, "d_initial_state");
  for (const auto& [name, t] : ref.dparams) close(fast.dparams.at(name), t, name.c_str());
  for (int threads : {1, 3}) {
    const AttendGradients t = packed_backward(s, "", threads);
    expect_same(t.dq.view(), fast.dq.view(), "dq");
    expect_same(t.dk.view(), fast.dk.view(), "dk");
    expect_same(t.dv.view(), fast.dv.view(), "dv");
    if (fast.d_initial_state.defined()) expect_same(t.d_initial_state.view(), fast.d_initial_state.view(), "ds0");
  }
}

std::string name_of(const ::testing::TestParamInfo<Packed>& info) {
  return testing::param_name(info.index, info.param.mech);
}

INSTANTIATE_TEST_SUITE_P(Packed, VarlenBackward, ::testing::ValuesIn(packs()), name_of);

// The packed forward's final states are each sequence's (an empty one's: its initial state).
TEST(VarlenForward, FinalStatesPerSequence) {
  const Inputs s = make({"linear:causal,chunk=4", {0, 5, 5, 16}}, 31);
  AttendOptions fo = s.o;
  fo.return_final_state = true;
  const AttendResult r = attend_varlen(s.q.view, s.k.view, s.v.view, s.pk.cu, s.pk.cu, 11, 11, s.m, fo);
  ASSERT_EQ(r.final_state.view().shape, s.state);
  expect_same(entry(r.final_state.view(), 1), entry(s.s0.view, 1), "the empty sequence's final state");
  AttendOptions o = s.o;
  ArrayView& row = o.params.at("initial_state");
  row.data = entry(s.s0.view, 2).data, row.shape[0] = 1;
  o.return_final_state = true;
  const AttendResult alone = attend(rows(s.q.view, 5, 11), rows(s.k.view, 5, 11), rows(s.v.view, 5, 11), s.m, o);
  expect_same(entry(r.final_state.view(), 2), alone.final_state.view(), "sequence 2's final state");
}

TEST(VarlenBackwardShape, BadInputIsNamed) {
  const Inputs s = make({"linear:causal", {0, 5, 9}}, 41);
  AttendOptions fo = s.o;
  fo.return_final_state = true;
  const AttendResult fwd = attend_varlen(s.q.view, s.k.view, s.v.view, s.pk.cu, s.pk.cu, 5, 5, s.m, fo);
  const TensorView one_state = entry(s.dfinal.view, 0);
  testing::expect_error([&] {
    attend_varlen_backward(s.dout.view, s.q.view, s.k.view, s.v.view, fwd.out.view(), {}, s.pk.cu, s.pk.cu, 5, 5, s.m,
                           s.o, nullptr, &one_state);
  }, "attend_varlen_backward: dfinal_state must hold one state gradient per sequence (2, H, F, state columns)");
  testing::expect_error([&] {
    attend_varlen_backward(s.dout.view, s.q.view, s.k.view, s.v.view, fwd.out.view(), {}, {0, 4, 9}, {0, 5, 9}, 5, 5,
                           s.m, s.o);
  }, "is causal: each token brings its q, k and v, so N (queries) must equal M (keys), got N = 4, M = 5");
  AttendOptions one = s.o;
  one.params["initial_state"].shape[0] = 1;
  testing::expect_error([&] {
    attend_varlen_backward(s.dout.view, s.q.view, s.k.view, s.v.view, fwd.out.view(), {}, s.pk.cu, s.pk.cu, 5, 5, s.m,
                           one);
  }, "params['initial_state'] must hold one state per sequence, (2, H, F, state columns)");
  testing::expect_error([&] {
    attend_varlen_backward(rows(s.dout.view, 0, 4), s.q.view, s.k.view, s.v.view, fwd.out.view(), {}, s.pk.cu, s.pk.cu,
                           5, 5, s.m, s.o);
  }, "attend_varlen_backward: dout must be (1, heads, total q tokens 9, dim)");
}

}  // namespace
}  // namespace attn
