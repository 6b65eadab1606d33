// The one case list's vocabulary. A case is a mechanism (text form) on one problem: shape,
// dtype, layout and the extra inputs it needs; it declares its tolerance rule, its FLOP and
// byte count, and which modes use it. One list (case_list.cpp, gathering cases/<family>.cpp) drives
//   check  - ctest (tests/harness/test_case_list.cpp) and `attn check`: every form that supports
//            the case, on every ISA, against the float64 reference;
//   backward - ctest (tests/harness/test_backward_cases.cpp) and `attn check --backward`: the check
//            cases whose mechanism has a backward, every backward form on every ISA, against the
//            float64 backward reference (harness/backward_check.hpp);
//   bench  - `attn bench`: speed as a ratio to the same-run roofline (sgemm or bandwidth); with
//            --backward, each case's backward too;
//   demo   - `attn demo`: error against the reference, time, speed;
//   list   - `attn list`: what would run, with filters --op, --form, --isa, --case.
// A new mechanism adds cases/<family>.cpp, not a new test program.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "attn/attn.hpp"

namespace attn::harness {

enum Suite : unsigned { kCheck = 1, kBench = 2, kDecode = 4, kDemo = 8 };

// How close a form must come to the float64 reference.
//   twice_plain: max|fast - ref64| <= 2 * max|plain - ref64| + floor, where `plain` is the
//     reference algorithm in the storage dtype and floor = 1e-6 * max(1, max|ref|) plus, for
//     bf16/fp16, the dtype's rounding floor 2 * max|(ref + 0.3 - 0.3) - ref| in that dtype.
//     For bf16/fp16 also per element: |fast - ref64| - 1e-6 * max(1, max|ref|) <= kHalfUlps (0.6)
//     units in the last place of the dtype at ref64 (check.hpp).
//     LSE within 1e-5 (1 + |ref|); probabilities within 2e-6 + 2 |plain - ref|; row statistics
//     (return_stats) NaN exactly where the reference's are, else within 2 |plain - ref| + 2e-5
//     (entropy: 2e-5 max(1, log M)), and out and LSE bitwise the same as without statistics.
struct Tolerance {
  enum Kind { twice_plain } kind = twice_plain;
  std::string describe() const;
};

// Extra inputs of a case.
struct Extras {
  bool padding = false;   // random key_padding_lengths (batch 0 keeps all keys)
  bool mask = false;      // random boolean mask (1, H, N, M), 70 % visible
  bool bias = false;      // random float bias (B, 1, N, M) with 5 % -inf
  bool alibi = false;     // slopes 2^(-8 (h+1) / H)
  bool block_mask = false;  // random block mask (B, 1, ceil(N/16), ceil(M/24)), blocks 16 x 24, 60 % visible
  bool mask_mod = false;    // a mask_mod predicate hiding (b + h + i + 2 j) mod 5 = 0
  // Optional named params to pass ("initial_state", "decay"); the mechanism's required ones are
  // always passed. Each is drawn by the rule its family declares (attn::info(m).params: shape,
  // `generate`); free shape symbols (A of the additive score) take 5.
  std::vector<std::string> params;
  float magnitude = 1.0f;  // q and k drawn from N(0, magnitude^2)
  int64_t pad = 0;         // extra elements per token row (non-packed strides)
  // K and V stored as int8 rows with a float32 scale each (AttendOptions::kv_scales), rounded
  // from the drawn values by attn::quantize_rows; q stays in the case's dtype. The reference
  // reads the same int8 rows: what is checked is the forms' arithmetic on them.
  bool int8_kv = false;
};

struct Case {
  std::string mechanism = "softmax";
  int64_t B = 1, H = 2, Hkv = 2, N = 17, M = 17, D = 32, Dv = 32;
  DType dtype = DType::f32;
  Layout layout = Layout::bhnd;
  Extras extras;
  unsigned suites = kCheck;
  std::string label;       // demo: what the row shows
  std::string form;        // "" = every form that supports the case (check) or the walk's choice
  std::string agree_with;  // check: a second form whose outputs must agree with `form`'s
  Tolerance tolerance;
  uint32_t seed = 1234;
  int64_t stats_topk = 8;  // check: k of the row statistics' top-k mass

  std::string op() const;    // the family kind ("softmax")
  std::string name() const;  // unique, identifier-safe
  // 2 (D + Dv) per visible (query, key) pair, from the library's own count.
  double flops() const;
  // Bytes of K and V a memory-bound call reads once.
  double kv_bytes() const;
};

// The one list (case_list.cpp): every case of every mechanism, for every suite.
const std::vector<Case>& case_list();

struct Inputs;
// A bad-input case: the valid inputs of `base`, broken by `breaks`, must make attend() and
// explain() throw attn::Error whose message contains `message` (the check suite runs them).
struct BadCase {
  std::string name;
  Case base;
  void (*breaks)(Inputs&);
  std::string message;
};
const std::vector<BadCase>& bad_case_list();

// A family's cases, in cases/<family>.cpp (compiled into the harness, above the library; CMake
// finds every such file and the list calls its function <family>_cases):
//   void <family>_cases(FamilyCases& out);
struct FamilyCases {
  std::vector<Case> cases;
  std::vector<BadCase> bad;
  // (label, mechanism): its rows of `attn demo`, run at the demo's size
  std::vector<std::pair<std::string, std::string>> demo;
};

// Helpers for the case files: a small valid call for bad-input cases (2 heads, 5 queries, 6 keys,
// d = 8), and `base` with mechanism text `mech`, which attend() and explain() must refuse with
// `message`.
Case small_case();
void add_bad_text(std::vector<BadCase>& out, Case base, const char* name, const char* mech, const char* message);

// The bench suite's grid for the given values (the list holds it for the defaults).
std::vector<Case> bench_grid(const std::vector<int64_t>& sizes, const std::vector<int64_t>& dims,
                             const std::vector<std::string>& mechanisms, const std::vector<DType>& dtypes,
                             int64_t heads, int64_t kv_heads);
// Decode-shaped bench cases (N = 1) against caches of the given lengths.
std::vector<Case> decode_grid(const std::vector<int64_t>& cache_lengths, const std::vector<int64_t>& dims,
                              const std::vector<DType>& dtypes, int64_t heads);
// The demo suite at size n x n, head dim d, `heads` query heads.
std::vector<Case> demo_cases(int64_t n, int64_t d, int64_t heads);

}  // namespace attn::harness
