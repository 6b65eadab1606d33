// The mixture-of-experts feed-forward on float32 rows (include/attn/moe.hpp states the math):
// the decoder's MoE layers and attn::moe_feed_forward share it.
//
// Tokens are routed (router products through the kernel table's qk_rows, softmax in float32,
// top-k, renormalised), then gathered per expert into a feature-major buffer Xt (dim, S): expert
// e owns the columns [offset_e, offset_e + padded_e), its tokens in increasing order, padded with
// zeros to a multiple of 16. Each expert then runs one gemm per weight over its columns
// (Gt = silu(W1 Xt) ⊙ (W3 Xt), Yt = W2 Gt), split into blocks of 64 weight rows; float32
// weights are read in place. An expert with fewer than 16 tokens (a decode step's) runs the
// decoder's few-row products instead (model::matmul: each weight row read once, memory-bound),
// its output written into its columns of Yt. Each token's output is the weighted sum of its columns of Yt in its
// top-k order. Every value is computed by one call in a fixed order: the same bits for any
// thread count.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "attn/isa.hpp"
#include "attn/moe.hpp"
#include "model/weights.hpp"

namespace attn::model {

// Scratch kept between calls (the decoder's), sized before any parallel region.
struct MoeScratch {
  std::vector<float> logits, probs, route_w, xt, gt, yt, panels, tmp, few_x, few_g, few_u, few_y;
  std::vector<int32_t> ids;
  std::vector<int64_t> count, offset, slot, items;
  std::vector<char> few;  // per expert: fewer than 16 tokens (run by model::matmul)
};

// y (n, dim) = MoE(x (n, dim)) with `w` (router (E, dim); per expert w1, w3 (hidden, dim),
// w2 (dim, hidden); float32, bfloat16 or float16, not block-quantized). Returns the auxiliary
// loss. ids / weights (n, top_k) and probs (n, E), when not null, receive the routing.
double moe_forward(const float* x, int64_t n, const MoeExperts& w, int64_t top_k, float* y, int threads, Isa isa,
                   MoeScratch& s, int32_t* ids = nullptr, float* weights = nullptr, float* probs = nullptr);

// The checks moe_feed_forward and its backward share, their errors said as `where`'s: the sizes
// (tokens >= 0, dim, experts, hidden >= 1, 1 <= top_k <= experts, threads in [0, kMaxThreads]), and
// a span's length (`got` values for `shape` = `want`).
void check_moe_sizes(const MoeSizes& z, int threads, const char* where);
void check_moe_len(size_t got, int64_t want, const char* name, const std::string& shape, const char* where);

}  // namespace attn::model
