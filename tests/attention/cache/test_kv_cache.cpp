// The KV cache: paged and contiguous caches give the same bits as plain K/V views; appending in
// pieces equals one recomputation; ragged batches match the float64 reference per sequence;
// rotary tables match RoPE by theta; bad calls leave the cache untouched; varlen equals
// per-sequence calls.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "attn/attn.hpp"
#include "cache/sequence_views.hpp"
#include "families/internal_api.hpp"
#include "support/expect_error.hpp"
#include "support/random_inputs.hpp"

namespace attn {
namespace {

using testing::Buffer;

// A block table giving each of B sequences per_seq blocks of a pool of B * per_seq + 3,
// shuffled (the spare blocks are never named).
PagedKv shuffled_table(int64_t B, int64_t per_seq, std::mt19937& rng) {
  std::vector<int32_t> ids(static_cast<size_t>(B * per_seq + 3));
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  return PagedKv{std::vector<int32_t>(ids.begin(), ids.begin() + B * per_seq), per_seq, -1};
}

// A page pool (blocks, page, Hkv, D) in memory (flash-attn's layout) holding the rows of a plain
// (B, Hkv, M, D) tensor where `table` says, every other row NaN.
struct Pool {
  std::vector<uint8_t> bytes;
  TensorView view;
};

Pool page_out(const TensorView& plain, int64_t page, const PagedKv& table) {
  const int64_t total = static_cast<int64_t>(table.block_table.size()) + 3, count = total * page * plain.heads() * plain.dim();
  Pool p;
  p.bytes.resize(static_cast<size_t>(count) * dtype_size(plain.dtype));
  p.view = make_view(p.bytes.data(), plain.dtype, total, plain.heads(), page, plain.dim(), Layout::bnhd);
  for (int64_t i = 0; i < count; ++i) store_from_float(p.bytes.data(), plain.dtype, i, std::nanf(""));
  for (int64_t b = 0; b < plain.batch(); ++b)
    for (int64_t j = 0; j < plain.tokens(); ++j) {
      const int32_t blk = table.block_table[static_cast<size_t>(b * table.blocks_per_seq + j / page)];
      for (int64_t h = 0; h < plain.heads(); ++h)
        for (int64_t c = 0; c < plain.dim(); ++c)
          store_from_float(p.view.data, plain.dtype, p.view.offset(blk, h, j % page, c), plain.at(b, h, j, c));
    }
  return p;
}

void expect_same_bits(const TensorView& a, const TensorView& b, const std::string& what) {
  ASSERT_EQ(a.shape, b.shape) << what;
  int64_t differ = 0;
  for (int64_t i = 0; i < a.batch(); ++i)
    for (int64_t h = 0; h < a.heads(); ++h)
      for (int64_t n = 0; n < a.tokens(); ++n)
        for (int64_t c = 0; c < a.dim(); ++c) {
          const float x = a.at(i, h, n, c), y = b.at(i, h, n, c);
          differ += !(x == y || (std::isnan(x) && std::isnan(y)));
        }
  EXPECT_EQ(differ, 0) << what;
}

TEST(PagedKv, SameBitsAsPlainViewsOnEveryForm) {
  std::mt19937 rng(4);
  for (DType dt : {DType::f32, DType::bf16})
    for (int64_t page : {16, 7})
      for (auto [N, M] : {std::pair<int64_t, int64_t>{1, 300}, {3, 300}, {70, 150}}) {
        const int64_t B = 2, H = 4, Hkv = 2, D = 24;
        auto q = testing::random_tensor(rng, dt, B, H, N, D);
        auto k = testing::random_tensor(rng, dt, B, Hkv, M, D);
        auto v = testing::random_tensor(rng, dt, B, Hkv, M, D);
        const PagedKv table = shuffled_table(B, (M + page - 1) / page + 1, rng);  // a spare block past the keys
        const Pool kp = page_out(k.view, page, table), vp = page_out(v.view, page, table);
        for (const char* mech : {"softmax:causal", "softmax:causal,window=20:0,sinks=2", "softmax"})
          for (const char* form : {"reference", "rows", "tiled"}) {
            if (std::string(form) == "rows" && N * H / Hkv > 16) continue;
            AttendOptions plain_opt, paged_opt;
            plain_opt.form = paged_opt.form = form;
            plain_opt.key_padding_lengths = paged_opt.key_padding_lengths = {M, M - 37};
            plain_opt.return_lse = paged_opt.return_lse = true;
            paged_opt.paged = table;
            paged_opt.paged->tokens = M;
            const AttendResult want = attend(q.view, k.view, v.view, parse_mechanism(mech), plain_opt);
            const AttendResult got = attend(q.view, kp.view, vp.view, parse_mechanism(mech), paged_opt);
            const std::string what = std::string(mech) + " " + form + " " + dtype_name(dt) + " page " +
                                     std::to_string(page) + " N " + std::to_string(N);
            expect_same_bits(want.out.view(), got.out.view(), what);
            expect_same_bits(want.lse.view(), got.lse.view(), what + " lse");
          }
      }
}

TEST(PagedKv, BadTablesAreErrors) {
  std::mt19937 rng(1);
  auto q = testing::random_tensor(rng, DType::f32, 2, 2, 1, 8);
  auto pool = testing::random_tensor(rng, DType::f32, 5, 2, 4, 8);
  AttendOptions o;
  o.paged = PagedKv{{0, 1, 2, 3}, 2, -1};
  EXPECT_NO_THROW(attend(q.view, pool.view, pool.view, Softmax{}, o));
  o.paged->block_table = {0, 1, 2};
  testing::expect_error([&] { attend(q.view, pool.view, pool.view, Softmax{}, o); }, "batch x blocks_per_seq = 2 x 2");
  o.paged->block_table = {0, 1, 2, 5};
  testing::expect_error([&] { attend(q.view, pool.view, pool.view, Softmax{}, o); }, "paged.block_table[1][1] must name a block in [0, 5)");
  o.key_padding_lengths = {8, 4};  // sequence 1 uses one block only: entry [1][1] is not read
  EXPECT_NO_THROW(attend(q.view, pool.view, pool.view, Softmax{}, o));
  o.paged->tokens = 9;
  testing::expect_error([&] { attend(q.view, pool.view, pool.view, Softmax{}, o); }, "paged.tokens must be in [0, blocks_per_seq x block size = 8]");
  o.paged->tokens = -1;
  testing::expect_error([&] { attend(q.view, pool.view, pool.view, parse_mechanism("linear:map=elu"), o); },
                        "paged KV cache (options.paged) is read by the softmax family only");
}

// Caches in flash-attn's layout (B, capacity, Hkv, D), zero-filled.
struct Cache {
  std::vector<uint8_t> kb, vb;
  TensorView k, v;
  Cache(DType dt, int64_t B, int64_t Hkv, int64_t cap, int64_t D) {
    kb.assign(static_cast<size_t>(B * Hkv * cap * D) * dtype_size(dt), 0);
    vb = kb;
    k = make_view(kb.data(), dt, B, Hkv, cap, D, Layout::bnhd);
    v = make_view(vb.data(), dt, B, Hkv, cap, D, Layout::bnhd);
  }
};

using cache_view::tokens;

TEST(KvCache, AppendingInPiecesEqualsOneRecomputation) {
  std::mt19937 rng(7);
  for (DType dt : {DType::f32, DType::f16}) {
    const int64_t H = 8, Hkv = 2, D = 32, total = 60;
    auto q_all = testing::random_tensor(rng, dt, 1, H, total, D);
    auto k_all = testing::random_tensor(rng, dt, 1, Hkv, total, D);
    auto v_all = testing::random_tensor(rng, dt, 1, Hkv, total, D);
    Cache c(dt, 1, Hkv, 64, D);
    int64_t len = 0;
    for (int64_t n : {37, 1, 1, 1, 9, 11}) {
      KvCacheUpdate u;
      u.cache_seqlens = {len};
      u.k = tokens(k_all.view, len, n), u.v = tokens(v_all.view, len, n);
      const TensorView q = tokens(q_all.view, len, n);
      const AttendResult got = attend_with_kvcache(q, c.k, c.v, u, parse_mechanism("softmax:causal"));
      len += n;
      // the same call on plain views of everything so far: the same bits
      const AttendResult want = attend(q, tokens(k_all.view, 0, len), tokens(v_all.view, 0, len),
                                       parse_mechanism("softmax:causal"));
      expect_same_bits(want.out.view(), got.out.view(), "step to " + std::to_string(len) + " " + dtype_name(dt));
    }
    expect_same_bits(tokens(c.k, 0, total), k_all.view, "cached keys");
    expect_same_bits(tokens(c.v, 0, total), v_all.view, "cached values");
    EXPECT_EQ(tokens(c.k, total, 4).at(0, 1, 3, 5), 0.0f);  // nothing written past the end
  }
}

// Ragged batch, paged and contiguous: each sequence against the float64 reference of its own
// keys (the cache as it was plus the new rows).
TEST(KvCache, RaggedBatchesMatchTheReferencePerSequence) {
  std::mt19937 rng(11);
  const int64_t B = 3, H = 6, Hkv = 3, D = 16, cap = 96, Nnew = 4, page = 8;
  const std::vector<int64_t> before = {0, 5, 90};
  for (bool paged : {false, true})
    for (const char* mech : {"softmax:causal", "softmax:causal,window=6:0", "softmax"}) {
      auto hist_k = testing::random_tensor(rng, DType::f32, B, Hkv, cap, D);
      auto hist_v = testing::random_tensor(rng, DType::f32, B, Hkv, cap, D);
      auto knew = testing::random_tensor(rng, DType::f32, B, Hkv, Nnew, D);
      auto vnew = testing::random_tensor(rng, DType::f32, B, Hkv, Nnew, D);
      auto q = testing::random_tensor(rng, DType::f32, B, H, Nnew, D);
      KvCacheUpdate u;
      u.cache_seqlens = before;
      u.k = knew.view, u.v = vnew.view;
      Pool kp, vp;
      TensorView kc = hist_k.view, vc = hist_v.view;
      if (paged) {
        u.paged = shuffled_table(B, cap / page, rng);
        kp = page_out(hist_k.view, page, *u.paged), vp = page_out(hist_v.view, page, *u.paged);
        kc = kp.view, vc = vp.view;
      }
      AttendOptions o;
      o.return_lse = true;
      const AttendResult got = attend_with_kvcache(q.view, kc, vc, u, parse_mechanism(mech), o);
      for (int64_t b = 0; b < B; ++b) {
        const int64_t len = before[static_cast<size_t>(b)] + Nnew;
        Buffer kb = testing::random_tensor(rng, DType::f32, 1, Hkv, len, D);
        Buffer vb = testing::random_tensor(rng, DType::f32, 1, Hkv, len, D);
        for (int64_t h = 0; h < Hkv; ++h)
          for (int64_t j = 0; j < len; ++j)
            for (int64_t c = 0; c < D; ++c) {
              const bool fresh = j >= before[static_cast<size_t>(b)];
              const int64_t jn = j - before[static_cast<size_t>(b)];
              store_from_float(kb.view.data, DType::f32, kb.view.offset(0, h, j, c),
                               fresh ? knew.view.at(b, h, jn, c) : hist_k.view.at(b, h, j, c));
              store_from_float(vb.view.data, DType::f32, vb.view.offset(0, h, j, c),
                               fresh ? vnew.view.at(b, h, jn, c) : hist_v.view.at(b, h, j, c));
            }
        TensorView qb = q.view;
        qb.data = qb.ptr(b, 0, 0, 0), qb.shape[0] = 1;
        const core::ReferenceResult ref =
            families::reference_outputs(qb, kb.view, vb.view, parse_mechanism(mech), {}, core::RefPrecision::f64);
        double err = 0;
        for (int64_t h = 0; h < H; ++h)
          for (int64_t i = 0; i < Nnew; ++i) {
            for (int64_t c = 0; c < D; ++c)
              err = std::max(err, std::abs(got.out.at(b, h, i, c) - ref.out[static_cast<size_t>((h * Nnew + i) * D + c)]));
            err = std::max(err, std::abs(got.lse.at(b, h, i, 0) - ref.lse[static_cast<size_t>(h * Nnew + i)]));
          }
        EXPECT_LE(err, 2e-5) << mech << (paged ? " paged" : " contiguous") << " sequence " << b;
      }
    }
}

TEST(KvCache, RotaryTablesRotateNewKeysAndQueriesAtTheirPositions) {
  std::mt19937 rng(3);
  const int64_t B = 2, H = 2, D = 16, R = 8, P = 64;
  std::vector<float> cos(static_cast<size_t>(P * R / 2)), sin(cos.size());
  for (int64_t p = 0; p < P; ++p)
    for (int64_t c = 0; c < R / 2; ++c) {
      const double a = static_cast<double>(p) * std::pow(10000.0, -2.0 * static_cast<double>(c) / R);
      cos[static_cast<size_t>(p * R / 2 + c)] = static_cast<float>(std::cos(a));
      sin[static_cast<size_t>(p * R / 2 + c)] = static_cast<float>(std::sin(a));
    }
  for (RopeStyle style : {RopeStyle::interleaved, RopeStyle::half}) {
    auto q = testing::random_tensor(rng, DType::f32, B, H, 3, D);
    auto kn = testing::random_tensor(rng, DType::f32, B, H, 3, D);
    auto vn = testing::random_tensor(rng, DType::f32, B, H, 3, D);
    Cache c(DType::f32, B, H, 32, D);
    KvCacheUpdate u;
    u.cache_seqlens = {4, 20};
    u.k = kn.view, u.v = vn.view;
    u.rotary = RotaryTables{make_view(cos.data(), DType::f32, 1, 1, P, R / 2),
                            make_view(sin.data(), DType::f32, 1, 1, P, R / 2), style};
    const AttendResult got = attend_with_kvcache(q.view, c.k, c.v, u, parse_mechanism("softmax:causal"));
    // the same by RoPE with theta: rotate copies at the cache positions, attend on plain views
    Rope r;
    r.style = style, r.rotary_dim = R;
    auto kr = kn, qr = q;
    kr.view.data = kr.bytes.data(), qr.view.data = qr.bytes.data();
    apply_rope(kr.view, r, {4, 20});
    apply_rope(qr.view, r, {4, 20});
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t i = 0; i < 3; ++i)
          for (int64_t ch = 0; ch < D; ++ch)
            EXPECT_NEAR(c.k.at(b, h, u.cache_seqlens[static_cast<size_t>(b)] + i, ch), kr.view.at(b, h, i, ch), 1e-6);
    for (int64_t b = 0; b < B; ++b) {
      const int64_t len = u.cache_seqlens[static_cast<size_t>(b)] + 3;
      TensorView qb = qr.view, kb = c.k, vb = c.v;
      qb.data = qb.ptr(b, 0, 0, 0), qb.shape[0] = 1;
      kb.data = kb.ptr(b, 0, 0, 0), kb.shape[0] = 1, kb.shape[2] = len;
      vb.data = vb.ptr(b, 0, 0, 0), vb.shape[0] = 1, vb.shape[2] = len;
      const AttendResult want = attend(qb, kb, vb, parse_mechanism("softmax:causal"));
      for (int64_t h = 0; h < H; ++h)
        for (int64_t i = 0; i < 3; ++i)
          for (int64_t ch = 0; ch < D; ++ch) EXPECT_NEAR(got.out.at(b, h, i, ch), want.out.at(0, h, i, ch), 1e-6);
    }
  }
}

TEST(KvCache, QIsNotModified) {
  std::mt19937 rng(5);
  auto q = testing::random_tensor(rng, DType::f32, 1, 2, 2, 8);
  const auto before = q.bytes;
  Cache c(DType::f32, 1, 2, 8, 8);
  std::vector<float> cs(8 * 4, 0.5f);
  KvCacheUpdate u;
  u.cache_seqlens = {3};
  u.rotary = RotaryTables{make_view(cs.data(), DType::f32, 1, 1, 8, 4), make_view(cs.data(), DType::f32, 1, 1, 8, 4)};
  attend_with_kvcache(q.view, c.k, c.v, u, parse_mechanism("softmax:causal"));
  EXPECT_EQ(q.bytes, before);
}

TEST(KvCache, FailedCallsLeaveTheCacheAsItWas) {
  std::mt19937 rng(8);
  const int64_t B = 2, H = 2, D = 8, cap = 16;
  auto q = testing::random_tensor(rng, DType::f32, B, H, 2, D);
  auto kn = testing::random_tensor(rng, DType::f32, B, H, 2, D);
  auto vn = testing::random_tensor(rng, DType::f32, B, H, 2, D);
  Cache c(DType::f32, B, H, cap, D);
  const auto kbefore = c.kb, vbefore = c.vb;
  auto call = [&](KvCacheUpdate u, const char* mech = "softmax:causal", AttendOptions o = {}) {
    return [=, &c] { attend_with_kvcache(q.view, c.k, c.v, u, parse_mechanism(mech), o); };
  };
  KvCacheUpdate u;
  u.k = kn.view, u.v = vn.view;
  u.cache_seqlens = {3, 15};
  testing::expect_error(call(u), "the cache of sequence 1 overflows: it holds 15 tokens, 2 new ones do not fit its capacity 16");
  u.cache_seqlens = {-1, 0};
  testing::expect_error(call(u), "cache_seqlens[0] must be in [0, 16]");
  u.cache_seqlens = {0};
  testing::expect_error(call(u), "cache_seqlens must have one length per sequence (2), got 1");
  u.cache_seqlens = {3, 4};
  testing::expect_error(call(u, "softmax:causal,window=2:0", [] {
                          AttendOptions o;
                          o.threads = -3;
                          return o;
                        }()),
                        "threads must be in");
  std::vector<float> cs(4 * 4, 0.5f);
  u.rotary = RotaryTables{make_view(cs.data(), DType::f32, 1, 1, 4, 4), make_view(cs.data(), DType::f32, 1, 1, 4, 4)};
  testing::expect_error(call(u), "sequence 0 needs rotary positions up to 4, the tables have 4");
  std::vector<float> long_cs(32 * 4, 0.5f);  // DCA rotates q and k itself: tables would rotate them twice
  KvCacheUpdate dca = u;
  dca.rotary = RotaryTables{make_view(long_cs.data(), DType::f32, 1, 1, 32, 4), make_view(long_cs.data(), DType::f32, 1, 1, 32, 4)};
  testing::expect_error(call(dca, "dca:chunk=8,local=4"), "rotary_cos/rotary_sin: dca applies RoPE itself");
  u.rotary.reset();
  KvCacheUpdate only_k = u;
  only_k.v.reset();
  testing::expect_error(call(only_k), "give both new k and new v, or neither");
  // paged: bad block ids, a block written by one sequence and read by another
  auto pool = testing::random_tensor(rng, DType::f32, 6, H, 4, D);
  const auto pool_before = pool.bytes;
  KvCacheUpdate pu = u;
  pu.cache_seqlens = {3, 3};
  pu.paged = PagedKv{{0, 1, 2, 9}, 2, -1};
  auto paged_call = [&](KvCacheUpdate x) {
    return [=, &pool] { attend_with_kvcache(q.view, pool.view, pool.view, x, parse_mechanism("softmax:causal")); };
  };
  testing::expect_error(paged_call(pu), "block_table[1][1] must name a block in [0, 6) (the pool's blocks), got 9");
  pu.paged->block_table = {0, 1, 0, 3};
  pu.cache_seqlens = {3, 1};
  testing::expect_error(paged_call(pu), "block 0 is written by sequences 0 and 1");
  pu.paged->block_table = {0, 1, 1, 3};
  pu.cache_seqlens = {4, 4};  // sequence 0 writes block 1, which sequence 1 reads
  testing::expect_error(paged_call(pu), "block 1 is written by sequence 0 and read by sequence 1");
  EXPECT_EQ(pool.bytes, pool_before);
  EXPECT_EQ(c.kb, kbefore);
  EXPECT_EQ(c.vb, vbefore);
}

// A view's elements copied into owned memory (same shape, contiguous).
Buffer owned_copy(const TensorView& t) {
  Buffer b;
  b.bytes.resize(static_cast<size_t>(t.numel()) * dtype_size(t.dtype));
  b.view = make_view(b.bytes.data(), t.dtype, t.batch(), t.heads(), t.tokens(), t.dim());
  cache_view::copy(t, b.view);
  return b;
}

// Regression: new k/v (and q) that were views of the cache rows being
// written were read after those rows had been overwritten (a forward copy smeared row 2 over rows
// 3..5). Now each call equals the same call with the inputs copied out first: the caches and the
// output bitwise.
TEST(KvCache, NewRowsAndQueriesThatAreViewsOfTheCacheAreReadAsTheyWereBeforeTheCall) {
  std::mt19937 rng(21);
  const int64_t B = 2, H = 2, cap = 16, D = 8;
  struct Case {
    const char* what;
    int k_from, v_from, q_from;  // -1: own memory; 0: k_cache; 1: v_cache (rows starting at `at`)
    int64_t at;
  };
  const Case cases[] = {
      {"k from the rows before the written ones", 0, -1, -1, 2},
      {"k from the rows after the written ones", 0, -1, -1, 4},
      {"v from k_cache's written rows", -1, 0, -1, 3},
      {"k from v_cache's written rows", 1, -1, -1, 3},
      {"k and v swapped between the caches", 1, 0, -1, 3},
      {"k and v their own written rows", 0, 1, -1, 3},
      {"q from k_cache's written rows", -1, -1, 0, 3},
      {"q, k and v all from the caches", 1, 0, 1, 2},
  };
  for (const Case& cs : cases) {
    for (int paged = 0; paged < 2; ++paged) {
      const std::string what = std::string(cs.what) + (paged ? " (paged)" : "");
      // plain caches (B, H, cap, D) or pools of 4-row blocks (8 blocks, shuffled table)
      auto kc = paged ? testing::random_tensor(rng, DType::f32, 8, H, 4, D) : testing::random_tensor(rng, DType::f32, B, H, cap, D);
      auto vc = paged ? testing::random_tensor(rng, DType::f32, 8, H, 4, D) : testing::random_tensor(rng, DType::f32, B, H, cap, D);
      auto own_k = testing::random_tensor(rng, DType::f32, B, H, 3, D);
      auto own_v = testing::random_tensor(rng, DType::f32, B, H, 3, D);
      auto own_q = testing::random_tensor(rng, DType::f32, B, H, 3, D);
      KvCacheUpdate u;
      u.cache_seqlens = {3, 3};
      if (paged) u.paged = PagedKv{{5, 1, 6, 0, 7, 3, 2, 4}, 4, -1};
      // Rows [at, at + 3) of each sequence, (B, H, 3, D); in a pool, row `at` of block 5 (sequence
      // 0's rows 0..3) as the one new row of both sequences (batch stride 0).
      auto rows_of = [&](int from, const Buffer& own) -> TensorView {
        TensorView t = from < 0 ? own.view : from == 0 ? kc.view : vc.view;
        if (from >= 0 && !paged) return tokens(t, cs.at, 3);
        if (from >= 0) t.data = t.ptr(5, 0, cs.at % 4), t.strides[0] = 0, t.shape[0] = B;
        if (paged) t.shape[2] = 1;
        return t;
      };
      u.k = rows_of(cs.k_from, own_k), u.v = rows_of(cs.v_from, own_v);
      const TensorView q = rows_of(cs.q_from, own_q);
      // the reference: caches as they were, inputs copied out first
      auto kc2 = kc, vc2 = vc;
      kc2.view.data = kc2.bytes.data(), vc2.view.data = vc2.bytes.data();
      const Buffer k_in = owned_copy(*u.k), v_in = owned_copy(*u.v), q_in = owned_copy(q);
      KvCacheUpdate u2 = u;
      u2.k = k_in.view, u2.v = v_in.view;
      const auto mech = parse_mechanism("softmax:causal");
      const AttendResult got = attend_with_kvcache(q, kc.view, vc.view, u, mech);
      const AttendResult want = attend_with_kvcache(q_in.view, kc2.view, vc2.view, u2, mech);
      expect_same_bits(want.out.view(), got.out.view(), what + ": out");
      EXPECT_EQ(kc.bytes, kc2.bytes) << what << ": k_cache";
      EXPECT_EQ(vc.bytes, vc2.bytes) << what << ": v_cache";
    }
  }
}

// Regression: caches whose written rows share memory with other rows of
// the call (k_cache and v_cache one buffer, one shifted by a row, a batch stride of 0 that makes
// two sequences one, a row stride of 0) are refused before anything is written, naming the rows;
// k and v interleaved in one buffer (a packed KV cache) share no element and work.
TEST(KvCache, CachesWhoseWrittenRowsShareMemoryAreRefusedAndPackedCachesWork) {
  std::mt19937 rng(22);
  const int64_t B = 2, H = 2, cap = 8, D = 4;
  auto buf = testing::random_tensor(rng, DType::f32, 1, 1, 1, 2 * B * H * cap * D + 64);
  auto q = testing::random_tensor(rng, DType::f32, B, H, 1, D);
  auto kn = testing::random_tensor(rng, DType::f32, B, H, 1, D);
  auto vn = testing::random_tensor(rng, DType::f32, B, H, 1, D);
  KvCacheUpdate u;
  u.k = kn.view, u.v = vn.view;
  u.cache_seqlens = {2, 5};
  float* base = reinterpret_cast<float*>(buf.bytes.data());
  const TensorView plain = make_view(base, DType::f32, B, H, cap, D, Layout::bnhd);
  auto refused = [&](TensorView kc, TensorView vc, const std::string& message) {
    const auto before = buf.bytes;
    testing::expect_error([&] { attend_with_kvcache(q.view, kc, vc, u, parse_mechanism("softmax:causal")); }, message);
    EXPECT_EQ(buf.bytes, before) << message;
  };
  refused(plain, plain, "k_cache (sequence 0, head 0, position 2), written by this call, shares memory with v_cache "
                        "(sequence 0, head 0, position 2), also written by it");
  TensorView shifted = plain;
  shifted.data = base + H * D;  // v's row j is k's row j + 1
  refused(plain, shifted, "read by it");
  TensorView one_batch = plain;
  one_batch.strides[0] = 0;  // both sequences in the same rows
  TensorView apart = plain;
  apart.data = base + B * H * cap * D;
  refused(one_batch, apart, "k_cache (sequence 0, head 0, position 2), written by this call, shares memory with k_cache "
                            "(sequence 1, head 0, position 2), read by it");
  TensorView one_row = apart;
  one_row.strides[2] = 0;  // every position of a head the same row
  refused(plain, one_row, "shares memory with v_cache");
  TensorView strided = plain;  // channels 2 apart, k in the even, v in the odd elements: no element shared
  strided.strides = {cap * H * D * 2, D * 2, H * D * 2, 2};
  TensorView odd = strided;
  odd.data = base + 1;
  TensorView overlapping_odd = strided;
  overlapping_odd.data = base + 2;  // v's channel c is k's channel c + 1
  refused(strided, overlapping_odd, "channel");
  // packed: (B, cap, 2, H, D) with k at [.., 0, ..] and v at [.., 1, ..]; and the interleaved channels
  for (auto [kc, vc] : {std::pair{strided, odd}, [&] {
                          TensorView k = plain, v = plain;
                          k.strides = {cap * 2 * H * D, D, 2 * H * D, 1};
                          v.strides = k.strides;
                          v.data = base + H * D;
                          return std::pair{k, v};
                        }()}) {
    Cache c(DType::f32, B, H, cap, D);
    cache_view::copy(kc, c.k), cache_view::copy(vc, c.v);
    const AttendResult got = attend_with_kvcache(q.view, kc, vc, u, parse_mechanism("softmax:causal"));
    const AttendResult want = attend_with_kvcache(q.view, c.k, c.v, u, parse_mechanism("softmax:causal"));
    expect_same_bits(want.out.view(), got.out.view(), "packed cache");
    expect_same_bits(c.k, kc, "packed k_cache");
    expect_same_bits(c.v, vc, "packed v_cache");
  }
}

// Regression: a block table listing one block twice for a sequence let the
// new keys of one entry overwrite the keys of the other. Refused before anything is written,
// naming the sequence, the entries, their positions and the block; a block listed twice but only
// read is left alone (nothing is overwritten).
TEST(KvCache, BlockListedTwiceForASequenceThatWritesItIsRefused) {
  std::mt19937 rng(23);
  const int64_t H = 2, D = 8;
  auto q = testing::random_tensor(rng, DType::f32, 2, H, 2, D);
  auto kn = testing::random_tensor(rng, DType::f32, 2, H, 2, D);
  auto vn = testing::random_tensor(rng, DType::f32, 2, H, 2, D);
  auto kp = testing::random_tensor(rng, DType::f32, 8, H, 4, D), vp = testing::random_tensor(rng, DType::f32, 8, H, 4, D);
  const auto k_before = kp.bytes, v_before = vp.bytes;
  KvCacheUpdate u;
  u.k = kn.view, u.v = vn.view;
  auto call = [&](std::vector<int32_t> table, std::vector<int64_t> lens) {
    KvCacheUpdate x = u;
    x.cache_seqlens = lens;
    x.paged = PagedKv{table, 3, -1};
    return [=, &kp, &vp] { attend_with_kvcache(q.view, kp.view, vp.view, x, parse_mechanism("softmax:causal")); };
  };
  testing::expect_error(call({0, 0, 7, 1, 2, 3}, {3, 0}),
                        "block_table[0] lists block 0 at entries 0 and 1 (positions 0..3 and 4..7 of sequence 0), and "
                        "this call writes it");
  testing::expect_error(call({4, 5, 6, 1, 2, 1}, {0, 8}),
                        "block_table[1] lists block 1 at entries 0 and 2 (positions 0..3 and 8..11 of sequence 1)");
  testing::expect_error(call({4, 5, 4, 1, 2, 3}, {8, 0}), "block_table[0] lists block 4 at entries 0 and 2");
  testing::expect_error(call({5, 6, 4, 4, 2, 3}, {8, 4}),  // one sequence's new rows in a block another reads
                        "block 4 is written by sequence 0 and read by sequence 1 (its positions 0..3)");
  EXPECT_EQ(kp.bytes, k_before);
  EXPECT_EQ(vp.bytes, v_before);
  // entries 0 and 1 name block 5 and are only read (the new rows go to entry 2): accepted
  EXPECT_NO_THROW(call({5, 5, 6, 1, 2, 3}, {8, 0})());
}

// Regression: out or lse in memory the call reads (q, the caches, the new
// rows), in each other, or with strides that make two elements one, are refused before the
// caches are written.
TEST(KvCache, OutputsThatShareMemoryWithWhatTheCallReadsAreRefused) {
  std::mt19937 rng(24);
  const int64_t B = 1, H = 2, D = 8, cap = 8;
  auto q = testing::random_tensor(rng, DType::f32, B, H, 2, D);
  auto kn = testing::random_tensor(rng, DType::f32, B, H, 2, D);
  auto vn = testing::random_tensor(rng, DType::f32, B, H, 2, D);
  Cache c(DType::f32, B, H, cap, D);
  const auto kbefore = c.kb, vbefore = c.vb;
  KvCacheUpdate u;
  u.k = kn.view, u.v = vn.view;
  u.cache_seqlens = {3};
  std::vector<float> lse_mem(static_cast<size_t>(B * H * 2), 0.0f), out_mem(static_cast<size_t>(B * H * 2 * D), 0.0f);
  const TensorView lse = make_view(lse_mem.data(), DType::f32, B, H, 2, 1);
  const TensorView out = make_view(out_mem.data(), DType::f32, B, H, 2, D);
  auto call = [&](TensorView o, TensorView l) {
    return [=, &c] { attend_with_kvcache_into(q.view, c.k, c.v, u, parse_mechanism("softmax:causal"), {}, o, &l); };
  };
  testing::expect_error(call(q.view, lse), "out shares memory with q, which the call reads while writing out");
  testing::expect_error(call(tokens(c.k, 0, 2), lse), "out shares memory with k_cache");
  testing::expect_error(call(tokens(c.v, 5, 2), lse), "out shares memory with v_cache");
  testing::expect_error(call(vn.view, lse), "out shares memory with v,");
  TensorView lse_in_k = lse;
  lse_in_k.data = kn.view.data;
  testing::expect_error(call(out, lse_in_k), "lse shares memory with k,");
  TensorView lse_in_out = lse;
  lse_in_out.data = out_mem.data() + 3;
  testing::expect_error(call(out, lse_in_out), "out and lse share memory");
  TensorView broadcast = out;
  broadcast.strides[2] = 0;
  testing::expect_error(call(broadcast, lse), "two of its elements share memory");
  EXPECT_EQ(c.kb, kbefore);
  EXPECT_EQ(c.vb, vbefore);
  EXPECT_NO_THROW(call(out, lse)());
}

TEST(Varlen, PackedEqualsOneCallPerSequence) {
  std::mt19937 rng(12);
  const std::vector<int64_t> lq = {5, 0, 17, 1}, lk = {9, 3, 17, 40};
  std::vector<int64_t> cq{0}, ck{0};
  for (size_t b = 0; b < lq.size(); ++b) cq.push_back(cq.back() + lq[b]), ck.push_back(ck.back() + lk[b]);
  const int64_t H = 4, Hkv = 2, D = 16;
  for (const char* mech : {"softmax:causal", "softmax:window=3:2", "linear:map=elu"}) {
    // packed as flash-attn does: (total, H, D) memory, i.e. (1, total, H, D) in bnhd
    auto q = testing::random_tensor(rng, DType::f32, 1, H, cq.back(), D, Layout::bnhd);
    auto k = testing::random_tensor(rng, DType::f32, 1, Hkv, ck.back(), D, Layout::bnhd);
    auto v = testing::random_tensor(rng, DType::f32, 1, Hkv, ck.back(), D, Layout::bnhd);
    AttendOptions o;
    o.return_lse = std::string(mech).rfind("softmax", 0) == 0;
    const AttendResult got = attend_varlen(q.view, k.view, v.view, cq, ck, 17, 40, parse_mechanism(mech), o);
    for (size_t b = 0; b < lq.size(); ++b) {
      const AttendResult want = attend(tokens(q.view, cq[b], lq[b]), tokens(k.view, ck[b], lk[b]),
                                       tokens(v.view, ck[b], lk[b]), parse_mechanism(mech), o);
      expect_same_bits(want.out.view(), tokens(got.out.view(), cq[b], lq[b]), std::string(mech) + " out " + std::to_string(b));
      if (o.return_lse) expect_same_bits(want.lse.view(), tokens(got.lse.view(), cq[b], lq[b]), "lse");
    }
  }
  auto q = testing::random_tensor(rng, DType::f32, 1, H, cq.back(), D);
  auto k = testing::random_tensor(rng, DType::f32, 1, Hkv, ck.back(), D);
  auto bad = [&](std::vector<int64_t> a, std::vector<int64_t> b, int64_t mq, int64_t mk) {
    return [=] { attend_varlen(q.view, k.view, k.view, a, b, mq, mk, Softmax{}); };
  };
  testing::expect_error(bad({1, 5, 23, 23, 24}, ck, 17, 40), "cu_seqlens_q must start at 0");
  testing::expect_error(bad(cq, {0, 9, 5, 29, 69}, 17, 40), "cu_seqlens_k must not decrease, got 9 then 5 at index 2");
  testing::expect_error(bad(cq, {0, 9, 12, 29, 60}, 17, 40), "cu_seqlens_k must end at the packed tokens 69, got 60");
  testing::expect_error(bad(cq, ck, 16, 40), "max_seqlen_q must be at least the longest sequence 17, got 16");
  testing::expect_error(bad(cq, {0, 69}, 17, 69), "must have the same length (batch + 1), got 5 and 2");
}

}  // namespace
}  // namespace attn
