// The entry point: attend(q, k, v, mechanism, options).
//
// Shapes (views may use any strides, e.g. (B,H,N,D) or (B,N,H,D) memory):
//   q (B, H, N, D)   k (B, Hkv, M, D)   v (B, Hkv, M, Dv)   H a multiple of Hkv
//   out (B, H, N, Dv)                   lse (B, H, N) float32, natural log
//   probs (B, H, N, M) float32, the softmax weights before dropout
//
// Causal masks are aligned bottom-right: query i sees key j iff j <= i + M - N (like
// flash-attn; torch's is_causal is top-left when N != M). For M > N this is a block of new
// queries appended after a cache of M - N keys:
//
//        keys j ->            N = 2, M = 5
//   i=0  x x x x .            x visible, . masked
//   i=1  x x x x x
//
// A query row that sees no key returns zeros, and its log-sum-exp is -inf.
#pragma once
#include <cstdint>
#include <optional>
#include <vector>

#include "attn/isa.hpp"
#include "attn/mechanism.hpp"
#include "attn/tensor.hpp"

namespace attn {

// User weights of the additive (Bahdanau) score  w^T tanh(Wq q + Wk k).
struct AdditiveWeights {
  std::vector<float> wq;  // (A, D) row-major
  std::vector<float> wk;  // (A, D) row-major
  std::vector<float> w;   // (A)
};

struct AttendOptions {
  // Keys j >= key_padding_lengths[b] are hidden from every query of batch b (length B).
  std::vector<int64_t> key_padding_lengths;
  // Boolean mask (true = may attend) with shape (B|1, H|1, N, M); size-1 dims broadcast.
  std::optional<TensorView> mask;
  // Additive float bias with shape (B|1, H|1, N, M), added to the scores.
  std::optional<TensorView> bias;
  // ALiBi: adds -slope_h * |i + M - N - j|; H slopes, or B*H (batch-major).
  std::vector<float> alibi_slopes;
  std::optional<AdditiveWeights> additive;  // required by score=additive
  bool return_lse = false;
  bool return_probs = false;
  int threads = 0;                    // 0: OpenMP default
  std::optional<Isa> isa;             // force a kernel set (tests); default active_isa()
  bool use_reference = false;         // run the float64 reference instead of the fast path
};

struct AttendResult {
  Tensor out;    // dtype of q, same layout family as q
  Tensor lse;    // (B, H, N, 1) float32 when requested
  Tensor probs;  // (B, H, N, M) float32 when requested
};

AttendResult attend(const TensorView& q, const TensorView& k, const TensorView& v,
                    const Mechanism& mechanism, const AttendOptions& options = {});

// Same, writing into caller-provided views (out: (B,H,N,Dv) any dtype/strides;
// lse: (B,H,N,1) f32; probs: (B,H,N,M) f32). Pass nullptr for outputs you do not want.
// Outputs must not overlap k, v, masks or each other (out may be q itself: each block of
// queries is read before its outputs are written).
void attend_into(const TensorView& q, const TensorView& k, const TensorView& v,
                 const Mechanism& mechanism, const AttendOptions& options,
                 const TensorView& out, const TensorView* lse, const TensorView* probs);

// Floating-point operations the mechanism needs for these shapes (counting only the
// visible (query, key) pairs for causal/window masks): 2*pairs*(D + Dv).
double attention_flops(const TensorView& q, const TensorView& k, const TensorView& v,
                       const Mechanism& mechanism);

}  // namespace attn
