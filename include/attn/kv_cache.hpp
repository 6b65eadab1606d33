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
// mechanism; masks, key padding and params with a batch dimension are refused.
AttendResult attend_varlen(const TensorView& q, const TensorView& k, const TensorView& v,
                           const std::vector<int64_t>& cu_seqlens_q, const std::vector<int64_t>& cu_seqlens_k,
                           int64_t max_seqlen_q, int64_t max_seqlen_k, const Mechanism& mechanism,
                           const AttendOptions& options = {});
// Same, writing out (1, H, total_q, Dv) and, when given, lse (1, H, total_q, 1) float32.
void attend_varlen_into(const TensorView& q, const TensorView& k, const TensorView& v,
                        const std::vector<int64_t>& cu_seqlens_q, const std::vector<int64_t>& cu_seqlens_k,
                        int64_t max_seqlen_q, int64_t max_seqlen_k, const Mechanism& mechanism,
                        const AttendOptions& options, const TensorView& out, const TensorView* lse);

}  // namespace attn
