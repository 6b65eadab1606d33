// The fast path against the float64 reference, on every ISA this CPU runs, across shapes,
// masks, dtypes and layouts.
//
// Tolerance rule (docs/testing.md): max|fast - ref64| <= 2 * max|plain - ref64| + floor, where
// `plain` is the reference algorithm in float with intermediates rounded to the storage dtype,
// and floor = 1e-6 * max(1, max|ref|) plus, for bf16/fp16, the dtype's rounding floor
// 2 * max|(ref + 0.3 - 0.3) - ref| evaluated in that dtype. LSE: |fast - ref| <= 1e-5 * (1 + |ref|).
#include <gtest/gtest.h>

#include <cmath>
#include <sstream>

#include "exact/problem.hpp"
#include "exact/reference.hpp"
#include "exact/softmax_rows.hpp"
#include "support/random_inputs.hpp"

namespace attn {
namespace {

using testing::Buffer;
using testing::random_tensor;

struct Case {
  int64_t B = 1, H = 2, Hkv = 2, N = 17, M = 17, D = 32, Dv = 32;
  DType dtype = DType::f32;
  Layout layout = Layout::bhnd;
  std::string mech = "softmax";
  bool padding = false, bool_mask = false, bias = false, alibi = false, additive = false;
  float magnitude = 1.0f;
  int64_t pad = 0;  // extra elements per token row (non-packed strides)
  std::string name() const {
    std::ostringstream s;
    s << "B" << B << "H" << H << "kv" << Hkv << "N" << N << "M" << M << "D" << D << "Dv" << Dv << "_"
      << dtype_name(dtype) << (layout == Layout::bnhd ? "_bnhd" : "") << "_" << mech
      << (padding ? "_pad" : "") << (bool_mask ? "_mask" : "") << (bias ? "_bias" : "")
      << (alibi ? "_alibi" : "") << "_x" << magnitude << (pad ? "_strided" : "");
    std::string r = s.str();
    for (char& c : r)
      if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
    return r;
  }
};

std::ostream& operator<<(std::ostream& o, const Case& c) { return o << c.name(); }

struct Inputs {
  Buffer q, k, v;
  std::vector<uint8_t> mask;
  std::vector<float> bias;
  AttendOptions opt;
};

Inputs make_inputs(const Case& c, uint32_t seed = 1234) {
  std::mt19937 rng(seed);
  Inputs in;
  in.q = random_tensor(rng, c.dtype, c.B, c.H, c.N, c.D, c.layout, c.magnitude, c.pad);
  in.k = random_tensor(rng, c.dtype, c.B, c.Hkv, c.M, c.D, c.layout, c.magnitude, c.pad);
  in.v = random_tensor(rng, c.dtype, c.B, c.Hkv, c.M, c.Dv, c.layout, 1.0f, c.pad);
  if (c.padding) {
    std::uniform_int_distribution<int64_t> len(0, c.M);
    for (int64_t b = 0; b < c.B; ++b) in.opt.key_padding_lengths.push_back(b == 0 ? c.M : len(rng));
  }
  if (c.bool_mask) {  // (1, H, N, M): broadcast over batch
    in.mask.resize(static_cast<size_t>(c.H * c.N * c.M));
    std::bernoulli_distribution keep(0.7);
    for (auto& m : in.mask) m = keep(rng);
    TensorView mv;
    mv.data = in.mask.data();
    mv.dtype = DType::boolean;
    mv.shape = {1, c.H, c.N, c.M};
    mv.strides = {0, c.N * c.M, c.M, 1};
    in.opt.mask = mv;
  }
  if (c.bias) {  // (B, 1, N, M) float, with a few -inf entries
    in.bias.resize(static_cast<size_t>(c.B * c.N * c.M));
    std::normal_distribution<float> d(0.0f, 1.0f);
    std::bernoulli_distribution hide(0.05);
    for (auto& x : in.bias) x = hide(rng) ? -INFINITY : d(rng);
    TensorView bv;
    bv.data = in.bias.data();
    bv.dtype = DType::f32;
    bv.shape = {c.B, 1, c.N, c.M};
    bv.strides = {c.N * c.M, 0, c.M, 1};
    in.opt.bias = bv;
  }
  if (c.alibi)
    for (int64_t h = 0; h < c.H; ++h) in.opt.alibi_slopes.push_back(std::pow(2.0f, -8.0f * (h + 1) / c.H));
  if (c.additive) {
    const int64_t A = 5;
    std::normal_distribution<float> d(0.0f, 0.3f);
    AdditiveWeights w;
    for (int64_t i = 0; i < A * c.D; ++i) w.wq.push_back(d(rng)), w.wk.push_back(d(rng));
    for (int64_t i = 0; i < A; ++i) w.w.push_back(d(rng) * 3);
    in.opt.additive = w;
  }
  in.opt.return_lse = true;
  return in;
}

double floor_for(DType dt, const exact::ReferenceResult& ref) {
  double max_ref = 0, noise = 0;
  for (double x : ref.out) {
    max_ref = std::max(max_ref, std::abs(x));
    const float r = round_to(dt, static_cast<float>(x));
    noise = std::max(noise, std::abs(static_cast<double>(round_to(dt, round_to(dt, r + 0.3f) - 0.3f)) - x));
  }
  return 1e-6 * std::max(1.0, max_ref) + (dt == DType::f32 ? 0.0 : 2 * noise);
}

class SoftmaxVsReference : public ::testing::TestWithParam<Case> {};

void check_case(const Case& c) {
  Inputs in = make_inputs(c);
  const Mechanism mech = parse_mechanism(c.mech);
  const auto& sm = std::get<Softmax>(mech);
  Tensor ref_out(c.dtype, {c.B, c.H, c.N, c.Dv});
  const auto p = exact::validate_softmax(in.q.view, in.k.view, in.v.view, sm, in.opt, ref_out.view(), nullptr, nullptr);
  const auto ref = exact::reference_softmax(p, exact::RefPrecision::f64);
  const auto plain = exact::reference_softmax(p, exact::RefPrecision::plain);
  double plain_err = 0;
  for (size_t i = 0; i < ref.out.size(); ++i) plain_err = std::max(plain_err, std::abs(plain.out[i] - ref.out[i]));
  const double tol = 2 * plain_err + floor_for(c.dtype, ref);

  // Few-query problems run on the row (split-K) path unless probabilities are requested; check
  // both that path and the tiled one on every ISA.
  for (Isa isa : supported_isas()) {
    for (bool row_path : {true, false}) {
      SCOPED_TRACE("isa " + isa_name(isa) + (row_path ? "" : ", tiled path forced"));
      if (!row_path && !exact::softmax_rows_fits(p, nullptr)) continue;
      exact::set_row_path_enabled(row_path);
      AttendOptions opt = in.opt;
      opt.isa = isa;
      opt.return_probs = c.N * c.M <= 20000 && !exact::softmax_rows_fits(p, nullptr);
      const AttendResult r = attend(in.q.view, in.k.view, in.v.view, mech, opt);
      exact::set_row_path_enabled(true);
      double err = 0;
      for (int64_t b = 0; b < c.B; ++b)
        for (int64_t h = 0; h < c.H; ++h)
          for (int64_t i = 0; i < c.N; ++i) {
            for (int64_t d = 0; d < c.Dv; ++d) {
              const double got = r.out.at(b, h, i, d);
              ASSERT_TRUE(std::isfinite(got)) << "out(" << b << "," << h << "," << i << "," << d << ")";
              err = std::max(err, std::abs(got - ref.o(b, h, i, d)));
            }
            const double want_lse = ref.l(b, h, i), got_lse = r.lse.at(b, h, i, 0);
            if (std::isinf(want_lse))
              ASSERT_EQ(got_lse, want_lse) << "lse row " << i << " sees no key";
            else
              ASSERT_NEAR(got_lse, want_lse, 1e-5 * (1 + std::abs(want_lse))) << "lse row " << i;
            if (opt.return_probs)
              for (int64_t j = 0; j < c.M; ++j)
                ASSERT_NEAR(r.probs.at(b, h, i, j), ref.p(b, h, i, j), 2e-6 + 2 * std::abs(plain.p(b, h, i, j) - ref.p(b, h, i, j)))
                    << "probs(" << i << "," << j << ")";
          }
      EXPECT_LE(err, tol) << "plain " << dtype_name(c.dtype) << " error " << plain_err;
    }
  }
}

std::vector<Case> cases() {
  std::vector<Case> out;
  // Lengths and head dims that straddle the 64-query and 64-key tiles and the micro-tiles.
  const int64_t lens[] = {1, 7, 63, 64, 65, 127, 129};
  for (int64_t n : lens)
    for (int64_t m : {int64_t{1}, int64_t{65}, n}) {
      Case c;
      c.N = n, c.M = m;
      c.D = c.Dv = (n * 7 + m) % 3 == 0 ? 64 : 32;
      out.push_back(c);
      c.mech = "softmax:causal";
      out.push_back(c);
    }
  for (int64_t d : {1, 7, 32, 64, 80, 128, 256}) {
    Case c;
    c.N = 33, c.M = 70, c.D = d, c.Dv = d == 80 ? 48 : d;
    out.push_back(c);
  }
  for (DType dt : {DType::f32, DType::bf16, DType::f16})
    for (Layout lay : {Layout::bhnd, Layout::bnhd})
      for (const char* mech : {"softmax", "softmax:causal", "softmax:window=20:5", "softmax:causal,window=16:0"}) {
        Case c;
        c.B = 2, c.H = 4, c.Hkv = 2, c.N = 77, c.M = 131, c.D = 40, c.Dv = 24;
        c.dtype = dt, c.layout = lay, c.mech = mech;
        out.push_back(c);
      }
  for (int64_t hkv : {1, 2, 6}) {  // MQA, GQA, MHA
    Case c;
    c.H = 6, c.Hkv = hkv, c.N = 65, c.M = 65, c.D = 16, c.Dv = 16, c.mech = "softmax:causal";
    out.push_back(c);
  }
  const char* mechs[] = {"softmax:scale=0.05", "softmax:softcap=10", "softmax:softcap=30,scale=1",
                         "softmax:score=cosine,scale=4", "softmax:entropy_scale=32",
                         "softmax:causal,entropy_scale=16", "softmax:window=0:0", "softmax:window=-1:3",
                         "softmax:dropout=0.25,seed=9", "softmax:causal,dropout=0.5,seed=3"};
  for (const char* mech : mechs)
    for (DType dt : {DType::f32, DType::bf16}) {
      Case c;
      c.B = 2, c.H = 2, c.Hkv = 1, c.N = 70, c.M = 90, c.D = 24, c.Dv = 20, c.mech = mech, c.dtype = dt;
      out.push_back(c);
    }
  for (int flags = 1; flags < 16; ++flags) {  // padding, boolean mask, bias, alibi combinations
    Case c;
    c.B = 3, c.H = 2, c.Hkv = 2, c.N = 66, c.M = 100, c.D = 16, c.Dv = 8;
    c.padding = flags & 1, c.bool_mask = flags & 2, c.bias = flags & 4, c.alibi = flags & 8;
    c.mech = flags % 3 == 0 ? "softmax:causal" : "softmax";
    out.push_back(c);
  }
  for (float mag : {3.0f, 5.0f, 100.0f})
    for (const char* mech : {"softmax", "softmax:softcap=50"}) {
      Case c;
      c.N = 40, c.M = 129, c.D = 32, c.Dv = 32, c.magnitude = mag, c.mech = mech;
      out.push_back(c);
    }
  {
    Case c;  // non-packed token stride, both layouts
    c.N = 65, c.M = 63, c.D = 24, c.Dv = 24, c.pad = 5;
    out.push_back(c);
    c.layout = Layout::bnhd, c.dtype = DType::f16;
    out.push_back(c);
  }
  {
    Case c;  // additive (Bahdanau) scores
    c.N = 20, c.M = 33, c.D = 8, c.Dv = 8, c.additive = true, c.mech = "softmax:score=additive";
    out.push_back(c);
    c.mech = "softmax:score=additive,causal,scale=0.5", c.dtype = DType::bf16;
    out.push_back(c);
  }
  // Decode-shaped: a few new queries against a long cache (row path, split-K over key chunks).
  for (int64_t n : {1, 2, 3})
    for (int64_t m : {1, 255, 256, 257, 1000, 5000}) {
      Case c;
      c.B = 2, c.H = 8, c.Hkv = n == 1 ? 1 : 4, c.N = n, c.M = m, c.D = 64, c.Dv = 40, c.mech = "softmax:causal";
      c.dtype = m % 2 ? DType::bf16 : DType::f32;
      c.layout = n == 2 ? Layout::bnhd : Layout::bhnd;
      out.push_back(c);
    }
  for (int64_t d : {1, 3}) {
    // Regression: the row path kept R = group * N scores in a buffer sized by the head dim, and
    // overflowed it when R > D (found by the Python property tests, D = 1 with 8 rows per kv head).
    Case c;
    c.B = 1, c.H = 8, c.Hkv = 1, c.N = 2, c.M = 300, c.D = d, c.Dv = d;
    out.push_back(c);
  }
  for (int flags = 1; flags < 16; flags += 2) {
    Case c;  // decode with padding + masks/bias/alibi, softcap and windows
    c.B = 3, c.H = 4, c.Hkv = 2, c.N = 2, c.M = 700, c.D = 32, c.Dv = 32;
    c.padding = true, c.bool_mask = flags & 2, c.bias = flags & 4, c.alibi = flags & 8;
    c.mech = flags == 1 ? "softmax:softcap=20" : (flags == 3 ? "softmax:causal,window=300:0" : "softmax:entropy_scale=64");
    out.push_back(c);
  }
  {
    Case c;  // more queries than keys: causal rows before the diagonal see nothing
    c.N = 100, c.M = 30, c.D = 16, c.Dv = 16, c.mech = "softmax:causal";
    out.push_back(c);
  }
  return out;
}

TEST_P(SoftmaxVsReference, WithinTwiceThePlainError) { check_case(GetParam()); }

// Seeded random problems (the C++ twin of the Python property tests, so random shapes also run
// under ASan/UBSan): small sizes, any head grouping, dtype, layout, mask and option.
TEST(SoftmaxRandomProblems, WithinTwiceThePlainError) {
  std::mt19937 rng(20261123);
  auto pick = [&](auto... xs) {
    const std::vector<int64_t> v{xs...};
    return v[std::uniform_int_distribution<size_t>(0, v.size() - 1)(rng)];
  };
  const char* mechs[] = {"softmax", "softmax:causal", "softmax:window=5:2", "softmax:causal,softcap=15",
                         "softmax:scale=0.3", "softmax:entropy_scale=32"};
  for (int n = 0; n < 120; ++n) {
    Case c;
    c.B = pick(1, 2, 3);
    c.Hkv = pick(1, 2, 3);
    c.H = c.Hkv * pick(1, 2, 4, 8);
    c.N = pick(1, 2, 3, 5, 17, 64, 65, 130);
    c.M = pick(1, 2, 7, 63, 64, 65, 129, 300);
    c.D = pick(1, 2, 3, 8, 17, 33);
    c.Dv = pick(1, 4, 16, 33);
    c.dtype = std::array{DType::f32, DType::bf16, DType::f16}[pick(0, 1, 2)];
    c.layout = pick(0, 1) ? Layout::bnhd : Layout::bhnd;
    c.mech = mechs[pick(0, 1, 2, 3, 4, 5)];
    c.padding = pick(0, 1), c.bool_mask = pick(0, 0, 1), c.bias = pick(0, 0, 1), c.alibi = pick(0, 0, 1);
    c.pad = pick(0, 0, 3);
    SCOPED_TRACE(c.name());
    check_case(c);
    if (::testing::Test::HasFatalFailure()) return;
  }
}

INSTANTIATE_TEST_SUITE_P(Exact, SoftmaxVsReference, ::testing::ValuesIn(cases()),
                         [](const auto& info) { return std::to_string(info.index) + "_" + info.param.name(); });

}  // namespace
}  // namespace attn
