// Parallel regions never allocate, and running out of memory is an attn::Error, not the end of
// the process. This program replaces the global operator new / delete (every usual
// overload), so it is its own executable: nothing else sees the counting allocator. The allocator
//   - counts the allocations made while a thread computes an item of a parallel region: every
//     fast form of every family must make none (a std::bad_alloc there calls std::terminate);
//   - can be armed to fail the k-th allocation from now (throwing new throws std::bad_alloc, the
//     nothrow forms return null). Sweeping k = 1, 2, ... over a call, each failing call must throw
//     attn::Error saying "out of memory", and the next call, unarmed, must give the same bits.
// Works under the asan-ubsan preset too: the executable's operator new interposes on the
// sanitizer runtime's, and allocates through malloc / posix_memalign, which ASan still checks.
#include <gtest/gtest.h>

#include <atomic>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <new>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "attn/attn.hpp"
#include "attn/info.hpp"
#include "attn/moe.hpp"
#include "base/parallel.hpp"
#include "base/thread_team.hpp"
#include "families/internal_api.hpp"
#include "harness/check.hpp"
#include "support/random_inputs.hpp"

// ---- the counting, failing allocator ------------------------------------------------------------

namespace {

std::atomic<long> g_in_parallel{0};  // allocations made inside a parallel region
std::atomic<long> g_outside{0};      // outside one, since the last arm()
std::atomic<long> g_fail_at{0};      // > 0: allocation number g_fail_at outside a region fails
std::atomic<bool> g_fired{false};    // the armed failure happened

// Whether this allocation must fail. Inside a parallel region an allocation is only counted,
// never failed: the test reports it instead of ending in std::terminate.
bool must_fail() {
  if (attn::in_team_region()) {
    g_in_parallel.fetch_add(1, std::memory_order_relaxed);
    return false;
  }
  const long n = g_outside.fetch_add(1, std::memory_order_relaxed) + 1;
  if (n != g_fail_at.load(std::memory_order_relaxed)) return false;
  g_fail_at = 0;
  g_fired = true;
  return true;
}

void* allocate(std::size_t size, std::size_t align, bool nothrow) {
  void* p = nullptr;
  if (!must_fail()) {
    if (size == 0) size = 1;
    if (align <= alignof(std::max_align_t))
      p = std::malloc(size);
    else if (posix_memalign(&p, align, size) != 0)
      p = nullptr;
  }
  if (!p && !nothrow) throw std::bad_alloc();
  return p;
}

constexpr std::size_t kPlain = alignof(std::max_align_t);

}  // namespace

void* operator new(std::size_t n) { return allocate(n, kPlain, false); }
void* operator new[](std::size_t n) { return allocate(n, kPlain, false); }
void* operator new(std::size_t n, const std::nothrow_t&) noexcept { return allocate(n, kPlain, true); }
void* operator new[](std::size_t n, const std::nothrow_t&) noexcept { return allocate(n, kPlain, true); }
void* operator new(std::size_t n, std::align_val_t a) { return allocate(n, static_cast<std::size_t>(a), false); }
void* operator new[](std::size_t n, std::align_val_t a) { return allocate(n, static_cast<std::size_t>(a), false); }
void* operator new(std::size_t n, std::align_val_t a, const std::nothrow_t&) noexcept {
  return allocate(n, static_cast<std::size_t>(a), true);
}
void* operator new[](std::size_t n, std::align_val_t a, const std::nothrow_t&) noexcept {
  return allocate(n, static_cast<std::size_t>(a), true);
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t, const std::nothrow_t&) noexcept { std::free(p); }

namespace attn {
namespace {

void arm(long k) {
  g_fired = false;
  g_outside = 0;
  g_fail_at = k;
}
void disarm() { g_fail_at = 0; }

// ---- the calls -----------------------------------------------------------------------------------

// One call's output bytes, all arrays concatenated (out, lse, state, statistics ...).
using Bits = std::vector<uint8_t>;

void append(Bits& bits, const TensorView& v) {
  if (!v.data) return;
  const size_t n = static_cast<size_t>(v.numel()) * dtype_size(v.dtype);
  const auto* p = static_cast<const uint8_t*>(v.data);  // tensors from attend() are contiguous
  bits.insert(bits.end(), p, p + n);
}

Bits bits_of(const AttendResult& r) {
  Bits b;
  for (const Tensor* t : {&r.out, &r.lse, &r.probs, &r.final_state, &r.sparsity, &r.entropy, &r.max_weight,
                          &r.topk_mass})
    if (t->defined()) append(b, t->view());
  return b;
}

Bits bits_of(const std::vector<double>& v) {
  Bits b(v.size() * sizeof(double));
  if (!v.empty()) std::memcpy(b.data(), v.data(), b.size());
  return b;
}

// Calls `call` (which makes the library call, disarms, then returns the output bits: its own
// allocations must not be the ones that fail) with the k-th allocation failing, k = 1, 2, ...,
// until a call no longer reaches its k-th allocation. Each call that fails must throw Error
// naming "out of memory", and the next unarmed call must return the clean call's bits; no
// allocation may happen inside a parallel region, in the clean calls or the failing ones.
void sweep(const std::string& what, const std::function<Bits()>& call) {
  SCOPED_TRACE(what);
  g_in_parallel = 0;
  const Bits clean = call();
  if (g_in_parallel > 0) {
    ADD_FAILURE() << g_in_parallel << " allocations inside a parallel region";
    return;
  }
  constexpr long kMaxAllocations = 100000;  // a bound on the sweep, far above any call's count
  long k = 1;
  for (; k <= kMaxAllocations; ++k) {
    arm(k);
    bool threw = false;
    try {
      const Bits got = call();
      disarm();
      if (!g_fired) break;  // the call made fewer than k allocations: the sweep is done
      EXPECT_EQ(got, clean) << "a failed nothrow allocation (k = " << k << ") changed the result";
    } catch (const Error& e) {
      disarm();
      threw = true;
      EXPECT_TRUE(g_fired) << "k = " << k << ": " << e.what();
      EXPECT_NE(std::string(e.what()).find("out of memory"), std::string::npos) << "k = " << k << ": " << e.what();
    } catch (const std::exception& e) {
      disarm();
      ADD_FAILURE() << "k = " << k << ": not an attn::Error: " << e.what();
      threw = true;
    }
    if (g_in_parallel > 0) {
      ADD_FAILURE() << g_in_parallel << " allocations inside a parallel region (k = " << k << ")";
      return;
    }
    if (threw && call() != clean) {
      ADD_FAILURE() << "the call after a failure (k = " << k << ") gave other bits";
      return;
    }
  }
  std::printf("%s: %ld allocations\n", what.c_str(), k - 1);
  EXPECT_GT(k, 1) << "the call allocated nothing: the sweep tested nothing";
  EXPECT_LE(k, kMaxAllocations);
}

// ---- the case list: every family, every fast form ------------------------------------------------

struct Case {
  const char* mechanism;
  const char* form;
  int64_t N, M;
  DType dtype = DType::f32;
};

const std::vector<Case>& cases() {
  static const std::vector<Case> list = {
      {"softmax", "tiled", 150, 150},
      {"softmax", "tiled", 150, 150, DType::bf16},
      {"softmax:causal", "tiled_bf16", 150, 150, DType::bf16},
      {"softmax", "rows", 3, 200},
      {"softmax:causal", "tiled", 150, 150},
      {"softmax:causal", "rows", 2, 200},
      {"softmax:causal,window=32:0,sinks=4", "tiled", 150, 150},
      {"softmax:causal,window=32:0,sinks=4", "rows", 1, 150},
      {"longformer:window=16:16,global=0;17", "tiled", 130, 130},
      {"longformer:window=16:16,global=0;1", "rows", 2, 100},
      {"bigbird:block=16,window=3,global=1,random=2,seed=7", "tiled", 128, 128},
      {"bigbird:block=16,window=3,global=1,random=2,seed=7", "rows", 2, 128},
      {"linformer:k=16", "projected", 100, 100},
      {"linformer:k=16", "projected", 100, 100, DType::bf16},
      {"lsh:buckets=4,rounds=2,chunk=16", "chunked", 100, 100},
      {"lsh:buckets=4,rounds=2,chunk=16,causal,shared_qk", "chunked", 100, 100},
      {"dca:chunk=32,local=8", "parts", 100, 100},
      {"linear:map=elu", "right", 100, 90},
      {"linear:map=elu,causal", "recurrent", 64, 64},
      {"linear:map=elu,causal", "chunked", 200, 200},
      {"retention:decay=0.9", "recurrent", 40, 40},
      {"retention:decay=0.9", "chunked", 200, 200},
      {"normattn:map=elu,causal", "chunked", 200, 200},
      {"normattn:map=elu,causal", "recurrent", 50, 50},
      {"performer:features=32", "right", 100, 100},
      {"sana", "right", 100, 100},
      {"polaformer", "right", 100, 100},
      {"efficient", "right", 100, 100},
      {"efficient:causal", "recurrent", 100, 100},
      {"gau:causal", "tiled", 100, 100},
      {"gau", "tiled", 100, 100},
      {"qsoftmax", "right", 100, 90},
      {"qsoftmax:causal", "recurrent", 100, 100},
  };
  return list;
}

constexpr int64_t kB = 2, kH = 2, kD = 16;

struct Problem {
  harness::Buffer q, k, v;
  Mechanism mechanism;
  explicit Problem(const Case& c, uint32_t seed = 1) : mechanism(parse_mechanism(c.mechanism)) {
    std::mt19937 rng(seed);
    q = testing::random_tensor(rng, c.dtype, kB, kH, c.N, kD);
    k = testing::random_tensor(rng, c.dtype, kB, kH, c.M, kD);
    v = testing::random_tensor(rng, c.dtype, kB, kH, c.M, kD);
  }
};

AttendOptions options_of(const Case& c, bool stats) {
  AttendOptions o;
  o.threads = 2;
  o.form = c.form;
  const Mechanism m = parse_mechanism(c.mechanism);
  if (stats) {
    o.return_stats = true;
  } else {
    o.return_lse = info(m).has_lse;
    o.return_final_state = (info(m).cache == CacheKind::state);
  }
  return o;
}

std::string name_of(const Case& c, const char* how) {
  return std::string(c.mechanism) + " form " + c.form + " N " + std::to_string(c.N) + " " + dtype_name(c.dtype) + " " +
         how;
}

template <size_t... I>
std::vector<std::string> kinds(std::index_sequence<I...>) {
  return {std::string(std::variant_alternative_t<I, Mechanism>::kind)...};
}

// ---- the tests -----------------------------------------------------------------------------------

TEST(AllocFailure, TheAllocatorCountsParallelAllocationsAndFailsWhenArmed) {
  const long before = g_in_parallel.load();
  attn::parallel_for(4, 2, [](int64_t, int) {
    // volatile: the allocation must not be optimised away
    int* volatile p = new int(1);
    delete p;
  });
  EXPECT_EQ(g_in_parallel.load() - before, 4);
  g_in_parallel = before;
  arm(2);
  auto* first = new int(1);
  EXPECT_THROW((void)new int(2), std::bad_alloc);
  auto* third = new int(3);
  disarm();
  delete first;
  delete third;
  arm(1);
  EXPECT_EQ(new (std::nothrow) int(4), nullptr);
  disarm();
}

// Every alternative of the Mechanism variant has a case, and every fast form of its family is
// forced in one: a new family or form without a case fails here.
TEST(AllocFailure, CaseListCoversEveryFamilyAndFastForm) {
  const std::vector<std::string> all = kinds(std::make_index_sequence<std::variant_size_v<Mechanism>>{});
  std::set<size_t> alternatives;
  std::map<std::vector<std::string>, std::set<std::string>> forced;  // a family's form names -> forced ones
  for (const Case& c : cases()) {
    const Mechanism m = parse_mechanism(c.mechanism);
    alternatives.insert(m.index());
    forced[info(m).forms].insert(c.form);
  }
  for (size_t i = 0; i < all.size(); ++i) EXPECT_TRUE(alternatives.count(i)) << "no case for family " << all[i];
  for (const auto& [names, seen] : forced)
    for (const std::string& f : names)
      if (f != "reference") EXPECT_TRUE(seen.count(f)) << "no case forces form " << f;
}

// One case of the list per test (ctest runs them apart, and a failure names its case).
class AllocFailureCase : public ::testing::TestWithParam<size_t> {
 protected:
  const Case& c() const { return cases()[GetParam()]; }
};

TEST_P(AllocFailureCase, Attend) {
  for (int run = 0; run < 3; ++run) {
    const bool stats = run == 1, padded = run == 2;
    const Problem p(c());
    AttendOptions o = options_of(c(), stats);
    if (padded) {  // batch entries of different lengths: a thread's scratch meets both
      o.key_padding_lengths = {c().M, c().M - 37};
      o.return_stats = true;
      try {
        (void)explain(p.q.view, p.k.view, p.v.view, p.mechanism, o);
      } catch (const Error& e) {
        continue;  // the family takes no key padding
      }
    }
    // Scratch reused across a thread's items leaks nothing: any thread count gives the same bits.
    const Bits two = bits_of(attend(p.q.view, p.k.view, p.v.view, p.mechanism, o));
    for (int threads : {1, 3}) {
      AttendOptions other = o;
      other.threads = threads;
      EXPECT_EQ(bits_of(attend(p.q.view, p.k.view, p.v.view, p.mechanism, other)), two) << threads << " threads";
    }
    sweep(name_of(c(), padded ? "attend, key padding, everything" : stats ? "attend, return_stats" : "attend, lse / final state"), [&] {
      const AttendResult r = attend(p.q.view, p.k.view, p.v.view, p.mechanism, o);
      disarm();
      return bits_of(r);
    });
  }
}

TEST_P(AllocFailureCase, AttendIntoAndExplain) {
  const Problem p(c());
  AttendOptions o = options_of(c(), false);
  const AttendResult shape = attend(p.q.view, p.k.view, p.v.view, p.mechanism, o);
  const TensorView* lse = o.return_lse ? &shape.lse.view() : nullptr;
  const TensorView* state = o.return_final_state ? &shape.final_state.view() : nullptr;
  o.return_lse = o.return_final_state = false;  // attend_into takes the views instead
  sweep(name_of(c(), "attend_into"), [&] {
    attend_into(p.q.view, p.k.view, p.v.view, p.mechanism, o, shape.out.view(), lse, nullptr, state);
    disarm();
    return bits_of(shape);
  });
  sweep(name_of(c(), "explain"), [&] {
    const Explanation e = explain(p.q.view, p.k.view, p.v.view, p.mechanism, o);
    disarm();
    const std::string t = e.text();
    return Bits(t.begin(), t.end());
  });
}

INSTANTIATE_TEST_SUITE_P(EveryFamilyAndForm, AllocFailureCase, ::testing::Range<size_t>(0, cases().size()),
                         [](const ::testing::TestParamInfo<size_t>& info) {
                           const Case& c = cases()[info.param];
                           std::string n = std::to_string(info.param) + "_" + c.mechanism + "_" + c.form + "_" +
                                           dtype_name(c.dtype);
                           for (char& ch : n)
                             if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           return n;
                         });

// Every run of the check suite's case list (every form on every ISA, with its masks, biases,
// ALiBi, dropout, score kinds, GQA, layouts, dtypes ...), with and without row statistics and
// probabilities where the form gives them: not one allocation inside a parallel region.
TEST(AllocFailure, EveryCaseListRunAllocatesNothingInParallel) {
  const std::vector<harness::Run> runs = harness::expand(harness::case_list(), harness::kCheck, {});
  ASSERT_FALSE(runs.empty());
  for (const harness::Run& r : runs) {
    harness::Inputs in;
    harness::make_inputs(*r.c, in);
    for (int extra = 0; extra < 3; ++extra) {  // as the case says; + return_stats; + return_probs
      AttendOptions o = in.options;
      o.isa = r.isa;
      o.threads = 2;
      o.return_stats = extra == 1;
      o.stats_topk = r.c->stats_topk;
      o.return_probs = extra == 2;
      if (extra > 0) {  // only where the family and the form take them
        bool takes = false;
        try {
          for (const FormVerdict& v : explain(in.q.view, in.k.view, in.v.view, in.mechanism, o).forms)
            takes = takes || (v.form == r.form && v.reasons.empty());
        } catch (const Error&) {
        }
        if (!takes) continue;
      }
      o.form = r.form;
      g_in_parallel = 0;
      (void)attend(in.q.view, in.k.view, in.v.view, in.mechanism, o);
      EXPECT_EQ(g_in_parallel.load(), 0) << r.name() << (extra == 1 ? " with return_stats" : extra == 2 ? " with probs" : "");
    }
  }
}

// The float64 references, small: one case per family.
TEST(AllocFailure, References) {
  std::set<size_t> done;
  for (Case c : cases()) {
    if (!done.insert(parse_mechanism(c.mechanism).index()).second) continue;
    c.N = c.M = 24;
    const Problem p(c);
    AttendOptions o;
    o.threads = 2;
    sweep(name_of(c, "reference_outputs"), [&] {
      const core::ReferenceResult r =
          families::reference_outputs(p.q.view, p.k.view, p.v.view, p.mechanism, o, core::RefPrecision::f64);
      disarm();
      return bits_of(r.out);
    });
  }
}

// The backward: every form, allocating nothing in parallel; a failed allocation an Error.
TEST(AllocFailure, Backward) {
  for (const char* m : {"softmax:causal", "bigbird:block=16,window=3,global=1,random=2,seed=7"}) {
    const Problem p(Case{m, "", 60, 70});
    std::mt19937 rng(5);
    const harness::Buffer dout = testing::random_tensor(rng, DType::f32, kB, kH, 60, kD);
    AttendOptions fo;
    fo.return_lse = true;
    const AttendResult fwd = attend(p.q.view, p.k.view, p.v.view, p.mechanism, fo);
    for (const char* form : {"tiled", "rows", "reference"}) {
      AttendOptions o;
      o.threads = 2;
      o.form = form;
      sweep(std::string("attend_backward ") + m + " " + form, [&] {
        const AttendGradients g = attend_backward(dout.view, p.q.view, p.k.view, p.v.view, fwd.out.view(),
                                                  fwd.lse.view(), p.mechanism, o);
        disarm();
        Bits b;
        for (const Tensor* t : {&g.dq, &g.dk, &g.dv}) append(b, t->view());
        return b;
      });
    }
  }
}

// The linear family's backward: its fast forms (chunked causal, right non-causal) and reference,
// with an initial state and the final state's gradient.
TEST(AllocFailure, LinearBackward) {
  for (const char* m : {"linear:causal,chunk=16", "linear", "performer:features=24,causal,chunk=16",
                        "performer:features=24", "polaformer:causal,chunk=16", "polaformer"}) {
    const Problem p(Case{m, "", 60, 60});
    const bool polar = std::string(m).rfind("polaformer", 0) == 0;
    // the state's rows and columns
    const int64_t F = std::string(m).rfind("performer", 0) == 0 ? 24 : polar ? 4 * kD : kD;
    const int64_t C = polar ? kD / 2 + 1 : kD + 1;
    std::mt19937 rng(6);
    const harness::Buffer dout = testing::random_tensor(rng, DType::f32, kB, kH, 60, kD);
    std::vector<float> dstate(static_cast<size_t>(kB * kH * F * C), 0.5f), state(dstate.size(), 0.25f);
    std::vector<float> power(static_cast<size_t>(kD), 2.0f), coef(static_cast<size_t>(kD), 0.5f);
    const TensorView ds = make_view(dstate.data(), DType::f32, kB, kH, F, C);
    AttendOptions fo;
    fo.params["initial_state"] = make_array_view(state.data(), DType::f32, {kB, kH, F, C});
    if (polar) {  // and its learned params
      fo.params["power"] = make_array_view(power.data(), DType::f32, {kD});
      fo.params["coefficients"] = make_array_view(coef.data(), DType::f32, {kD});
    }
    const AttendResult fwd = attend(p.q.view, p.k.view, p.v.view, p.mechanism, fo);
    for (const char* form : {std::string(m).find("causal") != std::string::npos ? "chunked" : "right", "reference"}) {
      AttendOptions o = fo;
      o.threads = 2;
      o.form = form;
      sweep(std::string("attend_backward ") + m + " " + form, [&] {
        const AttendGradients g = attend_backward(dout.view, p.q.view, p.k.view, p.v.view, fwd.out.view(), TensorView{},
                                                  p.mechanism, o, nullptr, &ds);
        disarm();
        Bits b;
        for (const Tensor* t : {&g.dq, &g.dk, &g.dv, &g.d_initial_state}) append(b, t->view());
        for (const auto& [name, t] : g.dparams) append(b, t.view());
        return b;
      });
    }
  }
}

// DCA's backward (the softmax tiled backward on each part) and qsoftmax's (right, recurrent; an
// initial state and the final state's gradient), with their references.
TEST(AllocFailure, DcaAndQSoftmaxBackward) {
  std::mt19937 rng(8);
  const harness::Buffer dout = testing::random_tensor(rng, DType::f32, kB, kH, 60, kD);
  {
    const Problem p(Case{"dca:chunk=16,local=4", "", 60, 70});
    AttendOptions fo;
    fo.return_lse = true;
    const AttendResult fwd = attend(p.q.view, p.k.view, p.v.view, p.mechanism, fo);
    for (const char* form : {"parts", "reference"}) {
      AttendOptions o;
      o.threads = 2;
      o.form = form;
      sweep(std::string("attend_backward dca ") + form, [&] {
        const AttendGradients g = attend_backward(dout.view, p.q.view, p.k.view, p.v.view, fwd.out.view(),
                                                  fwd.lse.view(), p.mechanism, o);
        disarm();
        Bits b;
        for (const Tensor* t : {&g.dq, &g.dk, &g.dv}) append(b, t->view());
        return b;
      });
    }
  }
  std::vector<float> state(static_cast<size_t>(kB * kH * kD * kD), 0.25f), dstate(state.size(), 0.5f);
  const TensorView ds = make_view(dstate.data(), DType::f32, kB, kH, kD, kD);
  for (const char* m : {"qsoftmax", "qsoftmax:causal"}) {
    const bool causal = std::string(m).find("causal") != std::string::npos;
    const Problem p(Case{m, "", 60, causal ? 60 : 70});
    AttendOptions fo;
    fo.params["initial_state"] = make_array_view(state.data(), DType::f32, {kB, kH, kD, kD});
    const AttendResult fwd = attend(p.q.view, p.k.view, p.v.view, p.mechanism, fo);
    for (const char* form : {causal ? "recurrent" : "right", "reference"}) {
      AttendOptions o = fo;
      o.threads = 2;
      o.form = form;
      sweep(std::string("attend_backward ") + m + " " + form, [&] {
        const AttendGradients g = attend_backward(dout.view, p.q.view, p.k.view, p.v.view, fwd.out.view(), TensorView{},
                                                  p.mechanism, o, nullptr, &ds);
        disarm();
        Bits b;
        for (const Tensor* t : {&g.dq, &g.dk, &g.dv, &g.d_initial_state}) append(b, t->view());
        return b;
      });
    }
  }
}

// Linformer's backward with E and F as params (their gradients too).
TEST(AllocFailure, LinformerBackward) {
  const Problem p(Case{"linformer:k=16", "", 60, 70});
  std::mt19937 rng(7);
  const harness::Buffer dout = testing::random_tensor(rng, DType::f32, kB, kH, 60, kD);
  const harness::Buffer E = testing::random_tensor(rng, DType::f32, 1, 1, 16, 70);
  const harness::Buffer F = testing::random_tensor(rng, DType::f32, 1, 1, 16, 70);
  AttendOptions fo;
  fo.params["E"] = make_array_view(E.view.data, DType::f32, {16, 70});
  fo.params["F"] = make_array_view(F.view.data, DType::f32, {16, 70});
  fo.return_lse = true;
  const AttendResult fwd = attend(p.q.view, p.k.view, p.v.view, p.mechanism, fo);
  for (const char* form : {"projected", "reference"}) {
    AttendOptions o = fo;
    o.return_lse = false;
    o.threads = 2;
    o.form = form;
    sweep(std::string("attend_backward linformer ") + form, [&] {
      const AttendGradients g = attend_backward(dout.view, p.q.view, p.k.view, p.v.view, fwd.out.view(),
                                                fwd.lse.view(), p.mechanism, o);
      disarm();
      Bits b;
      for (const Tensor* t : {&g.dq, &g.dk, &g.dv, &g.dparams.at("E"), &g.dparams.at("F")}) append(b, t->view());
      return b;
    });
  }
}

TEST(AllocFailure, KvCacheAndVarlen) {
  std::mt19937 rng(3);
  const int64_t cap = 64, Nnew = 1;
  harness::Buffer q = testing::random_tensor(rng, DType::f32, kB, kH, Nnew, kD);
  harness::Buffer kc = testing::random_tensor(rng, DType::f32, kB, kH, cap, kD);
  harness::Buffer vc = testing::random_tensor(rng, DType::f32, kB, kH, cap, kD);
  harness::Buffer kn = testing::random_tensor(rng, DType::f32, kB, kH, Nnew, kD);
  harness::Buffer vn = testing::random_tensor(rng, DType::f32, kB, kH, Nnew, kD);
  KvCacheUpdate u;
  u.cache_seqlens = {30, 41};
  u.k = kn.view, u.v = vn.view;
  AttendOptions o;
  o.threads = 2;
  o.return_lse = true;
  const Mechanism causal = parse_mechanism("softmax:causal");
  // Appending the same rows at the same positions again changes nothing: every call is the same.
  sweep("attend_with_kvcache", [&] {
    const AttendResult r = attend_with_kvcache(q.view, kc.view, vc.view, u, causal, o);
    disarm();
    return bits_of(r);
  });
  const AttendResult r = attend_with_kvcache(q.view, kc.view, vc.view, u, causal, o);
  AttendOptions into = o;
  into.return_lse = false;
  sweep("attend_with_kvcache_into", [&] {
    attend_with_kvcache_into(q.view, kc.view, vc.view, u, causal, into, r.out.view(), &r.lse.view());
    disarm();
    return bits_of(r);
  });

  // Packed: two sequences of 40 and 60 tokens.
  harness::Buffer pq = testing::random_tensor(rng, DType::f32, 1, kH, 100, kD);
  harness::Buffer pk = testing::random_tensor(rng, DType::f32, 1, kH, 100, kD);
  harness::Buffer pv = testing::random_tensor(rng, DType::f32, 1, kH, 100, kD);
  const std::vector<int64_t> cu = {0, 40, 100};
  for (const char* m : {"softmax:causal", "linear:map=elu,causal"}) {
    AttendOptions vo;
    vo.threads = 2;
    vo.return_lse = info(parse_mechanism(m)).has_lse;
    const Mechanism mech = parse_mechanism(m);
    sweep(std::string("attend_varlen ") + m, [&] {
      const AttendResult r = attend_varlen(pq.view, pk.view, pv.view, cu, cu, 60, 60, mech, vo);
      disarm();
      return bits_of(r);
    });
  }
}

// The MoE feed-forward (attn/moe.hpp): routing, gather, expert gemms and combine allocate
// nothing in parallel; running out of memory is an Error, the float64 reference's too.
TEST(AllocFailure, MoeFeedForward) {
  std::mt19937 rng(5);
  std::normal_distribution<double> nd(0.0, 0.3);
  const MoeSizes z{40, 24, 5, 20, 2};
  auto draw = [&](int64_t n) {
    std::vector<double> v(static_cast<size_t>(n));
    for (double& a : v) a = nd(rng);
    return v;
  };
  const std::vector<double> x = draw(z.tokens * z.dim), r = draw(z.experts * z.dim),
                            w1 = draw(z.experts * z.hidden * z.dim), w2 = draw(z.experts * z.dim * z.hidden),
                            w3 = draw(z.experts * z.hidden * z.dim);
  auto f32 = [](const std::vector<double>& v) { return std::vector<float>(v.begin(), v.end()); };
  const std::vector<float> xf = f32(x), rf = f32(r), w1f = f32(w1), w2f = f32(w2), w3f = f32(w3);
  std::vector<float> y(xf.size());
  sweep("moe_feed_forward float32", [&] {
    MoeRouting<float> routing;
    const double aux = moe_feed_forward(z, std::span<const float>(xf), rf, w1f, w2f, w3f, std::span<float>(y), 2, &routing);
    disarm();
    std::vector<double> out(y.begin(), y.end());
    out.push_back(aux);
    return bits_of(out);
  });
  std::vector<double> y64(x.size());
  sweep("moe_feed_forward float64", [&] {
    const double aux = moe_feed_forward(z, std::span<const double>(x), r, w1, w2, w3, std::span<double>(y64), 2);
    disarm();
    std::vector<double> out = y64;
    out.push_back(aux);
    return bits_of(out);
  });
}

}  // namespace
}  // namespace attn
