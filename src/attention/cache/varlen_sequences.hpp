// What attend_varlen (varlen.cpp) and its backward (varlen_backward.cpp) share: the checks of a
// packed call and each sequence's options (a per-sequence initial state sliced to its row).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "attn/attend.hpp"

namespace attn::varlen {

// q, k, v packed (1, heads, total tokens, dim); cu_q, cu_k from 0 to the totals, non-decreasing,
// of one length; max_q, max_k at least the longest; options without padding, masks, a bias or a
// paged cache. Errors speak as `where`.
void check_packed(const char* where, const TensorView& q, const TensorView& k, const TensorView& v,
                  const std::vector<int64_t>& cu_q, const std::vector<int64_t>& cu_k, int64_t max_q, int64_t max_k,
                  const AttendOptions& opt);

// The options of sequence s of S: params["initial_state"], given per sequence (S, H, F, C), becomes
// its row s (1, H, F, C) (an Error naming `where` when its first dimension is not S).
AttendOptions sequence_options(const char* where, const AttendOptions& opt, int64_t s, int64_t S);

// params["initial_state"] of the call, or null.
const ArrayView* initial_state(const AttendOptions& opt);

// Sequence s (1, H, F, C) of a (S, H, F, C) state.
TensorView state_row(TensorView t, int64_t s);

}  // namespace attn::varlen
