// Merging partial softmax results: the one routine for split-K decode, Dual Chunk Attention,
// sharded decode and ring attention across processes; none of them keeps a merge of its own.
//
// A partial is the online-softmax state of one query row over a subset of its keys:
//   m = max_j s_j,   l = sum_j e^(s_j - m),   acc[c] = sum_j e^(s_j - m) v_j[c]
// (m = -inf, l = 0, acc = 0 for a subset with no visible key). Partials merge as
//   M = max_p m_p,   L = sum_p l_p e^(m_p - M),   out[c] = sum_p acc_p[c] e^(m_p - M) / L,
//   lse = M + log L,
// in the order given, so a fixed order gives bitwise-reproducible results whatever the thread
// count. A row no partial saw (L = 0) gives zeros and lse = -inf; a partial whose l is NaN (a
// non-finite input reached a visible score) makes the row NaN, output and lse.
#pragma once
#include <cstdint>

namespace attn::core {

// Partial p of the row lives at m[p * stride], l[p * stride] and acc + p * acc_stride
// (dv floats). Writes out[0..dv) (float32) and returns the row's log-sum-exp.
float merge_partials(int64_t count, const float* m, const float* l, int64_t stride, const float* acc,
                     int64_t acc_stride, int64_t dv, float* out);

}  // namespace attn::core
