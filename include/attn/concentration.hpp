// How concentrated a row of attention weights is (docs/concentration.md), on rows in memory:
//   sparsity  S(a) = E|a| / sqrt(E[a^2]) = (||a||_1 / n) / (||a||_2 / sqrt(n)), in [1/sqrt(n), 1]:
//             1 for equal magnitudes, 1/sqrt(n) for one key; defined for unnormalised and signed
//             weights; NaN for an all-zero row
//   entropy   H = -sum p log p of p = a / sum(a) (a >= 0; natural log): 0 on one key, log n uniform
//   max_weight, topk_mass   the largest |a|, and the k largest, as a fraction of sum |a|
//   effective_keys          exp(H): how many keys the row spreads over
// Sums run in float64. Streaming versions for attention calls that never hold the N x M matrix
// are options of attend().
#pragma once
#include <cstdint>
#include <string>

namespace attn::concentration {

double sparsity(const double* a, int64_t n);
// Throws Error when a weight is negative or NaN (entropy needs a distribution).
double entropy(const double* a, int64_t n);
double max_weight(const double* a, int64_t n);
double topk_mass(const double* a, int64_t n, int64_t k);  // k >= 1 (k > n: 1)

}  // namespace attn::concentration
