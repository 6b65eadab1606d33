// The distributed calls against the single-process ones on the whole inputs. Run by ctest under
// mpirun -np 1, 2, 3 and 4 (every rank runs every test in the same order: the calls are
// collective). Every rank builds the whole inputs from the same seed, takes its shard, and checks
// its rows of the result.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <cstring>
#include <random>

#include "attn/attn.hpp"
#include "attn/distributed.hpp"
#include "support/expect_error.hpp"
#include "support/random_inputs.hpp"

namespace attn::testing {
namespace {

namespace dist = attn::distributed;

int rank_of() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}
int ranks() {
  int r = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &r);
  return r;
}

// The rows of `pieces` of x (any layout), as a new tensor in `layout`.
Tensor take(const TensorView& x, const std::vector<dist::Piece>& pieces, Layout layout = Layout::bhnd) {
  int64_t n = 0;
  for (const auto& p : pieces) n += p.length;
  Tensor t(x.dtype, {x.batch(), x.heads(), n, x.dim()}, layout);
  for (const auto& p : pieces)
    for (int64_t b = 0; b < x.batch(); ++b)
      for (int64_t h = 0; h < x.heads(); ++h)
        for (int64_t i = 0; i < p.length; ++i)
          for (int64_t c = 0; c < x.dim(); ++c)
            store_from_float(t.view().data, t.view().dtype, t.view().offset(b, h, p.local + i, c),
                             x.at(b, h, p.start + i, c));
  return t;
}

// Rows [first, first + count) of x's token dimension.
TensorView dist_rows(TensorView x, int64_t first, int64_t count) {
  x.data = static_cast<char*>(x.data) + x.strides[2] * first * static_cast<int64_t>(dtype_size(x.dtype));
  x.shape[2] = count;
  return x;
}

struct Case {
  int64_t B = 1, H = 2, Hkv = 2, N = 16, D = 8, Dv = 8;
  std::string mechanism = "softmax";
  Layout layout = Layout::bhnd;
  DType dtype = DType::f32;
};

std::string name(const Case& c) {
  return c.mechanism + " N=" + std::to_string(c.N) + " H=" + std::to_string(c.H) + "/" + std::to_string(c.Hkv) +
         " ranks=" + std::to_string(ranks());
}

// max |a - b| over this rank's rows, and max |b|.
void expect_rows_near(const TensorView& got, const TensorView& whole, const std::vector<dist::Piece>& pieces,
                      double tol, const std::string& what) {
  double worst = 0;
  bool nan_mismatch = false;
  for (const auto& p : pieces)
    for (int64_t b = 0; b < got.batch(); ++b)
      for (int64_t h = 0; h < got.heads(); ++h)
        for (int64_t i = 0; i < p.length; ++i)
          for (int64_t c = 0; c < got.dim(); ++c) {
            const double x = got.at(b, h, p.local + i, c), y = whole.at(b, h, p.start + i, c);
            if (std::isinf(x) && x == y) continue;  // lse of a row with no key: -inf on both
            if (std::isnan(x) != std::isnan(y)) nan_mismatch = true;
            else worst = std::max(worst, std::abs(x - y));
          }
  EXPECT_FALSE(nan_mismatch) << what;
  EXPECT_LE(worst, tol) << what << " (rank " << rank_of() << ")";
}

void check_ring(const Case& c) {
  SCOPED_TRACE(name(c));
  std::mt19937 rng(1234);
  auto q = random_tensor(rng, c.dtype, c.B, c.H, c.N, c.D, c.layout);
  auto k = random_tensor(rng, c.dtype, c.B, c.Hkv, c.N, c.D, c.layout);
  auto v = random_tensor(rng, c.dtype, c.B, c.Hkv, c.N, c.Dv, c.layout);
  const Mechanism m = parse_mechanism(c.mechanism);
  AttendOptions whole_opt;
  whole_opt.return_lse = true;
  whole_opt.form = "reference";  // the float64 reference, rounded
  const AttendResult ref = attend(q.view, k.view, v.view, m, whole_opt);
  whole_opt.form = "";
  const AttendResult fast = attend(q.view, k.view, v.view, m, whole_opt);

  const bool causal = std::visit([](const auto& x) {
    if constexpr (requires { x.causal; }) return static_cast<bool>(x.causal);
    else return false;
  }, m);
  const auto pieces = dist::shard_pieces(c.N, ranks(), rank_of(), causal);
  const Tensor qs = take(q.view, pieces, c.layout), ks = take(k.view, pieces, c.layout), vs = take(v.view, pieces, c.layout);
  dist::RingOptions o;
  o.return_lse = true;
  dist::RingStats st;
  o.stats = &st;
  const AttendResult got = dist::ring_attention(qs.view(), ks.view(), vs.view(), MPI_COMM_WORLD, m, o);
  ASSERT_EQ(got.out.view().tokens(), qs.view().tokens());
  // The float32 tolerance: 1e-5 absolute on outputs of magnitude <= 1 (softmax of unit values) and
  // on the log-sum-exp; the ring merges partials in a different order from attend()'s tiles.
  // Half inputs: the output is rounded to q's dtype, so allow 2 units in its last place at
  // magnitude <= 2 (bf16: 2^-7 per unit in [1, 2); f16: 2^-10).
  const double out_tol = c.dtype == DType::bf16 ? 4 * 0x1p-7 : c.dtype == DType::f16 ? 4 * 0x1p-10 : 1e-5;
  expect_rows_near(got.out.view(), ref.out.view(), pieces, out_tol, "out vs reference");
  expect_rows_near(got.lse.view(), ref.lse.view(), pieces, 1e-5, "lse vs reference");
  expect_rows_near(got.out.view(), fast.out.view(), pieces, out_tol, "out vs attend()");
  EXPECT_EQ(got.out.view().dtype, c.dtype);
  EXPECT_EQ(st.steps, ranks());
  // every rank sends all but its last-held shard
  if (ranks() == 1) EXPECT_EQ(st.bytes_sent, 0);
}

TEST(Ring, NonCausal) { check_ring({}); }
TEST(Ring, NonCausalBnhdGqa) { check_ring({.B = 2, .H = 4, .Hkv = 2, .N = 13, .layout = Layout::bnhd}); }
TEST(Ring, Causal) { check_ring({.N = 16, .mechanism = "softmax:causal"}); }
TEST(Ring, CausalRagged) { check_ring({.N = 11, .mechanism = "softmax:causal"}); }
TEST(Ring, CausalOneToken) { check_ring({.N = 1, .mechanism = "softmax:causal"}); }
TEST(Ring, FewerTokensThanRanks) { check_ring({.N = 3, .mechanism = "softmax:causal"}); }
TEST(Ring, NonCausalFewerTokensThanRanks) { check_ring({.N = 2}); }
TEST(Ring, CausalGqa) { check_ring({.H = 4, .Hkv = 1, .N = 19, .Dv = 5, .mechanism = "softmax:causal"}); }
TEST(Ring, CausalWindow) { check_ring({.N = 23, .mechanism = "softmax:causal,window=4:0"}); }
TEST(Ring, TwoSidedWindow) { check_ring({.N = 21, .mechanism = "softmax:window=3:2"}); }
TEST(Ring, WindowSinks) { check_ring({.N = 25, .mechanism = "softmax:causal,window=3:0,sinks=2"}); }
TEST(Ring, Softcap) { check_ring({.N = 9, .mechanism = "softmax:causal,softcap=5"}); }
TEST(Ring, Longformer) { check_ring({.N = 20, .mechanism = "longformer:window=2:2,global=0;7"}); }
TEST(Ring, CausalBf16) { check_ring({.H = 4, .Hkv = 2, .N = 14, .mechanism = "softmax:causal", .dtype = DType::bf16}); }
TEST(Ring, WindowF16) { check_ring({.N = 12, .mechanism = "softmax:causal,window=3:0", .dtype = DType::f16}); }
TEST(Ring, BigBird) { check_ring({.N = 24, .mechanism = "bigbird:block=4,window=3,global=1,random=1,seed=3"}); }

// Packed sequences: the ring over the whole stream equals attend_varlen on the whole.
void check_varlen(const std::vector<int64_t>& cu, const std::string& mechanism) {
  SCOPED_TRACE(mechanism + " varlen ranks=" + std::to_string(ranks()));
  const int64_t n = cu.back();
  std::mt19937 rng(99);
  auto q = random_tensor(rng, DType::f32, 1, 4, n, 8);
  auto k = random_tensor(rng, DType::f32, 1, 2, n, 8);
  auto v = random_tensor(rng, DType::f32, 1, 2, n, 8);
  const Mechanism m = parse_mechanism(mechanism);
  int64_t longest = 0;
  for (size_t t = 1; t < cu.size(); ++t) longest = std::max(longest, cu[t] - cu[t - 1]);
  AttendOptions wo;
  wo.return_lse = true;
  wo.form = "reference";
  const AttendResult ref = attend_varlen(q.view, k.view, v.view, cu, cu, longest, longest, m, wo);
  const bool causal = mechanism.find("causal") != std::string::npos;
  const auto pieces = dist::shard_pieces(n, ranks(), rank_of(), causal);
  const Tensor qs = take(q.view, pieces), ks = take(k.view, pieces), vs = take(v.view, pieces);
  dist::RingOptions o;
  o.return_lse = true;
  o.cu_seqlens = cu;
  const AttendResult got = dist::ring_attention(qs.view(), ks.view(), vs.view(), MPI_COMM_WORLD, m, o);
  expect_rows_near(got.out.view(), ref.out.view(), pieces, 1e-5, "varlen out");
  expect_rows_near(got.lse.view(), ref.lse.view(), pieces, 1e-5, "varlen lse");
}

TEST(Ring, VarlenCausal) { check_varlen({0, 5, 5, 12, 20}, "softmax:causal"); }
TEST(Ring, VarlenNonCausal) { check_varlen({0, 3, 17, 18}, "softmax"); }
TEST(Ring, VarlenWindowSinks) { check_varlen({0, 9, 10, 23}, "softmax:causal,window=3:0,sinks=1"); }
TEST(Ring, VarlenOneSequence) { check_varlen({0, 7}, "softmax:causal"); }

TEST(Ring, VarlenDisagreeingOffsetsIsAnError) {
  if (ranks() == 1) GTEST_SKIP() << "needs two ranks";
  std::mt19937 rng(12);
  const int64_t n = dist::shard_length(8, ranks(), rank_of(), false);
  auto q = random_tensor(rng, DType::f32, 1, 1, n, 4);
  dist::RingOptions o;
  o.cu_seqlens = rank_of() == 1 ? std::vector<int64_t>{0, 3, 8} : std::vector<int64_t>{0, 4, 8};
  expect_error([&] { (void)dist::ring_attention(q.view, q.view, q.view, MPI_COMM_WORLD, Softmax{}, o); },
               "cu_seqlens must be the same on every rank: rank 1's (3 offsets) differs from rank 0's (3)");
}

TEST(Ring, VarlenBadOffsetsIsAnError) {
  std::mt19937 rng(13);
  const int64_t n = dist::shard_length(8, ranks(), rank_of(), false);
  auto q = random_tensor(rng, DType::f32, 1, 1, n, 4);
  dist::RingOptions o;
  o.cu_seqlens = {0, 5, 7};
  expect_error([&] { (void)dist::ring_attention(q.view, q.view, q.view, MPI_COMM_WORLD, Softmax{}, o); },
               "cu_seqlens must run from 0 to the total tokens 8 over the ranks, got 3 offsets ending at 7");
}

TEST(Ring, NaNKeyPoisonsTheRowsThatSeeIt) {
  // Key 5 is NaN: under causal attention exactly the queries i >= 5 become NaN, as attend() says.
  std::mt19937 rng(17);
  const int64_t n = 12;
  auto q = random_tensor(rng, DType::f32, 1, 2, n, 4);
  auto k = random_tensor(rng, DType::f32, 1, 2, n, 4);
  for (int64_t h = 0; h < 2; ++h) fill_token(k.view, 0, h, 5, nan_f());
  const Mechanism m = parse_mechanism("softmax:causal");
  const AttendResult whole = attend(q.view, k.view, q.view, m);
  const auto pieces = dist::shard_pieces(n, ranks(), rank_of(), true);
  const Tensor qs = take(q.view, pieces), ks = take(k.view, pieces);
  const AttendResult got = dist::ring_attention(qs.view(), ks.view(), qs.view(), MPI_COMM_WORLD, m);
  for (const auto& p : pieces)
    for (int64_t i = 0; i < p.length; ++i)
      EXPECT_EQ(std::isnan(got.out.at(0, 1, p.local + i, 2)), p.start + i >= 5) << "query " << p.start + i;
  expect_rows_near(got.out.view(), whole.out.view(), pieces, 1e-5, "out with a NaN key");
}

TEST(Ring, BitwiseAcrossThreadCounts) {
  std::mt19937 rng(18);
  const int64_t n = 40;
  auto q = random_tensor(rng, DType::f32, 1, 4, n, 16);
  const Mechanism m = parse_mechanism("softmax:causal,window=9:0");
  const auto pieces = dist::shard_pieces(n, ranks(), rank_of(), true);
  const Tensor qs = take(q.view, pieces);
  dist::RingOptions one, two;
  one.threads = 1, two.threads = 2;
  one.return_lse = two.return_lse = true;
  const AttendResult a = dist::ring_attention(qs.view(), qs.view(), qs.view(), MPI_COMM_WORLD, m, one);
  const AttendResult b = dist::ring_attention(qs.view(), qs.view(), qs.view(), MPI_COMM_WORLD, m, two);
  const auto& av = a.out.view();
  EXPECT_EQ(std::memcmp(av.data, b.out.view().data, static_cast<size_t>(av.numel()) * sizeof(float)), 0);
  EXPECT_EQ(std::memcmp(a.lse.view().data, b.lse.view().data, static_cast<size_t>(a.lse.view().numel()) * sizeof(float)), 0);
}

TEST(Ring, WindowSkipsHiddenPairs) {
  // Non-causal window 1:1 over 4 ranks x 8 tokens: a rank sees only its neighbours' shards.
  std::mt19937 rng(5);
  const int64_t n = 8 * ranks();
  auto q = random_tensor(rng, DType::f32, 1, 1, n, 4);
  const auto pieces = dist::shard_pieces(n, ranks(), rank_of(), false);
  const Tensor qs = take(q.view, pieces);
  dist::RingStats st;
  dist::RingOptions o;
  o.stats = &st;
  (void)dist::ring_attention(qs.view(), qs.view(), qs.view(), MPI_COMM_WORLD, parse_mechanism("softmax:window=1:1"), o);
  const int64_t neighbours = 1 + (rank_of() > 0) + (rank_of() + 1 < ranks());
  EXPECT_EQ(st.blocks_computed, neighbours);
  EXPECT_EQ(st.blocks_skipped, ranks() - neighbours);
}

TEST(Ring, OneRankNonCausalIsBitwiseAttend) {
  // One rank, one pair: the merge with an empty accumulator is exact, so the ring is attend().
  if (ranks() != 1) GTEST_SKIP() << "bitwise only with one rank";
  std::mt19937 rng(9);
  auto q = random_tensor(rng, DType::f32, 1, 2, 10, 8);
  AttendOptions o;
  o.return_lse = true;
  const AttendResult a = attend(q.view, q.view, q.view, Softmax{}, o);
  dist::RingOptions ro;
  ro.return_lse = true;
  const AttendResult b = dist::ring_attention(q.view, q.view, q.view, MPI_COMM_WORLD, Softmax{}, ro);
  for (int64_t i = 0; i < 10; ++i) {
    EXPECT_EQ(a.out.at(0, 1, i, 3), b.out.at(0, 1, i, 3));
    EXPECT_EQ(a.lse.at(0, 1, i, 0), b.lse.at(0, 1, i, 0));
  }
}

TEST(Ring, DisagreeingShapeIsAnErrorOnEveryRank) {
  // The last rank's shard has one head dim more: every rank throws, none hangs.
  if (ranks() == 1) GTEST_SKIP() << "needs two ranks";
  std::mt19937 rng(2);
  const bool odd = rank_of() == ranks() - 1;
  const int64_t n = dist::shard_length(8, ranks(), rank_of(), false);
  auto q = random_tensor(rng, DType::f32, 1, 2, n, odd ? 5 : 4);
  expect_error([&] { (void)dist::ring_attention(q.view, q.view, q.view, MPI_COMM_WORLD); },
               "head dim must agree on every rank: rank 0 has 4, rank " + std::to_string(ranks() - 1) + " has 5");
}

TEST(Ring, WrongShardLengthIsAnErrorOnEveryRank) {
  if (ranks() == 1) GTEST_SKIP() << "needs two ranks";
  std::mt19937 rng(3);
  // causal wants zig-zag shards; every rank passes 2 tokens, which fits only when 2R tokens
  // split into equal pieces -- it does, so the last rank passes 3 instead.
  const int64_t n = rank_of() == ranks() - 1 ? 3 : 2;
  auto q = random_tensor(rng, DType::f32, 1, 1, n, 4);
  expect_error([&] { (void)dist::ring_attention(q.view, q.view, q.view, MPI_COMM_WORLD, parse_mechanism("softmax:causal")); },
               "a zig-zag shard of");
}

TEST(Ring, DisagreeingMechanismIsAnErrorOnEveryRank) {
  // The last rank asks for a window: the same error everywhere, before any shard moves.
  if (ranks() == 1) GTEST_SKIP() << "needs two ranks";
  std::mt19937 rng(21);
  auto q = random_tensor(rng, DType::f32, 1, 1, dist::shard_length(8, ranks(), rank_of(), false), 4);
  const Mechanism m = parse_mechanism(rank_of() == ranks() - 1 ? "softmax:window=2:2" : "softmax");
  expect_error([&] { (void)dist::ring_attention(q.view, q.view, q.view, MPI_COMM_WORLD, m); },
               "distributed::ring_attention: the mechanism (and zigzag_auto) must be the same on every rank: rank " +
                   std::to_string(ranks() - 1) + "'s differs from rank 0's");
}

TEST(Ring, LocalErrorReachesEveryRank) {
  // Rank 0's k has 3 heads for q's 2: its message, on every rank.
  std::mt19937 rng(4);
  auto q = random_tensor(rng, DType::f32, 1, 2, 4, 4);
  auto k = random_tensor(rng, DType::f32, 1, rank_of() == 0 ? 3 : 2, 4, 4);
  expect_error([&] { (void)dist::ring_attention(q.view, k.view, k.view, MPI_COMM_WORLD); },
               "rank 0 of " + std::to_string(ranks()) + ": k has 3 heads, which does not divide q's 2");
}

TEST(Ring, UnsupportedMechanismIsAnError) {
  std::mt19937 rng(6);
  auto q = random_tensor(rng, DType::f32, 1, 1, 4, 4);
  expect_error([&] { (void)dist::ring_attention(q.view, q.view, q.view, MPI_COMM_WORLD, parse_mechanism("softmax:dropout=0.1")); },
               "dropout is not supported across ranks");
}

// ---- backward through the ring ------------------------------------------------------------------

void check_backward(const Case& c, const std::vector<int64_t>& cu = {}) {
  SCOPED_TRACE("backward " + name(c));
  std::mt19937 rng(4321);
  auto q = random_tensor(rng, DType::f32, c.B, c.H, c.N, c.D);
  auto k = random_tensor(rng, DType::f32, c.B, c.Hkv, c.N, c.D);
  auto v = random_tensor(rng, DType::f32, c.B, c.Hkv, c.N, c.Dv);
  auto dout = random_tensor(rng, DType::f32, c.B, c.H, c.N, c.Dv);
  const Mechanism m = parse_mechanism(c.mechanism);
  AttendOptions wo;
  wo.return_lse = true;
  AttendResult whole;
  AttendGradients want;
  if (cu.empty()) {
    whole = attend(q.view, k.view, v.view, m, wo);
    want = attend_backward(dout.view, q.view, k.view, v.view, whole.out.view(), whole.lse.view(), m);
  }
  const bool causal = c.mechanism.find("causal") != std::string::npos;
  const auto pieces = dist::shard_pieces(c.N, ranks(), rank_of(), causal);
  const Tensor qs = take(q.view, pieces), ks = take(k.view, pieces), vs = take(v.view, pieces),
               dos = take(dout.view, pieces);
  dist::RingOptions o;
  o.return_lse = true;
  o.cu_seqlens = cu;
  const AttendResult fwd = dist::ring_attention(qs.view(), ks.view(), vs.view(), MPI_COMM_WORLD, m, o);
  dist::RingStats st;
  o.stats = &st;
  const AttendGradients got = dist::ring_attention_backward(dos.view(), qs.view(), ks.view(), vs.view(), fwd.out.view(),
                                                            fwd.lse.view(), MPI_COMM_WORLD, m, o);
  if (!cu.empty()) {  // packed sequences: each sequence's own backward, as whole
    int64_t longest = 0;
    for (size_t t = 1; t < cu.size(); ++t) longest = std::max(longest, cu[t] - cu[t - 1]);
    whole = attend_varlen(q.view, k.view, v.view, cu, cu, longest, longest, m, wo);
    // the varlen backward is each sequence's backward; build it from per-sequence calls
    want.dq = Tensor(DType::f32, {1, c.H, c.N, c.D});
    want.dk = Tensor(DType::f32, {1, c.Hkv, c.N, c.D});
    want.dv = Tensor(DType::f32, {1, c.Hkv, c.N, c.Dv});
    for (size_t t = 0; t + 1 < cu.size(); ++t) {
      const int64_t s0 = cu[t], len = cu[t + 1] - cu[t];
      if (len == 0) continue;
      auto part = [&](const TensorView& x) { return dist_rows(x, s0, len); };
      const AttendGradients g = attend_backward(part(dout.view), part(q.view), part(k.view), part(v.view),
                                                part(whole.out.view()), part(whole.lse.view()), m);
      for (auto [from, to] : {std::pair{&g.dq, &want.dq}, {&g.dk, &want.dk}, {&g.dv, &want.dv}})
        for (int64_t h = 0; h < from->view().heads(); ++h)
          for (int64_t i = 0; i < len; ++i)
            for (int64_t ch = 0; ch < from->view().dim(); ++ch)
              store_from_float(to->view().data, DType::f32, to->view().offset(0, h, s0 + i, ch), from->at(0, h, i, ch));
    }
  }
  // The pairs' shares add in ring order instead of attend_backward's tile order: 2e-5 on
  // gradients of magnitude ~1-5 (unit-normal inputs, N <= 30).
  expect_rows_near(got.dq.view(), want.dq.view(), pieces, 2e-5, "dq");
  expect_rows_near(got.dk.view(), want.dk.view(), pieces, 2e-5, "dk");
  expect_rows_near(got.dv.view(), want.dv.view(), pieces, 2e-5, "dv");
  if (ranks() > 1) EXPECT_GT(st.bytes_sent, 0);
}

TEST(RingBackward, NonCausal) { check_backward({.N = 13}); }
TEST(RingBackward, CausalGqa) { check_backward({.H = 4, .Hkv = 2, .N = 17, .Dv = 6, .mechanism = "softmax:causal"}); }
TEST(RingBackward, CausalOneToken) { check_backward({.N = 1, .mechanism = "softmax:causal"}); }
TEST(RingBackward, FewerTokensThanRanks) { check_backward({.N = 3, .mechanism = "softmax:causal"}); }
TEST(RingBackward, WindowSinksSoftcap) { check_backward({.N = 22, .mechanism = "softmax:causal,window=4:0,sinks=2,softcap=8"}); }
TEST(RingBackward, Varlen) { check_backward({.B = 1, .N = 19, .mechanism = "softmax:causal"}, {0, 6, 6, 14, 19}); }

TEST(RingBackward, BadLseIsAnErrorOnEveryRank) {
  std::mt19937 rng(23);
  const int64_t n = dist::shard_length(8, ranks(), rank_of(), false);
  auto q = random_tensor(rng, DType::f32, 1, 2, n, 4);
  auto lse = random_tensor(rng, DType::f32, 1, 2, n, rank_of() == 0 ? 2 : 1);
  expect_error([&] {
    (void)dist::ring_attention_backward(q.view, q.view, q.view, q.view, q.view, lse.view, MPI_COMM_WORLD);
  }, "rank 0 of " + std::to_string(ranks()) + ": lse must be float32 of shape (1, 2, " + std::to_string(dist::shard_length(8, ranks(), 0, false)) + ", 1)");
}

// ---- decode ------------------------------------------------------------------------------------

void check_decode(int64_t M, int64_t H, int64_t Hkv, int64_t Nq) {
  SCOPED_TRACE("decode M=" + std::to_string(M) + " ranks=" + std::to_string(ranks()));
  std::mt19937 rng(77);
  auto q = random_tensor(rng, DType::f32, 2, H, Nq, 8);
  auto k = random_tensor(rng, DType::f32, 2, Hkv, M, 8);
  auto v = random_tensor(rng, DType::f32, 2, Hkv, M, 6);
  AttendOptions o;
  o.return_lse = true;
  o.form = "reference";
  const AttendResult ref = attend(q.view, k.view, v.view, Softmax{}, o);
  const auto pieces = dist::shard_pieces(M, ranks(), rank_of(), false);
  const Tensor ks = take(k.view, pieces), vs = take(v.view, pieces);
  const AttendResult got = dist::decode(q.view, ks.view(), vs.view(), MPI_COMM_WORLD, {}, true);
  const std::vector<dist::Piece> all_rows{{0, Nq, 0}};
  expect_rows_near(got.out.view(), ref.out.view(), all_rows, 1e-5, "decode out");
  expect_rows_near(got.lse.view(), ref.lse.view(), all_rows, 1e-5, "decode lse");
  // the same bits on every rank
  const float x = got.out.at(1, H - 1, Nq - 1, 5);
  float lo = x, hi = x;
  MPI_Allreduce(&x, &lo, 1, MPI_FLOAT, MPI_MIN, MPI_COMM_WORLD);
  MPI_Allreduce(&x, &hi, 1, MPI_FLOAT, MPI_MAX, MPI_COMM_WORLD);
  EXPECT_EQ(lo, hi);
}

TEST(Decode, Sharded) { check_decode(17, 4, 2, 1); }
TEST(Decode, SeveralQueriesGqa) { check_decode(9, 4, 1, 3); }
TEST(Decode, EmptyShards) { check_decode(2, 2, 2, 1); }  // ranks 2, 3 hold no key

TEST(Decode, DisagreeingQueriesIsAnError) {
  if (ranks() == 1) GTEST_SKIP() << "needs two ranks";
  std::mt19937 rng(8);
  auto q = random_tensor(rng, DType::f32, 1, 2, rank_of() == ranks() - 1 ? 2 : 1, 4);
  auto k = random_tensor(rng, DType::f32, 1, 2, 3, 4);
  expect_error([&] { (void)dist::decode(q.view, k.view, k.view, MPI_COMM_WORLD); },
               "q tokens must agree on every rank");
}

TEST(Decode, DisagreeingMechanismIsAnError) {
  if (ranks() == 1) GTEST_SKIP() << "needs two ranks";
  std::mt19937 rng(22);
  auto q = random_tensor(rng, DType::f32, 1, 2, 1, 4);
  auto k = random_tensor(rng, DType::f32, 1, 2, 3, 4);
  Softmax m;
  if (rank_of() == 1) m.softcap = 20;
  expect_error([&] { (void)dist::decode(q.view, k.view, k.view, MPI_COMM_WORLD, m); },
               "the mechanism (fingerprint) must agree on every rank");
}

// ---- linear ------------------------------------------------------------------------------------

void check_linear(const std::string& text, int64_t N) {
  SCOPED_TRACE(text + " N=" + std::to_string(N) + " ranks=" + std::to_string(ranks()));
  std::mt19937 rng(31);
  auto q = random_tensor(rng, DType::f32, 1, 2, N, 6);
  auto k = random_tensor(rng, DType::f32, 1, 2, N, 6);
  auto v = random_tensor(rng, DType::f32, 1, 2, N, 5);
  const Linear m = std::get<Linear>(parse_mechanism(text));
  AttendOptions o;
  o.return_final_state = true;
  o.form = "reference";
  const AttendResult ref = attend(q.view, k.view, v.view, m, o);
  const auto pieces = dist::shard_pieces(N, ranks(), rank_of(), false);
  const Tensor qs = take(q.view, pieces), ks = take(k.view, pieces), vs = take(v.view, pieces);
  const AttendResult got = dist::linear_attention(qs.view(), ks.view(), vs.view(), MPI_COMM_WORLD, m, true);
  // The state tolerance in absolute form: values and states of magnitude ~1-10
  expect_rows_near(got.out.view(), ref.out.view(), pieces, 2e-5, "linear out");
  const TensorView& fs = got.final_state.view();
  const std::vector<dist::Piece> all_rows{{0, fs.tokens(), 0}};
  double scale = 0;
  for (int64_t f = 0; f < fs.tokens(); ++f) scale = std::max(scale, std::abs(static_cast<double>(ref.final_state.at(0, 1, f, 0))));
  expect_rows_near(fs, ref.final_state.view(), all_rows, 1e-5 * std::max(1.0, scale) * 4, "final state");
}

TEST(Linear, CausalElu) { check_linear("linear:map=elu,causal", 13); }
TEST(Linear, CausalDecay) { check_linear("linear:map=elu,causal,decay=0.9", 10); }
TEST(Linear, CausalUnnormalisedOneToken) { check_linear("linear:map=identity,causal,normalize=0", 1); }
TEST(Linear, NonCausal) { check_linear("linear:map=elu", 7); }
TEST(Linear, FewerTokensThanRanks) { check_linear("linear:map=relu,causal", 2); }

void check_linear_backward(const std::string& text, int64_t N, bool with_dfinal) {
  SCOPED_TRACE(text + " backward N=" + std::to_string(N) + " ranks=" + std::to_string(ranks()));
  std::mt19937 rng(57);
  auto q = random_tensor(rng, DType::f32, 1, 2, N, 6);
  auto k = random_tensor(rng, DType::f32, 1, 2, N, 6);
  auto v = random_tensor(rng, DType::f32, 1, 2, N, 5);
  auto dout = random_tensor(rng, DType::f32, 1, 2, N, 5);
  const Linear m = std::get<Linear>(parse_mechanism(text));
  AttendOptions o;
  o.return_final_state = true;
  const AttendResult whole = attend(q.view, k.view, v.view, m, o);
  const auto sh = whole.final_state.view().shape;
  auto dfinal = random_tensor(rng, DType::f32, sh[0], sh[1], sh[2], sh[3]);
  const TensorView no_lse{};
  const AttendGradients want = attend_backward(dout.view, q.view, k.view, v.view, whole.out.view(), no_lse, m, {},
                                               nullptr, with_dfinal ? &dfinal.view : nullptr);
  const auto pieces = dist::shard_pieces(N, ranks(), rank_of(), false);
  const Tensor qs = take(q.view, pieces), ks = take(k.view, pieces), vs = take(v.view, pieces), dos = take(dout.view, pieces);
  const AttendGradients got = dist::linear_attention_backward(dos.view(), qs.view(), ks.view(), vs.view(), MPI_COMM_WORLD,
                                                              m, with_dfinal ? &dfinal.view : nullptr);
  // rule 5 in absolute form, gradients of magnitude ~1-10
  expect_rows_near(got.dq.view(), want.dq.view(), pieces, 5e-5, "dq");
  expect_rows_near(got.dk.view(), want.dk.view(), pieces, 5e-5, "dk");
  expect_rows_near(got.dv.view(), want.dv.view(), pieces, 5e-5, "dv");
}

TEST(LinearBackward, CausalElu) { check_linear_backward("linear:map=elu,causal", 13, false); }
TEST(LinearBackward, CausalDecayFinalState) { check_linear_backward("linear:map=elu,causal,decay=0.9", 11, true); }
TEST(LinearBackward, NonCausalFinalState) { check_linear_backward("linear:map=elu", 9, true); }
TEST(LinearBackward, UnnormalisedFewerTokensThanRanks) { check_linear_backward("linear:map=relu,causal,normalize=0", 2, true); }

}  // namespace
}  // namespace attn::testing

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  ::testing::InitGoogleTest(&argc, argv);
  const int rc = RUN_ALL_TESTS();
  MPI_Finalize();
  return rc;
}
