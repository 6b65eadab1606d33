// AttendOptions::precision: which form computes in bf16, what bf16 products mean for float32
// inputs, thread-count independence, and the errors. (Accuracy against float64 on every ISA path
// is the case list's: its bf16 cases run tiled_bf16.)
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/bf16_tiles.hpp"
#include "support/expect_error.hpp"
#include "support/random_inputs.hpp"

namespace attn {
namespace {

using testing::expect_error;

bool bitwise_equal(const Tensor& a, const Tensor& b) {
  const auto& va = a.view();
  return va.shape == b.view().shape &&
         std::memcmp(va.data, b.view().data, static_cast<size_t>(va.numel()) * dtype_size(va.dtype)) == 0;
}

// A float32 copy of t with every value rounded to bf16.
testing::Buffer rounded(const testing::Buffer& t) {
  testing::Buffer r = t;
  r.view.data = r.bytes.data() + (static_cast<const uint8_t*>(t.view.data) - t.bytes.data());
  float* x = reinterpret_cast<float*>(r.bytes.data());
  kernels::round_to_bf16(x, static_cast<int64_t>(r.bytes.size() / sizeof(float)));
  return r;
}

struct Qkv {
  std::mt19937 rng{5};
  DType dtype;
  testing::Buffer q, k, v;
  explicit Qkv(DType t, int64_t N = 150, int64_t M = 230, int64_t D = 40)
      : dtype(t), q(testing::random_tensor(rng, t, 2, 4, N, D)), k(testing::random_tensor(rng, t, 2, 2, M, D)),
        v(testing::random_tensor(rng, t, 2, 2, M, D)) {}
};

std::string chosen(const Qkv& s, Precision p, const char* mech = "softmax:causal") {
  AttendOptions o;
  o.precision = p;
  return explain(s.q.view, s.k.view, s.v.view, parse_mechanism(mech), o).chosen;
}

TEST(Precision, AutoComputesInBf16ExactlyWhenQKVAreAllBf16) {
  const Qkv bf(DType::bf16), f(DType::f32);
  EXPECT_EQ(chosen(bf, Precision::automatic), "tiled_bf16");
  EXPECT_EQ(chosen(bf, Precision::f32), "tiled");
  EXPECT_EQ(chosen(f, Precision::automatic), "tiled");
  EXPECT_EQ(chosen(f, Precision::bf16), "tiled_bf16");
  // decode-shaped calls stay on the rows form (memory-bound) unless bf16 is asked for
  const Qkv one(DType::bf16, 1);
  EXPECT_EQ(chosen(one, Precision::automatic), "rows");
  EXPECT_EQ(chosen(one, Precision::bf16), "tiled_bf16");
}

// bf16 products on float32 inputs are the products of the inputs rounded to bf16: bitwise the
// same as passing the rounded values, on every ISA path.
TEST(Precision, Bf16OnFloat32InputsIsTheRoundedInputs) {
  const Qkv s(DType::f32);
  const testing::Buffer q = rounded(s.q), k = rounded(s.k), v = rounded(s.v);
  for (Isa isa : supported_isas()) {
    AttendOptions o;
    o.isa = isa;
    o.precision = Precision::bf16;
    o.return_lse = true;
    const Mechanism m = parse_mechanism("softmax:causal,softcap=20");
    const AttendResult a = attend(s.q.view, s.k.view, s.v.view, m, o);
    const AttendResult b = attend(q.view, k.view, v.view, m, o);
    EXPECT_TRUE(bitwise_equal(a.out, b.out)) << isa_name(isa);
    EXPECT_TRUE(bitwise_equal(a.lse, b.lse)) << isa_name(isa);
    // and they differ from float32 products (the option does something)
    o.precision = Precision::f32;
    const AttendResult c = attend(s.q.view, s.k.view, s.v.view, m, o);
    EXPECT_FALSE(bitwise_equal(a.out, c.out)) << isa_name(isa);
  }
}

// The backward the same way: dq, dk, dv of float32 inputs with bf16 products are those of the
// inputs (and dout) rounded to bf16, on every ISA path, and bitwise the same for any thread count.
TEST(Precision, Bf16BackwardIsTheRoundedInputsForAnyThreadCount) {
  const Qkv s(DType::f32, 130, 170, 48);
  std::mt19937 rng(9);
  const testing::Buffer dout = testing::random_tensor(rng, DType::f32, 2, 4, 130, 48);
  const testing::Buffer q = rounded(s.q), k = rounded(s.k), v = rounded(s.v), dr = rounded(dout);
  const Mechanism m = parse_mechanism("softmax:causal,softcap=20");
  for (Isa isa : supported_isas()) {
    AttendOptions o;
    o.isa = isa;
    o.precision = Precision::bf16;
    o.return_lse = true;
    const AttendResult f = attend(s.q.view, s.k.view, s.v.view, m, o);
    o.return_lse = false;
    o.threads = 1;
    const AttendGradients a = attend_backward(dout.view, s.q.view, s.k.view, s.v.view, f.out.view(), f.lse.view(), m, o);
    const AttendGradients b = attend_backward(dr.view, q.view, k.view, v.view, f.out.view(), f.lse.view(), m, o);
    EXPECT_EQ(explain_backward(s.q.view, s.k.view, s.v.view, m, o).chosen, "tiled_bf16");
    for (const auto& [x, y] : {std::pair{&a.dq, &b.dq}, {&a.dk, &b.dk}, {&a.dv, &b.dv}})
      EXPECT_TRUE(bitwise_equal(*x, *y)) << isa_name(isa);
    o.threads = 3;
    const AttendGradients c = attend_backward(dout.view, s.q.view, s.k.view, s.v.view, f.out.view(), f.lse.view(), m, o);
    for (const auto& [x, y] : {std::pair{&a.dq, &c.dq}, {&a.dk, &c.dk}, {&a.dv, &c.dv}})
      EXPECT_TRUE(bitwise_equal(*x, *y)) << isa_name(isa) << " 3 threads";
  }
}

TEST(Precision, Bf16IsBitwiseTheSameForAnyThreadCount) {
  const Qkv s(DType::bf16, 300, 300, 64);
  for (Isa isa : supported_isas())
    for (const char* mech : {"softmax:causal", "softmax:dropout=0.1,seed=3", "softmax:window=50:0"}) {
      AttendOptions o;
      o.isa = isa;
      o.return_lse = true;
      o.threads = 1;
      const AttendResult one = attend(s.q.view, s.k.view, s.v.view, parse_mechanism(mech), o);
      for (int t : {2, 3}) {
        o.threads = t;
        const AttendResult many = attend(s.q.view, s.k.view, s.v.view, parse_mechanism(mech), o);
        EXPECT_TRUE(bitwise_equal(one.out, many.out)) << mech << " " << isa_name(isa) << " threads " << t;
        EXPECT_TRUE(bitwise_equal(one.lse, many.lse)) << mech << " " << isa_name(isa) << " threads " << t;
      }
    }
}

// Every ISA path computes the same exact products (vdpbf16ps where the CPU has AVX512-BF16, the
// float32 kernels on rounded operands elsewhere); they may differ only in how float32 sums and
// exponentials round (and the emulation scales q after rounding it), which now and then tips a
// weight's bf16 rounding the other way (moving an output by up to p |v| 2^-8): a small part of
// what bf16 products change against float32 ones (measured 0.11 of it at most, Zen 5).
TEST(Precision, EveryIsaPathAgreesWithThePortableOne) {
  const Qkv s(DType::f32, 200, 333, 72);
  const auto max_diff = [](const AttendResult& a, const AttendResult& b) {
    const float* x = static_cast<const float*>(a.out.view().data);
    const float* y = static_cast<const float*>(b.out.view().data);
    double worst = 0;
    for (int64_t i = 0; i < a.out.view().numel(); ++i) worst = std::max(worst, std::abs(double(x[i]) - y[i]));
    return worst;
  };
  AttendOptions o;
  o.isa = Isa::portable;
  o.precision = Precision::f32;
  const AttendResult f32 = attend(s.q.view, s.k.view, s.v.view, parse_mechanism("softmax"), o);
  o.precision = Precision::bf16;
  const AttendResult base = attend(s.q.view, s.k.view, s.v.view, parse_mechanism("softmax"), o);
  const double bf16_effect = max_diff(base, f32);
  EXPECT_GT(bf16_effect, 1e-3);
  for (Isa isa : supported_isas()) {
    o.isa = isa;
    const double d = max_diff(attend(s.q.view, s.k.view, s.v.view, parse_mechanism("softmax"), o), base);
    EXPECT_LT(d, 0.25 * bf16_effect) << isa_name(isa) << (kernels::bf16_kernels_for(isa) ? " (vdpbf16ps)" : "");
  }
}

TEST(Precision, BadValuesAndFamiliesThatCannotAreErrors) {
  expect_error([] { parse_precision("fp8", "precision"); }, "precision: expected auto, f32 or bf16, got 'fp8'");
  const Qkv s(DType::f32);
  AttendOptions o;
  o.precision = Precision::bf16;
  expect_error([&] { attend(s.q.view, s.k.view, s.v.view, parse_mechanism("linear"), o); },
               "precision: linear computes in float32 only");
  // the tiled_bf16 form refuses what it cannot compute, and so does every other form: an Error
  // listing each form's reasons, not a silent float32 run
  expect_error([&] { attend(s.q.view, s.k.view, s.v.view, parse_mechanism("softmax:score=cosine"), o); },
               "score=cosine (dot only)");
  expect_error([&] { attend(s.q.view, s.k.view, s.v.view, parse_mechanism("softmax:score=cosine"), o); },
               "precision bf16 (tiled_bf16 computes in bf16)");
  AttendOptions forced;
  forced.precision = Precision::f32;
  forced.form = "tiled_bf16";
  expect_error([&] { attend(s.q.view, s.k.view, s.v.view, parse_mechanism("softmax"), forced); }, "precision f32");
  EXPECT_EQ(precision_name(parse_precision("auto", "x")), "auto");
  EXPECT_EQ(precision_name(parse_precision("bf16", "x")), "bf16");
}

}  // namespace
}  // namespace attn
