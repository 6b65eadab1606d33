// 8-bit KV rows (attn/kv_quant.hpp, AttendOptions::kv_scales): the rounding rule and its bound,
// zero, subnormal and non-finite rows; attention on int8 rows propagating a non-finite row to
// exactly the queries that see it, the same bits through a paged pool, families that cannot read
// them refusing (the case list checks the forms' arithmetic; tests/model/test_decoder.cpp the
// decoder's int8 caches).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "attn/attn.hpp"
#include "support/expect_error.hpp"
#include "support/random_inputs.hpp"

namespace attn {
namespace {

using testing::expect_error;

TEST(KvQuant, RowsRoundToTheNearestStepOfTheirScale) {
  std::mt19937 rng(3);
  std::normal_distribution<float> d(0.0f, 2.0f);
  for (int64_t n : {1, 7, 64, 129}) {
    std::vector<float> x(static_cast<size_t>(n));
    for (float& v : x) v = d(rng);
    std::vector<int8_t> q(x.size());
    const float s = quantize_row(x.data(), n, q.data());
    const float amax = std::abs(*std::max_element(x.begin(), x.end(), [](float a, float b) { return std::abs(a) < std::abs(b); }));
    EXPECT_FLOAT_EQ(s, amax / 127.0f);
    for (int64_t c = 0; c < n; ++c) {
      const double exact = static_cast<double>(x[c]) / (static_cast<double>(amax) / 127.0);
      EXPECT_EQ(q[c], static_cast<int8_t>(std::nearbyint(exact))) << c;  // the nearest integer
      EXPECT_LE(std::abs(s * q[c] - x[c]), s * (0.5f + 1e-5f)) << c;   // within half a step
    }
    int most = 0;  // the largest value takes the whole range
    for (int8_t v : q) most = std::max(most, std::abs(static_cast<int>(v)));
    EXPECT_EQ(most, 127);
  }
}

TEST(KvQuant, ZeroSubnormalAndNonFiniteRows) {
  std::vector<int8_t> q(4, 5);
  const float zeros[4] = {0, -0.0f, 0, 0};
  EXPECT_EQ(quantize_row(zeros, 4, q.data()), 0.0f);
  EXPECT_EQ(q, std::vector<int8_t>(4, 0));
  const float tiny[4] = {1e-40f, -3e-41f, 0, 2.5e-41f};  // 127 / max overflows float32
  const float s = quantize_row(tiny, 4, q.data());
  EXPECT_GT(s, 0.0f);
  EXPECT_EQ(q, (std::vector<int8_t>{127, -38, 0, 32}));
  for (float bad : {std::nanf(""), INFINITY, -INFINITY}) {
    const float row[4] = {1, bad, 2, 3};
    EXPECT_TRUE(std::isnan(quantize_row(row, 4, q.data())));
    EXPECT_EQ(q, std::vector<int8_t>(4, 0));
  }
}

TEST(KvQuant, QuantizeRowsChecksBeforeWriting) {
  std::mt19937 rng(1);
  auto x = testing::random_tensor(rng, DType::bf16, 2, 3, 5, 16, Layout::bnhd);
  const QuantizedRows r = quantize_rows(x.view);
  EXPECT_EQ(r.rows.view().dtype, DType::i8);
  EXPECT_EQ(r.scales.view().shape, (std::array<int64_t, 4>{2, 3, 5, 1}));
  std::vector<float> row(16);
  std::vector<int8_t> want(16);
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t h = 0; h < 3; ++h)
      for (int64_t i = 0; i < 5; ++i) {  // each row as quantize_row gives it (x read through its strides)
        for (int64_t c = 0; c < 16; ++c) row[c] = x.view.at(b, h, i, c);
        EXPECT_EQ(r.scales.at(b, h, i, 0), quantize_row(row.data(), 16, want.data()));
        for (int64_t c = 0; c < 16; ++c) EXPECT_EQ(r.rows.at(b, h, i, c), want[c]);
      }
  Tensor rows(DType::i8, {2, 3, 5, 16}), scales(DType::f32, {2, 3, 5, 1});
  expect_error([&] { quantize_rows(x.view, scales.view(), scales.view()); }, "rows must be int8, got float32");
  expect_error([&] { quantize_rows(x.view, rows.view(), rows.view()); }, "scales must be float32, got int8");
  expect_error([&] { quantize_rows(rows.view(), rows.view(), scales.view()); }, "x must be float32, bfloat16 or float16, got int8");
  Tensor short_scales(DType::f32, {2, 3, 4, 1});
  expect_error([&] { quantize_rows(x.view, rows.view(), short_scales.view()); },
               "scales must have shape (B, H, N, 1) = (2, 3, 5, 1), got (2, 3, 4, 1)");
  for (int64_t i = 0; i < 2 * 3 * 5 * 16; ++i) EXPECT_EQ(static_cast<int8_t*>(rows.view().data)[i], 0);  // untouched
}

// q float32 against int8 K/V made from k and v; options wired with their scales.
struct Int8Kv {
  QuantizedRows k, v;
  AttendOptions options;
  Int8Kv(const TensorView& kf, const TensorView& vf) : k(quantize_rows(kf)), v(quantize_rows(vf)) {
    options.kv_scales = KvScales{k.scales.view(), v.scales.view()};
  }
};

TEST(KvQuant, NonFiniteRowsReachExactlyTheQueriesThatSeeThem) {
  std::mt19937 rng(7);
  const int64_t B = 1, H = 4, Hkv = 2, N = 40, M = 40, D = 16;
  auto q = testing::random_tensor(rng, DType::f32, B, H, N, D);
  auto k = testing::random_tensor(rng, DType::f32, B, Hkv, M, D);
  auto v = testing::random_tensor(rng, DType::f32, B, Hkv, M, D);
  const Mechanism causal = parse_mechanism("softmax:causal");
  for (const char* form : {"reference", "tiled", "rows"})
    for (bool in_value : {false, true}) {
      const int64_t j = 25;  // kv head 1's key 25: queries 25.. of heads 2 and 3 see it
      Int8Kv clean(k.view, v.view);
      auto poisoned_kv = testing::random_tensor(rng, DType::f32, B, Hkv, M, D);
      const TensorView& src = in_value ? v.view : k.view;
      for (int64_t h = 0; h < Hkv; ++h)
        for (int64_t n = 0; n < M; ++n)
          for (int64_t c = 0; c < D; ++c)
            store_from_float(poisoned_kv.view.data, DType::f32, poisoned_kv.view.offset(0, h, n, c), src.at(0, h, n, c));
      store_from_float(poisoned_kv.view.data, DType::f32, poisoned_kv.view.offset(0, 1, j, 3), INFINITY);
      Int8Kv bad(in_value ? k.view : poisoned_kv.view, in_value ? poisoned_kv.view : v.view);
      for (Int8Kv* s : {&clean, &bad}) s->options.form = form, s->options.return_lse = true;
      const int64_t rows_n = std::string(form) == "rows" ? 4 : N;  // rows: decode shapes (the last 4 queries)
      TensorView qv = q.view;
      qv.data = q.view.ptr(0, 0, N - rows_n), qv.shape[2] = rows_n;
      const AttendResult want = attend(qv, clean.k.rows.view(), clean.v.rows.view(), causal, clean.options);
      const AttendResult got = attend(qv, bad.k.rows.view(), bad.v.rows.view(), causal, bad.options);
      for (int64_t h = 0; h < H; ++h)
        for (int64_t i = 0; i < rows_n; ++i) {
          const bool sees = h / 2 == 1 && (N - rows_n + i) >= j;
          for (int64_t c = 0; c < D; ++c) {
            const float x = got.out.at(0, h, i, c);
            if (sees) EXPECT_TRUE(std::isnan(x)) << form << " h " << h << " i " << i;
            else EXPECT_EQ(x, want.out.at(0, h, i, c)) << form << " h " << h << " i " << i;
          }
          // an inf in a key makes the whole score row NaN (lse too); in a value, only the output
          if (sees && !in_value) EXPECT_TRUE(std::isnan(got.lse.at(0, h, i, 0))) << form;
          if (!sees || in_value) EXPECT_EQ(got.lse.at(0, h, i, 0), want.lse.at(0, h, i, 0)) << form;
        }
    }
}

TEST(KvQuant, PagedInt8RowsGiveThePlainBits) {
  std::mt19937 rng(5);
  const int64_t B = 2, H = 6, Hkv = 2, M = 90, D = 32, page = 16, per_seq = 6;
  auto q = testing::random_tensor(rng, DType::f32, B, H, 1, D);
  auto k = testing::random_tensor(rng, DType::f32, B, Hkv, M, D);
  auto v = testing::random_tensor(rng, DType::f32, B, Hkv, M, D);
  Int8Kv plain(k.view, v.view);
  // pools of B * per_seq blocks, sequence b in blocks b, b + 2, ... (interleaved)
  const int64_t blocks = B * per_seq;
  Tensor kp(DType::i8, {blocks, Hkv, page, D}), vp(DType::i8, {blocks, Hkv, page, D});
  Tensor ks(DType::f32, {blocks, Hkv, page, 1}), vs(DType::f32, {blocks, Hkv, page, 1});
  PagedKv table{{}, per_seq, M};
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < per_seq; ++i) table.block_table.push_back(static_cast<int32_t>(i * B + b));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < Hkv; ++h)
      for (int64_t j = 0; j < M; ++j) {
        const int64_t blk = table.block_table[static_cast<size_t>(b * per_seq + j / page)], r = j % page;
        for (auto [pool, scale, from] : {std::tuple{&kp, &ks, &plain.k}, {&vp, &vs, &plain.v}}) {
          for (int64_t c = 0; c < D; ++c)
            static_cast<int8_t*>(pool->view().data)[pool->view().offset(blk, h, r, c)] =
                static_cast<int8_t>(from->rows.at(b, h, j, c));
          static_cast<float*>(scale->view().data)[scale->view().offset(blk, h, r, 0)] = from->scales.at(b, h, j, 0);
        }
      }
  for (const char* form : {"rows", "tiled", "reference"}) {
    AttendOptions po = plain.options, pg = plain.options;
    po.form = pg.form = form;
    pg.paged = table;
    pg.kv_scales = KvScales{ks.view(), vs.view()};
    const AttendResult want = attend(q.view, plain.k.rows.view(), plain.v.rows.view(), parse_mechanism("softmax:causal"), po);
    const AttendResult got = attend(q.view, kp.view(), vp.view(), parse_mechanism("softmax:causal"), pg);
    for (int64_t i = 0; i < want.out.view().numel(); ++i)
      ASSERT_EQ(static_cast<const float*>(want.out.view().data)[i], static_cast<const float*>(got.out.view().data)[i]) << form;
  }
  AttendOptions pg = plain.options;
  pg.paged = table;  // the plain scales with a pool: their shape is the pool's
  expect_error([&] { attend(q.view, kp.view(), vp.view(), Softmax{}, pg); },
               "kv_scales.k must have shape (blocks, heads, block size, 1) of its pool = (12, 2, 16, 1), got (2, 2, 90, 1)");
}

TEST(KvQuant, CacheAndVarlenCallsRefuseScales) {
  std::mt19937 rng(4);
  auto q = testing::random_tensor(rng, DType::f32, 1, 2, 1, 8);
  auto cache = testing::random_tensor(rng, DType::f32, 1, 2, 6, 8);
  Int8Kv kv(cache.view, cache.view);
  expect_error([&] { attend_with_kvcache(q.view, kv.k.rows.view(), kv.v.rows.view(), {}, Softmax{}, kv.options); },
               "kv_scales: cache calls append float rows");
  auto packed = testing::random_tensor(rng, DType::f32, 1, 2, 6, 8);
  expect_error([&] { attend_varlen(packed.view, packed.view, packed.view, {0, 6}, {0, 6}, 6, 6, Softmax{}, kv.options); },
               "kv_scales: varlen calls take float k and v");
}

TEST(KvQuant, FamiliesWithoutRowReadersRefuseInt8Rows) {
  std::mt19937 rng(2);
  auto q = testing::random_tensor(rng, DType::f32, 1, 2, 8, 8);
  Int8Kv kv(q.view, q.view);
  for (const char* mech : {"linear:map=elu", "linformer:k=4", "lsh:buckets=2"})
    expect_error([&] { attend(q.view, kv.k.rows.view(), kv.v.rows.view(), parse_mechanism(mech), kv.options); },
                 "int8 k and v rows (options.kv_scales) are read by the softmax family only");
  AttendOptions o = kv.options;
  o.return_lse = true;
  const AttendResult fwd = attend(q.view, kv.k.rows.view(), kv.v.rows.view(), Softmax{}, o);
  o.return_lse = false;
  expect_error([&] { attend_backward(fwd.out.view(), q.view, kv.k.rows.view(), kv.v.rows.view(), fwd.out.view(), fwd.lse.view(), Softmax{}, o); },
               "int8 K/V rows (options.kv_scales) have no backward");
}

}  // namespace
}  // namespace attn
