// Inference entry points: attention against a KV cache (contiguous or paged) that new keys and
// values are appended to in place, and attention over packed sequences of different lengths.
// The semantics are flash-attn's flash_attn_with_kvcache and flash_attn_varlen_func.
//
// The caches are memory the caller owns (the library holds none): these calls write the new rows
// into it and read it, nothing more. Every check runs before the first write, so a call that
// fails leaves the cache as it was.
#pragma once
#include <cstdint>
#include <optional>
#include <vector>

#include "attn/attend.hpp"
#include "attn/backward.hpp"
#include "attn/rope.hpp"
#include "attn/tensor.hpp"

namespace attn {

// Rotary tables as flash-attn takes them: cos and sin (1, 1, positions, rotary_dim / 2), any
// float dtype; rotary_dim <= D channels are rotated, the rest pass through.
struct RotaryTables {
  TensorView cos, sin;
  RopeStyle style = RopeStyle::interleaved;  // flash-attn's rotary_interleaved=True default
};

struct KvCacheUpdate {
  // Tokens already in each sequence's cache (B values); empty: every cache is full (capacity).
  std::vector<int64_t> cache_seqlens;
  // New keys and values (B, Hkv, Nnew, D) and (B, Hkv, Nnew, Dv), the caches' dtype: written at
  // positions cache_seqlens[b] ..< cache_seqlens[b] + Nnew of sequence b. Both or neither.
  std::optional<TensorView> k, v;
  // Rotates the new keys (at their positions) and q: at positions cache_seqlens[b] + Nnew - N + i
  // when the mechanism is causal or windowed, else all at cache_seqlens[b] + Nnew - N (flash-attn's rule; with
  // N = Nnew that is cache_seqlens[b] + i and cache_seqlens[b]). q itself is not modified.
  std::optional<RotaryTables> rotary;
  // Paged caches: k_cache and v_cache are page pools (num_blocks, Hkv, block_size, D|Dv) and
  // this is the block table (PagedKv::tokens is ignored: each sequence's length is known).
  std::optional<PagedKv> paged;
};

// Appends, then attends q (B, H, N, D) to keys [0, cache_seqlens[b] + Nnew) of each sequence
// with any mechanism of the softmax family (causal and windows aligned bottom-right to each
// sequence's own length). k_cache and v_cache: (B, Hkv, capacity, D|Dv), any strides, or page
// pools. Options as attend() takes them, except key padding and masks (the cache lengths say
// which keys exist); ALiBi slopes (H or B*H) and return_lse apply.
AttendResult attend_with_kvcache(const TensorView& q, const TensorView& k_cache, const TensorView& v_cache,
                                 const KvCacheUpdate& update, const Mechanism& mechanism,
                                 const AttendOptions& options = {});
// Same, writing out (B, H, N, Dv) and, when given, lse (B, H, N, 1) float32.
void attend_with_kvcache_into(const TensorView& q, const TensorView& k_cache, const TensorView& v_cache,
                              const KvCacheUpdate& update, const Mechanism& mechanism, const AttendOptions& options,
                              const TensorView& out, const TensorView* lse);

// Packed sequences of different lengths (flash_attn_varlen_func): q (1, H, total_q, D), k
// (1, Hkv, total_k, D), v (1, Hkv, total_k, Dv); sequence b is tokens
// [cu_seqlens_q[b], cu_seqlens_q[b + 1]) of q against [cu_seqlens_k[b], cu_seqlens_k[b + 1]) of k
// and v (each non-decreasing from 0 to the total; max_seqlen_* at least the longest). Any
// mechanism; masks and key padding are refused. Mechanisms with a recurrent state (the linear
// family, as fla's cu_seqlens): the state starts afresh at each sequence, from params["initial_state"]
// given per sequence (S, H, F, C) when the call passes one, and return_final_state gives each
// sequence's final state, AttendResult::final_state (S, H, F, C) (an empty sequence's is its
// initial state). Other params with a batch dimension are refused.
AttendResult attend_varlen(const TensorView& q, const TensorView& k, const TensorView& v,
                           const std::vector<int64_t>& cu_seqlens_q, const std::vector<int64_t>& cu_seqlens_k,
                           int64_t max_seqlen_q, int64_t max_seqlen_k, const Mechanism& mechanism,
                           const AttendOptions& options = {});
// Same, writing out (1, H, total_q, Dv) and, when given, lse (1, H, total_q, 1) float32 and
// final_state (S, H, F, C) float32 (mechanisms with a recurrent state).
void attend_varlen_into(const TensorView& q, const TensorView& k, const TensorView& v,
                        const std::vector<int64_t>& cu_seqlens_q, const std::vector<int64_t>& cu_seqlens_k,
                        int64_t max_seqlen_q, int64_t max_seqlen_k, const Mechanism& mechanism,
                        const AttendOptions& options, const TensorView& out, const TensorView* lse,
                        const TensorView* final_state = nullptr);

// The gradients of a packed call (attend_varlen with the same inputs, mechanism and options): each
// sequence's attend_backward on views of the packed tensors (no copies of the inputs), so a packed
// batch's gradients are exactly those of its sequences apart; for the linear family the recurrent
// state resets at every boundary. dout, out (1, H, total_q, Dv) and lse (1, H, total_q, 1) float32
// (an empty view for families without one) as attend_varlen returned them; dlse: lse's shape or
// null; dfinal_state: (S, H, F, C) float32, the loss's gradient with respect to each sequence's
// final state, or null. Returns dq (1, H, total_q, D), dk (1, Hkv, total_k, D), dv (1, Hkv,
// total_k, Dv) in the inputs' dtypes, bhnd; d_initial_state (S, H, F, C) when params has a
// per-sequence initial_state; dparams (learned params shared by the sequences) summed over the
// sequences in order. options.form picks each sequence's backward form ("reference": float64).
// Every sequence is validated before the first is computed.
AttendGradients attend_varlen_backward(const TensorView& dout, const TensorView& q, const TensorView& k,
                                       const TensorView& v, const TensorView& out, const TensorView& lse,
                                       const std::vector<int64_t>& cu_seqlens_q,
                                       const std::vector<int64_t>& cu_seqlens_k, int64_t max_seqlen_q,
                                       int64_t max_seqlen_k, const Mechanism& mechanism,
                                       const AttendOptions& options = {}, const TensorView* dlse = nullptr,
                                       const TensorView* dfinal_state = nullptr);

}  // namespace attn
