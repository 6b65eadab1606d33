// Every bad input gets an Error whose message names the problem.
#include <gtest/gtest.h>

#include <cstring>

#include "support/expect_error.hpp"
#include "support/random_inputs.hpp"

namespace attn {
namespace {

struct Inputs3 {
  std::mt19937 rng{7};
  testing::Buffer q = testing::random_tensor(rng, DType::f32, 2, 4, 5, 8);
  testing::Buffer k = testing::random_tensor(rng, DType::f32, 2, 2, 6, 8);
  testing::Buffer v = testing::random_tensor(rng, DType::f32, 2, 2, 6, 8);
};

using testing::expect_error;

TEST(Validation, HeadsMustDivide) {
  Inputs3 s;
  auto k = s.k.view;
  k.shape[1] = 3;
  auto v = s.v.view;
  v.shape[1] = 3;
  expect_error([&] { attend(s.q.view, k, v, Softmax{}); }, "k has 3 heads, which does not divide q's 4");
}

TEST(Validation, ShapesAndDtypes) {
  Inputs3 s;
  auto k = s.k.view;
  k.shape[3] = 7;
  expect_error([&] { attend(s.q.view, k, s.v.view, Softmax{}); }, "k has head_dim 7, q has 8");
  auto v = s.v.view;
  v.shape[2] = 5;
  expect_error([&] { attend(s.q.view, s.k.view, v, Softmax{}); }, "v must have shape");
  auto kb = s.k.view;
  kb.shape[0] = 1;
  expect_error([&] { attend(s.q.view, kb, s.v.view, Softmax{}); }, "k has batch 1, q has 2");
  auto k16 = s.k.view;
  k16.dtype = DType::f16;
  expect_error([&] { attend(s.q.view, k16, s.v.view, Softmax{}); }, "must share a dtype");
  auto qb = s.q.view;
  qb.dtype = DType::boolean;
  expect_error([&] { attend(qb, s.k.view, s.v.view, Softmax{}); }, "q must be float32, bfloat16 or float16");
  auto q0 = s.q.view;
  q0.shape[3] = 0;
  expect_error([&] { attend(q0, s.k.view, s.v.view, Softmax{}); }, "head_dim of q must be at least 1");
  auto qn = s.q.view;
  qn.shape[2] = -1;
  expect_error([&] { attend(qn, s.k.view, s.v.view, Softmax{}); }, "q has negative dimension 2 in shape (2, 4, -1, 8)");
}

TEST(Validation, OverflowingSizes) {
  Inputs3 s;
  auto q = s.q.view;
  q.shape = {int64_t{1} << 40, int64_t{1} << 20, 4, 8};
  auto k = s.k.view;
  k.shape[0] = q.shape[0];
  auto v = s.v.view;
  v.shape[0] = q.shape[0];
  expect_error([&] {
    AttendOptions o;
    Tensor out;
    attend_into(q, k, v, Softmax{}, o, q, nullptr, nullptr);
  }, "overflows 64-bit sizes");
}

TEST(Validation, MechanismParameters) {
  Inputs3 s;
  Softmax m;
  m.scale = 0.0;
  expect_error([&] { attend(s.q.view, s.k.view, s.v.view, m); }, "softmax scale must be in [1e-30, 1e+12], got 0");
  m.scale = std::nan("");
  expect_error([&] { attend(s.q.view, s.k.view, s.v.view, m); }, "softmax scale must be in [1e-30, 1e+12], got nan");
  m = Softmax{};
  m.window_left = -3;
  expect_error([&] { attend(s.q.view, s.k.view, s.v.view, m); }, "window must be LEFT:RIGHT");
  m = Softmax{};
  m.softcap = -1;
  expect_error([&] { attend(s.q.view, s.k.view, s.v.view, m); }, "softmax softcap must be in [1e-30, 1e+30], got -1 (0 = off)");
  m = Softmax{};
  m.dropout = 1.0;
  expect_error([&] { attend(s.q.view, s.k.view, s.v.view, m); }, "softmax dropout must be in [0, 1), got 1");
  m = Softmax{};
  m.entropy_train_len = 1;
  expect_error([&] { attend(s.q.view, s.k.view, s.v.view, m); }, "entropy_scale training length");
  m = Softmax{};
  m.score = ScoreKind::additive;
  expect_error([&] { attend(s.q.view, s.k.view, s.v.view, m); },
               "softmax:score=additive needs params['wq'] of shape (A, D)");
}

// Hardening, class 1: a thread count that cannot be honoured is an Error, not a crash.
TEST(Validation, ThreadCountBeyondTheLimit) {
  Inputs3 s;
  AttendOptions o;
  o.threads = 100000;
  expect_error([&] { attend(s.q.view, s.k.view, s.v.view, Softmax{}, o); },
               "threads must be in [0, 256] (0 = all CPUs), got 100000");
  o.threads = -1;
  expect_error([&] { attend(s.q.view, s.k.view, s.v.view, Softmax{}, o); }, "threads must be in [0, 256]");
  o.threads = 256;  // allowed: oversubscribed, same result
  o.return_lse = true;
  const auto many = attend(s.q.view, s.k.view, s.v.view, Softmax{}, o);
  o.threads = 1;
  const auto one = attend(s.q.view, s.k.view, s.v.view, Softmax{}, o);
  EXPECT_EQ(0, std::memcmp(many.out.view().data, one.out.view().data, 2 * 4 * 5 * 8 * sizeof(float)));
}

// Hardening, class 5: validation before any allocation, scratch in proportion to the inputs.
TEST(Validation, NothingIsAllocatedBeforeTheShapesAreChecked) {
  Inputs3 s;
  auto q = s.q.view;
  q.shape = {1, 1, int64_t{1} << 40, 0};  // head dim 0: zero elements, but 2^40 output rows
  q.strides = {0, 0, 0, 1};
  auto k = s.k.view, v = s.v.view;
  k.shape[0] = v.shape[0] = 1;
  k.shape[1] = v.shape[1] = 1;
  k.shape[3] = 0;
  expect_error([&] { attend(q, k, v, Softmax{}); }, "head_dim of q must be at least 1");
}

TEST(Validation, HugeHeadDimKeepsScratchSmall) {
  const int64_t D = int64_t{1} << 20;  // N = M = 1: 4 MiB per input
  std::mt19937 rng(1);
  auto q = testing::random_tensor(rng, DType::f32, 1, 1, 1, D, Layout::bhnd, 0.001f);
  auto k = testing::random_tensor(rng, DType::f32, 1, 1, 1, D, Layout::bhnd, 0.001f);
  auto v = testing::random_tensor(rng, DType::f32, 1, 1, 1, D);
  AttendOptions o;
  o.return_probs = true;  // rows refuses (probabilities), tiled refuses (scratch): the reference runs
  const Explanation e = explain(q.view, k.view, v.view, Softmax{}, o);
  EXPECT_EQ(e.chosen, "reference");
  ASSERT_EQ(e.forms[2].form, "tiled");
  ASSERT_EQ(e.forms[2].reasons.size(), 1u);
  EXPECT_NE(e.forms[2].reasons[0].find("MiB of scratch per thread, more than 4x the inputs"), std::string::npos);
  o.return_probs = false;
  EXPECT_EQ(explain(q.view, k.view, v.view, Softmax{}, o).chosen, "rows");
  const auto r = attend(q.view, k.view, v.view, Softmax{}, o);  // one key: the output is v
  for (int64_t c = 0; c < D; c += 4099) EXPECT_EQ(r.out.at(0, 0, 0, c), v.view.at(0, 0, 0, c));
}

TEST(Validation, NamedParams) {
  Inputs3 s;
  std::vector<float> wq(3 * 8, 0.1f), wk(3 * 8, 0.2f), w(3, 1.0f), bad(3 * 7, 0.0f);
  AttendOptions o;
  o.params["wq"] = make_array_view(wq.data(), DType::f32, {3, 8});
  o.params["wk"] = make_array_view(wk.data(), DType::f32, {3, 8});
  o.params["w"] = make_array_view(w.data(), DType::f32, {3});
  const Mechanism additive = parse_mechanism("softmax:score=additive");
  EXPECT_NO_THROW(attend(s.q.view, s.k.view, s.v.view, additive, o));
  // a parameter the mechanism does not take
  expect_error([&] { attend(s.q.view, s.k.view, s.v.view, Softmax{}, o); },
               "params has 'w', which softmax does not take (it takes: none)");
  o.params["wx"] = o.params["w"];
  expect_error([&] { attend(s.q.view, s.k.view, s.v.view, additive, o); },
               "params has 'wx', which softmax:score=additive does not take (it takes: wq, wk, w)");
  o.params.erase("wx");
  // wrong shapes: D fixed by q, A bound by wq's first dimension
  o.params["wk"] = make_array_view(bad.data(), DType::f32, {3, 7});
  expect_error([&] { attend(s.q.view, s.k.view, s.v.view, additive, o); },
               "params['wk'] must have shape (A, D) with D = 8, got (3, 7)");
  o.params["wk"] = make_array_view(wk.data(), DType::f32, {3, 8});
  o.params["w"] = make_array_view(w.data(), DType::f32, {2});
  expect_error([&] { attend(s.q.view, s.k.view, s.v.view, additive, o); },
               "params['w'] must have shape (A,) with A = 3, got (2,)");
  o.params["w"] = make_array_view(w.data(), DType::f32, {3, 1});
  expect_error([&] { attend(s.q.view, s.k.view, s.v.view, additive, o); }, "params['w'] must have shape (A,), got (3, 1)");
  std::vector<uint8_t> flags(3, 1);
  o.params["w"] = make_array_view(flags.data(), DType::boolean, {3});
  expect_error([&] { attend(s.q.view, s.k.view, s.v.view, additive, o); }, "params['w'] must be float32");
  w[1] = NAN;
  o.params["w"] = make_array_view(w.data(), DType::f32, {3});
  expect_error([&] { attend(s.q.view, s.k.view, s.v.view, additive, o); }, "params['w'] must be finite");
}

TEST(Forms, ForcedFormThatRefusesListsEveryReason) {
  Inputs3 s;  // 2 query heads per kv head, N = 5: 10 rows per kv head fit the rows form
  AttendOptions o;
  o.form = "rows";
  o.return_probs = true;
  expect_error([&] { attend(s.q.view, s.k.view, s.v.view, parse_mechanism("softmax:dropout=0.1"), o); },
               "form 'rows' cannot run softmax:dropout=0.1 for these inputs; forms: rows: probabilities requested, "
               "dropout; tiled_bf16: q, k, v are float32, float32, float32 (precision auto computes in bf16 when all three "
               "are bfloat16); tiled: supported; reference: supported");
  o.form = "fast";
  expect_error([&] { attend(s.q.view, s.k.view, s.v.view, Softmax{}, o); },
               "form must be one of rows, tiled_bf16, tiled, reference for softmax, got 'fast'");
}

TEST(Forms, ExplainSaysWhichFormRunsAndWhy) {
  Inputs3 s;
  AttendOptions o;
  Explanation e = explain(s.q.view, s.k.view, s.v.view, Softmax{}, o);
  EXPECT_EQ(e.chosen, "rows");
  ASSERT_EQ(e.forms.size(), 4u);
  EXPECT_TRUE(e.forms[0].reasons.empty());
  o.return_probs = true;
  e = explain(s.q.view, s.k.view, s.v.view, Softmax{}, o);
  EXPECT_EQ(e.chosen, "tiled");
  EXPECT_EQ(e.forms[0].reasons, std::vector<std::string>{"probabilities requested"});
  EXPECT_NE(e.text().find("rows        refused: probabilities requested"), std::string::npos) << e.text();
  EXPECT_NE(e.text().find("tiled       chosen"), std::string::npos) << e.text();
  o.form = "reference";
  EXPECT_EQ(explain(s.q.view, s.k.view, s.v.view, Softmax{}, o).chosen, "reference");
  // explain validates like attend
  auto k = s.k.view;
  k.shape[3] = 7;
  expect_error([&] { explain(s.q.view, k, s.v.view, Softmax{}, {}); }, "k has head_dim 7, q has 8");
}

TEST(Validation, MasksPaddingAlibi) {
  Inputs3 s;
  AttendOptions o;
  o.key_padding_lengths = {6};
  expect_error([&] { attend(s.q.view, s.k.view, s.v.view, Softmax{}, o); }, "one length per batch (2), got 1");
  o.key_padding_lengths = {6, 7};
  expect_error([&] { attend(s.q.view, s.k.view, s.v.view, Softmax{}, o); }, "key_padding_lengths[1] must be in [0, 6], got 7");
  o = {};
  std::vector<uint8_t> mask(5 * 7, 1);
  o.mask = make_view(mask.data(), DType::boolean, 1, 1, 5, 7);
  expect_error([&] { attend(s.q.view, s.k.view, s.v.view, Softmax{}, o); }, "mask must have shape (B|1, H|1, N, M) = (2|1, 4|1, 5, 6), got (1, 1, 5, 7)");
  std::vector<float> fmask(5 * 6, 0);
  o.mask = make_view(fmask.data(), DType::f32, 1, 1, 5, 6);
  expect_error([&] { attend(s.q.view, s.k.view, s.v.view, Softmax{}, o); }, "mask must be boolean");
  o = {};
  o.alibi_slopes = {1, 2, 3};
  expect_error([&] { attend(s.q.view, s.k.view, s.v.view, Softmax{}, o); }, "alibi_slopes must have H (4) or B*H (8) values, got 3");
  o.alibi_slopes = {1, 2, 3, INFINITY};
  expect_error([&] { attend(s.q.view, s.k.view, s.v.view, Softmax{}, o); }, "alibi_slopes[3] must be finite");
}

TEST(Validation, OutputsMustMatch) {
  Inputs3 s;
  Tensor out(DType::f32, {2, 4, 5, 7});
  expect_error([&] { attend_into(s.q.view, s.k.view, s.v.view, Softmax{}, {}, out.view(), nullptr, nullptr); },
               "out must have shape (B, H, N, Dv) = (2, 4, 5, 8), got (2, 4, 5, 7)");
  Tensor good(DType::f32, {2, 4, 5, 8});
  Tensor lse(DType::bf16, {2, 4, 5, 1});
  expect_error([&] { attend_into(s.q.view, s.k.view, s.v.view, Softmax{}, {}, good.view(), &lse.view(), nullptr); },
               "lse must be float32");
}

TEST(Validation, EmptyInputsGiveEmptyOrZeroOutput) {
  std::mt19937 rng(3);
  auto q = testing::random_tensor(rng, DType::f32, 1, 2, 0, 8);
  auto k = testing::random_tensor(rng, DType::f32, 1, 2, 4, 8);
  auto v = testing::random_tensor(rng, DType::f32, 1, 2, 4, 8);
  EXPECT_EQ(attend(q.view, k.view, v.view, Softmax{}).out.view().numel(), 0);
  // no keys at all: every row sees nothing -> zeros, lse = -inf
  auto q1 = testing::random_tensor(rng, DType::f32, 1, 2, 3, 8);
  auto k0 = testing::random_tensor(rng, DType::f32, 1, 2, 0, 8);
  auto v0 = testing::random_tensor(rng, DType::f32, 1, 2, 0, 8);
  AttendOptions o;
  o.return_lse = true;
  const auto r = attend(q1.view, k0.view, v0.view, Softmax{}, o);
  for (int64_t i = 0; i < 3; ++i) {
    EXPECT_EQ(r.out.at(0, 1, i, 5), 0.0f);
    EXPECT_EQ(r.lse.at(0, 1, i, 0), -INFINITY);
  }
}

}  // namespace
}  // namespace attn
