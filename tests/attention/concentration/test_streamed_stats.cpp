// Streamed row statistics (AttendOptions::return_stats) as promised beyond the case list's
// comparisons with the reference: every family's fast form gives them (none falls back to the
// reference, which holds N x M), bitwise the same for any thread count, and a call whose N x M
// weights would not fit in memory computes them in a few MiB.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <string>

#include <csignal>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "support/random_inputs.hpp"

namespace attn {
namespace {

struct FamilyCase {
  const char* mechanism;
  int64_t H, Hkv, N, M, D;
};

// One mechanism per family (and per softmax form), at sizes where their fast forms run.
const FamilyCase kFamilies[] = {
    {"softmax:causal", 4, 2, 200, 200, 32},                 // tiled
    {"softmax:softcap=20", 8, 2, 1, 3000, 32},             // rows (split-K chunks)
    {"longformer:window=8:8,global=0;77", 4, 2, 150, 150, 16},  // tiled + global rows apart
    {"lsh:buckets=8,rounds=3,chunk=16,seed=2", 4, 2, 150, 150, 16},
    {"dca:chunk=32,local=8", 4, 2, 150, 150, 16},
    {"linformer:k=24,seed=1", 4, 2, 100, 150, 16},
    {"gau:causal", 4, 2, 150, 150, 16},
    {"linear:map=elu", 4, 2, 100, 150, 16},
    {"retention:decay=0.9", 4, 4, 150, 150, 16},
    {"performer:features=32,seed=3,causal", 4, 2, 150, 150, 16},
    {"polaformer:power=3", 4, 2, 100, 150, 16},
    {"efficient", 4, 2, 100, 150, 16},
    {"efficient:causal", 4, 2, 150, 150, 16},
};

Tensor stack(const AttendResult& r) {  // the four statistics side by side, for bitwise comparison
  const TensorView& s = r.sparsity.view();
  Tensor t(DType::f32, {s.shape[0], s.shape[1], s.shape[2], 4});
  int c = 0;
  for (const Tensor* x : {&r.sparsity, &r.entropy, &r.max_weight, &r.topk_mass}) {
    for (int64_t b = 0; b < s.shape[0]; ++b)
      for (int64_t h = 0; h < s.shape[1]; ++h)
        for (int64_t i = 0; i < s.shape[2]; ++i)
          static_cast<float*>(t.view().data)[t.view().offset(b, h, i, c)] = x->at(b, h, i, 0);
    ++c;
  }
  return t;
}

TEST(StreamedStats, EveryFamilysFastFormStreamsThem) {
  std::mt19937 rng(5);
  for (const FamilyCase& f : kFamilies) {
    auto q = testing::random_tensor(rng, DType::f32, 1, f.H, f.N, f.D);
    auto k = testing::random_tensor(rng, DType::f32, 1, f.Hkv, f.M, f.D);
    AttendOptions o;
    o.return_stats = true;
    const Explanation e = explain(q.view, k.view, k.view, parse_mechanism(f.mechanism), o);
    EXPECT_NE(e.chosen, "reference") << f.mechanism << ":\n" << e.text();
  }
}

TEST(StreamedStats, BitwiseAcrossThreadCounts) {
  std::mt19937 rng(7);
  for (const FamilyCase& f : kFamilies)
    for (int64_t topk : {8, 40}) {  // lists and heaps
      auto q = testing::random_tensor(rng, DType::f32, 2, f.H, f.N, f.D);
      auto k = testing::random_tensor(rng, DType::f32, 2, f.Hkv, f.M, f.D);
      auto v = testing::random_tensor(rng, DType::f32, 2, f.Hkv, f.M, f.D);
      AttendOptions o;
      o.return_stats = true;
      o.stats_topk = topk;
      o.threads = 1;
      const Tensor one = stack(attend(q.view, k.view, v.view, parse_mechanism(f.mechanism), o));
      for (int t : {2, 3, 5}) {
        o.threads = t;
        const Tensor many = stack(attend(q.view, k.view, v.view, parse_mechanism(f.mechanism), o));
        EXPECT_EQ(std::memcmp(one.view().data, many.view().data, static_cast<size_t>(one.view().numel()) * 4), 0)
            << f.mechanism << " k " << topk << " threads " << t;
      }
    }
}

// A size in /proc/self/status (VmHWM: peak resident, VmSize: address space), in MiB.
double status_mib(const std::string& key) {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind(key + ":", 0) == 0) return std::stod(line.substr(key.size() + 1)) / 1024.0;
  return -1;
}

#if defined(__SANITIZE_ADDRESS__)
constexpr bool kAddressSanitizer = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
constexpr bool kAddressSanitizer = true;
#else
constexpr bool kAddressSanitizer = false;
#endif
#else
constexpr bool kAddressSanitizer = false;
#endif

// In a child process (so a bad_alloc or an OOM cannot take the suite down) whose address space is
// capped at what it has plus 512 MiB (not under AddressSanitizer, which reserves terabytes of
// shadow; there the peak RSS check alone holds): each call's N x M floats would be >= 1 GiB.
TEST(StreamedStats, NeverHoldTheWeightMatrix) {
  struct Big {
    const char* mechanism;
    int64_t N;
  } const calls[] = {{"softmax:window=64:0", 1 << 16},  // N x M floats: 16 GiB
                     {"lsh:buckets=16,rounds=2,chunk=32,seed=1", 1 << 14},
                     {"dca:chunk=2048,local=512", 1 << 14},
                     {"linformer:k=64,seed=1", 1 << 14},
                     {"gau:causal", 1 << 14},
                     {"linear:map=elu,causal", 1 << 14},
                     {"polaformer:power=3", 1 << 14},
                     {"efficient:causal", 1 << 14}};
  for (const Big& c : calls) {
    std::mt19937 rng(9);
    auto q = testing::random_tensor(rng, DType::f32, 1, 1, c.N, 8);
    AttendOptions o;
    o.return_stats = true;
    o.threads = 2;
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      // A runaway child ends on CPU time, not wall time (a busy machine stretches the latter
      // without bound): 30 CPU minutes, ~4x what PolaFormer at N = 16384 takes under ASan/UBSan.
      const rlimit cpu{1800, 1800};
      setrlimit(RLIMIT_CPU, &cpu);
      if (!kAddressSanitizer) {
        const auto cap = static_cast<rlim_t>((status_mib("VmSize") + 512) * (1 << 20));
        const rlimit r{cap, cap};
        setrlimit(RLIMIT_AS, &r);
      }
      const double before = status_mib("VmHWM");
      try {
        const AttendResult r = attend(q.view, q.view, q.view, parse_mechanism(c.mechanism), o);
        if (!(r.sparsity.at(0, 0, c.N - 1, 0) > 0)) _exit(4);  // a value, not NaN
      } catch (const std::bad_alloc&) {
        _exit(3);
      }
      _exit(status_mib("VmHWM") - before < 256 ? 0 : 5);
    }
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFEXITED(status)) << c.mechanism << ": child did not exit normally (signal " << WTERMSIG(status)
                                   << (WTERMSIG(status) == SIGXCPU ? ": over 30 minutes of CPU time" : "") << ")";
    EXPECT_EQ(WEXITSTATUS(status), 0) << c.mechanism << ": 3 = bad_alloc, 4 = no value, 5 = peak RSS grew >= 256 MiB";
  }
}

}  // namespace
}  // namespace attn
