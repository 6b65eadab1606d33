// The reference itself, on cases small enough to work out by hand.
#include <gtest/gtest.h>

#include <cmath>

#include "softmax/problem.hpp"
#include "softmax/reference.hpp"
#include "support/random_inputs.hpp"

namespace attn {
namespace {

core::ReferenceResult run_ref(const std::vector<float>& q, const std::vector<float>& k,
                               const std::vector<float>& v, int64_t N, int64_t M, int64_t D,
                               const std::string& mech, AttendOptions opt = {}) {
  auto qv = make_view(const_cast<float*>(q.data()), DType::f32, 1, 1, N, D);
  auto kv = make_view(const_cast<float*>(k.data()), DType::f32, 1, 1, M, D);
  auto vv = make_view(const_cast<float*>(v.data()), DType::f32, 1, 1, M, D);
  Tensor out(DType::f32, {1, 1, N, D});
  const auto p = exact::validate_softmax(qv, kv, vv, std::get<Softmax>(parse_mechanism(mech)), opt,
                                         core::Outputs{&out.view()});
  return exact::reference_softmax(p);
}

TEST(Reference, SingleKeyReturnsItsValue) {
  const auto r = run_ref({1, 2}, {3, 4}, {5, -6}, 1, 1, 2, "softmax");
  EXPECT_DOUBLE_EQ(r.o(0, 0, 0, 0), 5);
  EXPECT_DOUBLE_EQ(r.o(0, 0, 0, 1), -6);
  EXPECT_DOUBLE_EQ(r.l(0, 0, 0), 11 / std::sqrt(2.0));
}

TEST(Reference, TwoKeysByHand) {
  // q = (1, 0), keys (1, 0) and (0, 1), scale 1: weights e/(e+1), 1/(e+1).
  const auto r = run_ref({1, 0}, {1, 0, 0, 1}, {1, 0, 0, 1}, 1, 2, 2, "softmax:scale=1");
  const double e = std::exp(1.0);
  EXPECT_NEAR(r.o(0, 0, 0, 0), e / (e + 1), 1e-15);
  EXPECT_NEAR(r.o(0, 0, 0, 1), 1 / (e + 1), 1e-15);
  EXPECT_NEAR(r.l(0, 0, 0), std::log(e + 1), 1e-15);
}

TEST(Reference, CausalIsBottomRightAligned) {
  // N = 2, M = 3: query 0 sees keys 0..1, query 1 sees keys 0..2.
  const auto r = run_ref({0, 0}, {0, 0, 0}, {1, 2, 30}, 2, 3, 1, "softmax:causal");
  EXPECT_NEAR(r.o(0, 0, 0, 0), 1.5, 1e-15);
  EXPECT_NEAR(r.o(0, 0, 1, 0), 11.0, 1e-15);
  EXPECT_EQ(r.p(0, 0, 0, 2), 0.0);
}

TEST(Reference, RowWithNoKeyIsZeroWithLseMinusInf) {
  // N = 3, M = 1, causal: queries 0 and 1 come before the only key.
  const auto r = run_ref({1, 1, 1}, {1}, {7}, 3, 1, 1, "softmax:causal");
  EXPECT_EQ(r.o(0, 0, 0, 0), 0.0);
  EXPECT_EQ(r.l(0, 0, 1), -INFINITY);
  EXPECT_NEAR(r.o(0, 0, 2, 0), 7.0, 1e-15);
}

TEST(Reference, SoftcapAndAlibiByHand) {
  AttendOptions opt;
  opt.alibi_slopes = {0.5f};
  // q = 2, keys (1, 1), scale 1, softcap 1: both scores tanh(2); ALiBi: key 0 at distance 1 gets -0.5.
  const auto r = run_ref({2}, {1, 1}, {0, 1}, 1, 2, 1, "softmax:scale=1,softcap=1", opt);
  const double w1 = 1 / (1 + std::exp(-0.5));
  EXPECT_NEAR(r.o(0, 0, 0, 0), w1, 1e-7);
  EXPECT_NEAR(r.l(0, 0, 0), std::tanh(2.0) + std::log(1 + std::exp(-0.5)), 1e-7);
}

TEST(Reference, EntropyScaleUsesVisibleKeys) {
  // 4 visible keys, training length 2: scale = log2(4)/sqrt(1) = 2.
  const auto r = run_ref({1}, {1, 0, 0, 0}, {1, 0, 0, 0}, 1, 4, 1, "softmax:entropy_scale=2");
  const double e2 = std::exp(2.0);
  EXPECT_NEAR(r.o(0, 0, 0, 0), e2 / (e2 + 3), 1e-12);
}

TEST(Reference, CosineIgnoresNorms) {
  const auto a = run_ref({1, 1}, {2, 0, 0, 5}, {1, 0, 0, 1}, 1, 2, 2, "softmax:score=cosine,scale=1");
  EXPECT_NEAR(a.o(0, 0, 0, 0), 0.5, 1e-15);  // both cosines are 1/sqrt(2)
}

TEST(Reference, DropoutKeepRatePassesBinomialTest) {
  const double p = 0.3;
  int64_t kept = 0, n = 0;
  for (int64_t i = 0; i < 200; ++i)
    for (int64_t j = 0; j < 500; ++j, ++n) kept += exact::dropout_keep(42, p, 0, 1, i, j);
  const double mean = n * (1 - p), sd = std::sqrt(n * p * (1 - p));
  EXPECT_LT(std::abs(kept - mean), 5 * sd);
}

}  // namespace
}  // namespace attn
