// Results are bitwise the same whatever the thread count, and hidden keys cannot leak NaN.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "support/random_inputs.hpp"

namespace attn {
namespace {

bool bitwise_equal(const Tensor& a, const Tensor& b) {
  const auto& va = a.view();
  return va.shape == b.view().shape &&
         std::memcmp(va.data, b.view().data, static_cast<size_t>(va.numel()) * dtype_size(va.dtype)) == 0;
}

TEST(Determinism, BitwiseAcrossThreadCountsAndRepeats) {
  std::mt19937 rng(11);
  auto q = testing::random_tensor(rng, DType::f32, 3, 4, 200, 32);
  auto k = testing::random_tensor(rng, DType::f32, 3, 2, 300, 32);
  auto v = testing::random_tensor(rng, DType::f32, 3, 2, 300, 32);
  for (const char* mech : {"softmax:causal", "softmax:dropout=0.2,seed=5"})
    for (Isa isa : supported_isas()) {
      AttendOptions o;
      o.isa = isa;
      o.return_lse = true;
      o.threads = 1;
      const auto one = attend(q.view, k.view, v.view, parse_mechanism(mech), o);
      for (int t : {2, 3, 5, 2}) {
        o.threads = t;
        const auto many = attend(q.view, k.view, v.view, parse_mechanism(mech), o);
        EXPECT_TRUE(bitwise_equal(one.out, many.out)) << mech << " threads " << t << " " << isa_name(isa);
        EXPECT_TRUE(bitwise_equal(one.lse, many.lse)) << mech << " threads " << t;
      }
    }
}

// Decode-shaped calls take the split-K row path: still bitwise equal for any thread count, and
// keys hidden by padding (filled with NaN) do not leak.
TEST(Determinism, RowPathBitwiseAcrossThreadsAndNanSafe) {
  std::mt19937 rng(13);
  const int64_t B = 2, H = 8, Hkv = 2, N = 1, M = 5000, D = 64;
  auto q = testing::random_tensor(rng, DType::f32, B, H, N, D);
  auto k = testing::random_tensor(rng, DType::f32, B, Hkv, M, D);
  auto v = testing::random_tensor(rng, DType::f32, B, Hkv, M, D);
  AttendOptions o;
  o.key_padding_lengths = {M, 3333};
  o.return_lse = true;
  for (Isa isa : supported_isas()) {
    o.isa = isa;
    o.threads = 1;
    const auto one = attend(q.view, k.view, v.view, parse_mechanism("softmax:softcap=30"), o);
    for (int t : {2, 3, 5}) {
      o.threads = t;
      const auto many = attend(q.view, k.view, v.view, parse_mechanism("softmax:softcap=30"), o);
      EXPECT_TRUE(bitwise_equal(one.out, many.out)) << isa_name(isa) << " threads " << t;
      EXPECT_TRUE(bitwise_equal(one.lse, many.lse)) << isa_name(isa) << " threads " << t;
    }
    auto kp = k, vp = v;
    kp.view.data = kp.bytes.data(), vp.view.data = vp.bytes.data();
    for (int64_t h = 0; h < Hkv; ++h)
      for (int64_t j = 3333; j < M; ++j) {
        testing::fill_token(kp.view, 1, h, j, testing::nan_f());
        testing::fill_token(vp.view, 1, h, j, testing::nan_f());
      }
    const auto poisoned = attend(q.view, kp.view, vp.view, parse_mechanism("softmax:softcap=30"), o);
    EXPECT_TRUE(bitwise_equal(one.out, poisoned.out)) << isa_name(isa);
  }
}

// bf16/fp16 K and V rows are converted once per head and kept (row cache) or converted per
// tile when the cache would be too large: both give bitwise the same result.
TEST(RowCache, CachedAndPerTileConversionAgreeBitwise) {
  std::mt19937 rng(21);
  for (DType dt : {DType::bf16, DType::f16}) {
    auto q = testing::random_tensor(rng, dt, 2, 4, 150, 24, Layout::bnhd);
    auto k = testing::random_tensor(rng, dt, 2, 2, 170, 24, Layout::bnhd);
    auto v = testing::random_tensor(rng, dt, 2, 2, 170, 16, Layout::bnhd);
    AttendOptions o;
    o.threads = 2;
    const auto cached = attend(q.view, k.view, v.view, parse_mechanism("softmax:window=40:7"), o);
    o.row_cache_bytes = 0;
    const auto per_tile = attend(q.view, k.view, v.view, parse_mechanism("softmax:window=40:7"), o);
    EXPECT_TRUE(bitwise_equal(cached.out, per_tile.out)) << dtype_name(dt);
  }
}

// Keys hidden from every query (padding, a mask column of zeros, outside every window) are
// filled with NaN; outputs must be finite and bitwise equal to the clean run. Outputs are
// pre-filled with NaN so a value the kernel forgets to write is caught.
TEST(NanPoisoning, HiddenKeysDoNotLeak) {
  std::mt19937 rng(5);
  const int64_t B = 2, H = 2, N = 70, M = 150, D = 16;
  auto q = testing::random_tensor(rng, DType::f32, B, H, N, D);
  auto k = testing::random_tensor(rng, DType::f32, B, H, M, D);
  auto v = testing::random_tensor(rng, DType::f32, B, H, M, D);
  std::vector<uint8_t> mask(static_cast<size_t>(N * M), 1);
  for (int64_t i = 0; i < N; ++i) mask[i * M + 3] = mask[i * M + 90] = 0;  // keys 3, 90 hidden

  AttendOptions o;
  o.key_padding_lengths = {120, 77};
  o.mask = make_view(mask.data(), DType::boolean, 1, 1, N, M);
  o.return_lse = true;
  for (Isa isa : supported_isas()) {
    o.isa = isa;
    for (const char* mech : {"softmax", "softmax:window=10:10"}) {
      const Mechanism m = parse_mechanism(mech);
      Tensor out0(DType::f32, {B, H, N, D}), lse0(DType::f32, {B, H, N, 1});
      attend_into(q.view, k.view, v.view, m, o, out0.view(), &lse0.view(), nullptr);
      auto kp = k, vp = v;  // poisoned copies
      kp.view.data = kp.bytes.data(), vp.view.data = vp.bytes.data();
      for (int64_t b = 0; b < B; ++b)
        for (int64_t h = 0; h < H; ++h)
          for (int64_t j = 0; j < M; ++j) {
            const bool hidden = j >= o.key_padding_lengths[b] || j == 3 || j == 90 ||
                                (std::string(mech) != "softmax" && j > N - 1 + (M - N) + 10);
            if (hidden) {
              testing::fill_token(kp.view, b, h, j, testing::nan_f());
              testing::fill_token(vp.view, b, h, j, testing::nan_f());
            }
          }
      Tensor out1(DType::f32, {B, H, N, D}), lse1(DType::f32, {B, H, N, 1});
      std::fill_n(static_cast<float*>(out1.view().data), out1.view().numel(), testing::nan_f());
      std::fill_n(static_cast<float*>(lse1.view().data), lse1.view().numel(), testing::nan_f());
      attend_into(q.view, kp.view, vp.view, m, o, out1.view(), &lse1.view(), nullptr);
      EXPECT_TRUE(bitwise_equal(out0, out1)) << mech << " " << isa_name(isa);
      EXPECT_TRUE(bitwise_equal(lse0, lse1)) << mech << " " << isa_name(isa);
    }
  }
}

// Fully masked rows four ways: causal with N > M, a window that excludes every key, zero
// padding length, an all-false mask row. Each gives exactly 0 and lse = -inf.
TEST(FullyMaskedRows, ZerosAndMinusInfFourWays) {
  std::mt19937 rng(8);
  auto q = testing::random_tensor(rng, DType::f32, 2, 1, 80, 8);
  auto k = testing::random_tensor(rng, DType::f32, 2, 1, 70, 8);
  auto v = testing::random_tensor(rng, DType::f32, 2, 1, 70, 8);
  std::vector<uint8_t> mask(80 * 70, 1);
  std::fill_n(mask.begin() + 5 * 70, 70, 0);  // row 5 sees nothing
  struct Way { std::string mech; int64_t row; AttendOptions o; };
  std::vector<Way> ways(4);
  ways[0] = {"softmax:causal", 3, {}};          // query 3 sees keys j <= 3 - 10 < 0
  ways[1] = {"softmax:window=-1:-1", 0, {}};
  ways[1].mech = "softmax:window=0:0";           // query i sees only key i - 10; row 2 has none
  ways[1].row = 2;
  ways[2] = {"softmax", 7, {}};
  ways[2].o.key_padding_lengths = {70, 0};       // batch 1 sees no key at all
  ways[3] = {"softmax", 5, {}};
  ways[3].o.mask = make_view(mask.data(), DType::boolean, 1, 1, 80, 70);
  for (auto& w : ways)
    for (Isa isa : supported_isas()) {
      w.o.isa = isa;
      w.o.return_lse = true;
      const auto r = attend(q.view, k.view, v.view, parse_mechanism(w.mech), w.o);
      const int64_t b = w.o.key_padding_lengths.empty() ? 0 : 1;
      for (int64_t c = 0; c < 8; ++c) EXPECT_EQ(r.out.at(b, 0, w.row, c), 0.0f) << w.mech;
      EXPECT_EQ(r.lse.at(b, 0, w.row, 0), -INFINITY) << w.mech << " " << isa_name(isa);
    }
}

// Bias entries at float's most negative finite value (how some models mask) and long runs of
// them: outputs stay finite, and a row whose keys all carry it degrades to uniform weights over
// those keys (as in torch), not NaN.
TEST(LargeMagnitudes, LowestFiniteBiasStaysFinite) {
  std::mt19937 rng(9);
  const int64_t N = 70, M = 90, D = 16;
  auto q = testing::random_tensor(rng, DType::f32, 1, 2, N, D, Layout::bhnd, 5.0f);
  auto k = testing::random_tensor(rng, DType::f32, 1, 2, M, D, Layout::bhnd, 5.0f);
  auto v = testing::random_tensor(rng, DType::f32, 1, 2, M, D);
  std::vector<float> bias(static_cast<size_t>(N * M), 0.0f);
  const float lowest = std::numeric_limits<float>::lowest();
  for (int64_t i = 0; i < N; ++i)
    for (int64_t j = 0; j < M; ++j)
      if (i == 4 || j % 3 == 0) bias[i * M + j] = lowest;  // row 4: every key at lowest
  AttendOptions o;
  o.bias = make_view(bias.data(), DType::f32, 1, 1, N, M);
  for (Isa isa : supported_isas()) {
    o.isa = isa;
    const auto r = attend(q.view, k.view, v.view, parse_mechanism("softmax:softcap=30"), o);
    for (int64_t h = 0; h < 2; ++h)
      for (int64_t i = 0; i < N; ++i)
        for (int64_t c = 0; c < D; ++c) ASSERT_TRUE(std::isfinite(r.out.at(0, h, i, c))) << isa_name(isa);
    double mean = 0;  // row 4: the plain mean of v
    for (int64_t j = 0; j < M; ++j) mean += v.view.at(0, 1, j, 3);
    EXPECT_NEAR(r.out.at(0, 1, 4, 3), mean / M, 1e-5) << isa_name(isa);
  }
}

}  // namespace
}  // namespace attn

namespace attn {
namespace {

// Hardening, class 8: a process that used attn (and so OpenMP's thread pool) and then forks
// must be able to call attn in the child. The child runs single-threaded (the pool does not
// survive fork) and gets the same bits. A child that spins ends on a CPU-time limit (not wall time,
// which a busy machine stretches); one that blocks is ended by ctest's timeout.
TEST(Fork, ChildComputesTheSameResult) {
  std::mt19937 rng(3);
  auto q = testing::random_tensor(rng, DType::f32, 1, 4, 300, 32);
  AttendOptions o;
  o.threads = 2;
  const auto parent = attend(q.view, q.view, q.view, parse_mechanism("softmax:causal"), o);
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    const rlimit cpu{300, 300};
    setrlimit(RLIMIT_CPU, &cpu);
    const auto child = attend(q.view, q.view, q.view, parse_mechanism("softmax:causal"), o);
    _exit(bitwise_equal(parent.out, child.out) ? 0 : 3);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status)) << "child did not exit normally (signal " << WTERMSIG(status) << ")";
  EXPECT_EQ(WEXITSTATUS(status), 0) << "child result differs";
}

}  // namespace
}  // namespace attn
