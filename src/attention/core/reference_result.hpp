// What every family's reference returns: dense float64 results of a whole call, the oracle the
// fast forms are checked against (harness/check.cpp).
#pragma once
#include <cstdint>
#include <vector>

#include "attn/dtype.hpp"

namespace attn::core {

// f64: float64 throughout (the oracle). plain: the same algorithm in float with intermediates
// rounded to the storage dtype (the baseline whose error sets the tolerance).
enum class RefPrecision { f64, plain };

struct ReferenceResult {
  int64_t B = 0, H = 0, N = 0, M = 0, Dv = 0;
  std::vector<double> out;    // (B, H, N, Dv)
  std::vector<double> lse;    // (B, H, N); -inf for rows that see no key
  std::vector<double> probs;  // (B, H, N, M); weights before dropout (empty if the family has none)
  // (B, H, F, state_cols): a recurrent family's final state (empty if the family has none)
  std::vector<double> state;
  int64_t F = 0, state_cols = 0;
  // (B, H, N, 4): sparsity, entropy, max_weight, topk_mass of each row's applied weights, when
  // the call asked for row statistics (stats_topk > 0); NaN until the family fills a row
  std::vector<double> stats;
  int64_t stats_topk = 0;
  // The 4 statistics of a row, or null when not asked for.
  double* stats_of(int64_t b, int64_t h, int64_t i) {
    return stats.empty() ? nullptr : &stats[static_cast<size_t>(((b * H + h) * N + i) * 4)];
  }
  double o(int64_t b, int64_t h, int64_t i, int64_t c) const { return out[((b * H + h) * N + i) * Dv + c]; }
  double l(int64_t b, int64_t h, int64_t i) const { return lse[(b * H + h) * N + i]; }
  double p(int64_t b, int64_t h, int64_t i, int64_t j) const { return probs[((b * H + h) * N + i) * M + j]; }
};

// The rounding of a reference's intermediates: to the storage dtype in the plain baseline, none in
// the float64 oracle.
template <class T>
struct Rounding {
  DType dtype;
  bool plain;
  T operator()(T x) const { return plain ? static_cast<T>(round_to(dtype, static_cast<float>(x))) : x; }
};

// A result of the call's shape with out zeroed (lse, probs and state are the family's to fill);
// with stats_topk > 0, stats all NaN (rows that see no key stay so).
ReferenceResult zero_result(int64_t B, int64_t H, int64_t N, int64_t M, int64_t Dv, int64_t stats_topk = 0);

struct Outputs;
// The reference as a form: writes out (rounded to its dtype), and lse, probs and the final state
// when the caller asked for them.
void write_reference(const ReferenceResult& r, const Outputs& o);

}  // namespace attn::core
