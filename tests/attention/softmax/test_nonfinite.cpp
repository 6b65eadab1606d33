// Hardening: non-finite inputs, options that would
// overflow downstream arithmetic, and sizes options derive from the input. A non-finite input
// that reaches a visible score makes that row NaN (output and LSE) on every form and ISA, as in
// the reference; it never leaks into other rows; LSE -inf stays reserved for rows that see no key.
// (Every family: tests/harness/test_nonfinite_cases.cpp.)
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "families/internal_api.hpp"
#include "support/random_inputs.hpp"

namespace attn {
namespace {

constexpr int64_t B = 2, H = 4, Hkv = 2, N = 3, M = 40, D = 8;

struct Poisoned {
  std::mt19937 rng{17};
  testing::Buffer q = testing::random_tensor(rng, DType::f32, B, H, N, D);
  testing::Buffer k = testing::random_tensor(rng, DType::f32, B, Hkv, M, D);
  testing::Buffer v = testing::random_tensor(rng, DType::f32, B, Hkv, M, D);
  std::vector<float> bias = std::vector<float>(static_cast<size_t>(B * H * N * M), 0.0f);
};

// Runs every form on every ISA; `poisoned(b, h, i)` says which rows must be NaN, all others
// must equal the clean run bitwise (same form, same ISA).
void expect_rows(const Poisoned& clean, const Poisoned& bad, const std::string& mech,
                 const std::function<bool(int64_t, int64_t, int64_t)>& poisoned) {
  AttendOptions o;
  o.return_lse = true;
  for (const char* form : {"rows", "tiled", "reference"})
    for (Isa isa : supported_isas()) {
      SCOPED_TRACE(std::string(form) + " " + isa_name(isa) + " " + mech);
      o.form = form;
      o.isa = isa;
      std::vector<float> cb = clean.bias, bb = bad.bias;
      o.bias = make_view(cb.data(), DType::f32, B, H, N, M);
      const AttendResult want = attend(clean.q.view, clean.k.view, clean.v.view, parse_mechanism(mech), o);
      o.bias = make_view(bb.data(), DType::f32, B, H, N, M);
      const AttendResult got = attend(bad.q.view, bad.k.view, bad.v.view, parse_mechanism(mech), o);
      for (int64_t b = 0; b < B; ++b)
        for (int64_t h = 0; h < H; ++h)
          for (int64_t i = 0; i < N; ++i) {
            const float lse = got.lse.at(b, h, i, 0);
            if (poisoned(b, h, i)) {
              EXPECT_TRUE(std::isnan(lse)) << "lse of poisoned row " << b << "," << h << "," << i << " is " << lse;
              for (int64_t c = 0; c < D; ++c) EXPECT_TRUE(std::isnan(got.out.at(b, h, i, c))) << "out row " << i;
            } else {
              EXPECT_EQ(lse, want.lse.at(b, h, i, 0)) << "clean row " << b << "," << h << "," << i;
              for (int64_t c = 0; c < D; ++c) EXPECT_EQ(got.out.at(b, h, i, c), want.out.at(b, h, i, c));
            }
          }
    }
}

TEST(NonFinite, NanInOneQueryPoisonsOnlyThatRow) {
  Poisoned clean, bad;
  testing::fill_token(bad.q.view, 1, 2, 1, testing::nan_f());
  expect_rows(clean, bad, "softmax", [](int64_t b, int64_t h, int64_t i) { return b == 1 && h == 2 && i == 1; });
}

TEST(NonFinite, InfInAKeyPoisonsTheRowsThatSeeIt) {
  Poisoned clean, bad;
  testing::fill_token(bad.k.view, 0, 1, M - 2, INFINITY);  // kv head 1 = query heads 2, 3
  // causal: query i sees j <= i + M - N, so key M - 2 is seen by queries 1 and 2 only
  expect_rows(clean, bad, "softmax:causal",
              [](int64_t b, int64_t h, int64_t i) { return b == 0 && h >= 2 && i >= 1; });
}

// Regression: tanh saturates, so softcap turned a +inf score into +cap and
// the row came out finite; a score of +-inf is now NaN before any transform, on every form and ISA.
TEST(NonFinite, SoftcapDoesNotSwallowAnInfiniteKey) {
  Poisoned clean, bad;
  testing::fill_token(bad.k.view, 0, 1, M - 2, INFINITY);
  expect_rows(clean, bad, "softmax:causal,softcap=20",
              [](int64_t b, int64_t h, int64_t i) { return b == 0 && h >= 2 && i >= 1; });
}

// Regression: PolaFormer split a NaN channel into "neither sign" (0 in both
// streams) and GAU's non-causal tiles took max(NaN, 0) = 0, so a NaN query gave a finite row.
TEST(NonFinite, PolaFormerAndGauKeepANanQuery) {
  for (const char* mech : {"polaformer:power=3", "gau", "linear:map=relu", "sana"}) {
    Poisoned bad;
    testing::fill_token(bad.q.view, 1, 2, 1, testing::nan_f());
    for (Isa isa : supported_isas()) {
      AttendOptions o;
      o.isa = isa;
      const AttendResult r = attend(bad.q.view, bad.k.view, bad.v.view, parse_mechanism(mech), o);
      for (int64_t i = 0; i < N; ++i)
        for (int64_t c = 0; c < D; ++c)
          EXPECT_EQ(std::isnan(r.out.at(1, 2, i, c)), i == 1) << mech << " " << isa_name(isa) << " row " << i;
    }
  }
}

TEST(NonFinite, InfOrNanInABiasPoisonsItsRow) {
  for (float x : {INFINITY, std::nanf("")}) {
    Poisoned clean, bad;
    bad.bias[static_cast<size_t>(((1 * H + 3) * N + 0) * M + 7)] = x;
    expect_rows(clean, bad, "softmax:softcap=20", [](int64_t b, int64_t h, int64_t i) { return b == 1 && h == 3 && i == 0; });
  }
}

TEST(NonFinite, ReferenceAgrees) {
  Poisoned bad;
  testing::fill_token(bad.q.view, 0, 0, 0, testing::nan_f());
  const auto r = families::reference_outputs(bad.q.view, bad.k.view, bad.v.view, Softmax{}, {}, core::RefPrecision::f64);
  EXPECT_TRUE(std::isnan(r.l(0, 0, 0)));
  EXPECT_TRUE(std::isnan(r.o(0, 0, 0, 3)));
  EXPECT_FALSE(std::isnan(r.l(0, 0, 1)));
}

// Class 3: a scale finite as a double but infinite as float32 is refused, not turned into zeros.
TEST(Overflow, ScaleAndSoftcapMustFitFloat32) {
  Poisoned s;
  for (const char* mech : {"softmax:scale=1e39", "softmax:scale=1e-50", "softmax:softcap=1e39"})
    EXPECT_THROW(attend(s.q.view, s.k.view, s.v.view, parse_mechanism(mech)), Error) << mech;
  try {
    attend(s.q.view, s.k.view, s.v.view, parse_mechanism("softmax:scale=1e39"));
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("softmax scale must be in [1e-30, 1e+12], got 1e+39"), std::string::npos) << e.what();
  }
}

// Hardening: every float option of every family's text has a range in its facts (one
// place: attn::info's option_ranges, `attn run --help`, validation). A value just past either
// end is refused naming the family, the option, the range and the value; the ends themselves
// compute finite outputs from ordinary inputs (q, k, v ~ N(0, 1)).
struct Range {
  std::string name;
  double lo, hi;
  bool lo_open, hi_open;
};

Range parse_range(const std::string& text) {  // "power in (1, 10]" (and a note)
  Range r;
  const size_t in = text.find(" in ");
  r.name = text.substr(0, in);
  const size_t open = in + 4, comma = text.find(", ", open), close = text.find_first_of(")]", comma);
  r.lo_open = text[open] == '(';
  r.hi_open = text[close] == ')';
  r.lo = std::stod(text.substr(open + 1, comma - open - 1));
  r.hi = std::stod(text.substr(comma + 2, close - comma - 2));
  return r;
}

std::string plain(double x) {  // the text form's numbers: no '+' in the exponent
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.17g", x);
  std::string s = buf;
  s.erase(std::remove(s.begin(), s.end(), '+'), s.end());
  return s;
}

TEST(Overflow, EveryFloatOptionHasARangeAndPastItIsRefused) {
  std::mt19937 rng(5);
  auto q = testing::random_tensor(rng, DType::f32, 1, 2, 6, 8);
  auto k = testing::random_tensor(rng, DType::f32, 1, 2, 6, 8);
  auto v = testing::random_tensor(rng, DType::f32, 1, 2, 6, 8);
  int refused = 0, computed = 0;
  for (const MechanismInfo& f : family_infos()) {
    // every "name=X" of the grammar (X: a float; N: an integer) has a range
    for (size_t at = f.grammar.find("=X"); at != std::string::npos; at = f.grammar.find("=X", at + 1)) {
      const size_t start = f.grammar.find_last_of(":,[", at) + 1;
      const std::string name = f.grammar.substr(start, at - start);
      bool found = false;
      for (const std::string& r : f.option_ranges) found = found || r.rfind(name + " in ", 0) == 0;
      EXPECT_TRUE(found) << f.family << ": float option '" << name << "' has no range";
    }
    for (const std::string& text : f.option_ranges) {
      const Range r = parse_range(text);
      // a decay needs causal; Linformer's default k = 256 is more than these 6 keys
      const std::string causal = r.name == "decay" ? "causal," : f.family == "linformer" ? "k=4," : "";
      SCOPED_TRACE(f.family + " " + text);
      const double below = r.lo_open ? r.lo : r.lo > 0 ? r.lo / 10 : r.lo == 0 ? -1 : r.lo * 10;
      const double above = r.hi_open ? r.hi : r.hi * 10;
      for (double x : {below, above}) {
        const std::string mech = f.family + ":" + causal + r.name + "=" + plain(x);
        try {
          attend(q.view, k.view, v.view, parse_mechanism(mech));
          ADD_FAILURE() << mech << " was accepted";
        } catch (const Error& e) {
          char value[32];
          std::snprintf(value, sizeof value, "%.6g", x);
          const size_t open = text.find(" in ") + 4, close = text.find_first_of(")]", text.find(", "));
          const std::string want =
              f.family + " " + r.name + " must be in " + text.substr(open, close - open + 1) + ", got " + value;
          EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what() << "\nwanted: " << want;
          ++refused;
        }
      }
      for (double x : {r.lo, r.hi}) {
        if ((x == r.lo && r.lo_open) || (x == r.hi && r.hi_open)) continue;
        const std::string mech = f.family + ":" + causal + r.name + "=" + plain(x);
        const AttendResult res = attend(q.view, k.view, v.view, parse_mechanism(mech));
        for (int64_t e = 0; e < res.out.view().numel(); ++e)
          ASSERT_TRUE(std::isfinite(static_cast<const float*>(res.out.view().data)[e])) << mech;
        ++computed;
      }
    }
  }
  EXPECT_GE(refused, 2 * 15);  // 15 float options over the families, each refused on both sides
  EXPECT_GE(computed, 15);
}

// Class 6: the inputs the adversarial run found, by name.
TEST(Overflow, OptionsThatOverflowedAreRefused) {
  Poisoned s;
  const std::pair<const char*, const char*> cases[] = {
      {"polaformer:power=100", "polaformer power must be in (1, 10], got 100"},
      {"linear:scale=3e38", "linear scale must be in [1e-30, 1e+12], got 3e+38"},
      {"gau:bias=3e38", "gau bias must be in [-1e+12, 1e+12], got 3e+38"},
      {"efficient:scale=3e38", "efficient scale must be in [1e-30, 1e+12], got 3e+38"},
  };
  for (const auto& [mech, message] : cases) {
    try {
      explain(s.q.view, s.k.view, s.v.view, parse_mechanism(mech));
      ADD_FAILURE() << mech << " was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(message), std::string::npos) << e.what();
    }
  }
}

// Hardening: sizes an option derives are checked against the input before anything is
// allocated or drawn: Linformer's k beyond the keys, Performer's features x head dim, LSH buckets
// beyond twice the keys (each call returns at once with the sizes in its message).
TEST(Sizes, OptionsBeyondWhatTheInputCanUseAreRefused) {
  std::mt19937 rng(9);
  auto q = testing::random_tensor(rng, DType::f32, 1, 2, 4, 64);
  auto k = testing::random_tensor(rng, DType::f32, 1, 2, 512, 64);
  const std::pair<const char*, const char*> cases[] = {
      {"linformer:k=1048576", "linformer k must be in [1, M] (E K and F V have rank at most the key count M = 512), got k = 1048576"},
      {"linformer:k=513", "got k = 513"},
      {"performer:features=65536", "performer features x head dim must be at most 2^20 (the random feature matrix omega), got 65536 x D = 64 (use features <= 16384)"},
      {"lsh:buckets=65536,rounds=64", "lsh buckets must be at most max(64, 2 M) = 1024 for M = 512 keys"},
  };
  for (const auto& [mech, message] : cases) {
    try {
      attend(q.view, k.view, k.view, parse_mechanism(mech));
      ADD_FAILURE() << mech << " was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(message), std::string::npos) << e.what();
    }
  }
  // at the bounds they run
  EXPECT_EQ(attend(q.view, k.view, k.view, parse_mechanism("linformer:k=512")).out.view().shape[2], 4);
  EXPECT_EQ(attend(q.view, k.view, k.view, parse_mechanism("lsh:buckets=1024,rounds=1")).out.view().shape[2], 4);
  EXPECT_EQ(attend(q.view, k.view, k.view, parse_mechanism("performer:features=16384")).out.view().shape[2], 4);
}

// Class 3: window bounds near 2^63 mean "unbounded", they do not overflow and mask everything.
TEST(Overflow, HugeWindowsAreUnbounded) {
  Poisoned s;
  AttendOptions o;
  o.return_lse = true;
  const int64_t huge = std::numeric_limits<int64_t>::max();
  for (const char* form : {"rows", "tiled", "reference"}) {
    o.form = form;
    const auto open = attend(s.q.view, s.k.view, s.v.view, parse_mechanism("softmax"), o);
    Softmax w;
    w.window_left = huge, w.window_right = huge;
    const auto wide = attend(s.q.view, s.k.view, s.v.view, w, o);
    EXPECT_EQ(std::memcmp(open.out.view().data, wide.out.view().data, B * H * N * D * sizeof(float)), 0) << form;
    Softmax c;
    c.causal = true, c.window_left = huge - 1, c.window_right = huge;
    const auto causal = attend(s.q.view, s.k.view, s.v.view, parse_mechanism("softmax:causal"), o);
    const auto causal_wide = attend(s.q.view, s.k.view, s.v.view, c, o);
    EXPECT_EQ(std::memcmp(causal.out.view().data, causal_wide.out.view().data, B * H * N * D * sizeof(float)), 0) << form;
    EXPECT_EQ(attention_flops(s.q.view, s.k.view, s.v.view, w), attention_flops(s.q.view, s.k.view, s.v.view, Softmax{}));
  }
}

}  // namespace
}  // namespace attn
