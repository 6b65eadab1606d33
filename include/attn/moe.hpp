// Mixture-of-experts feed-forward (MiniMax-01's): a router picks top_k of E SwiGLU
// experts per token.
//   r = h W_r^T            (W_r: (E, dim), no bias)
//   p = softmax(r)         in float32 (the float64 reference: in double)
//   top_k largest p        (ties: the lower expert id), w = p_top / sum p_top
//   y = sum_k w_k E_{e_k}(h),   E_e(h) = W2_e (silu(W1_e h) ⊙ W3_e h)
//   aux = 0.001 · E · sum_e f_e P_e   (f_e: share of tokens whose top_k holds e; P_e: mean p_e)
// Weights are laid out as torch's nn.Linear holds them (out, in): router (E, dim), w1 and w3
// (E, hidden, dim), w2 (E, dim, hidden); x and y (tokens, dim); all row-major, contiguous.
// The float32 form gathers each expert's tokens so that every expert runs one matrix product
// per weight (the kernel table's gemm; an expert with fewer than 16 tokens: the decoder's few-row
// products); the double form is the plain per-token reference. Results
// do not depend on `threads` (0 = the library's default), bitwise. Non-finite inputs propagate.
// Bad input (top_k outside [1, E], sizes < 1, spans whose length disagrees with the sizes)
// throws attn::Error naming the argument, the expected and the actual value.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

namespace attn {

// The load-balance loss coefficient (MiniMax-01's training config).
constexpr double kMoeAuxCoefficient = 0.001;

struct MoeSizes {
  int64_t tokens = 0;   // >= 0
  int64_t dim = 0;      // model width, >= 1
  int64_t experts = 0;  // E >= 1
  int64_t hidden = 0;   // each expert's SwiGLU width (d_ff), >= 1
  int64_t top_k = 2;    // in [1, E]
};

// Each token's chosen experts (descending p, ties: lower id) and renormalised weights,
// (tokens, top_k) row-major; probs (tokens, E) the router softmax.
template <class T>
struct MoeRouting {
  std::vector<int32_t> ids;
  std::vector<T> weights;
  std::vector<T> probs;
};

// y = MoE(x); returns the auxiliary loss (0 for no tokens). `routing`, when given, receives the
// routing. y must not alias x.
double moe_feed_forward(const MoeSizes& sizes, std::span<const float> x, std::span<const float> router,
                        std::span<const float> w1, std::span<const float> w2, std::span<const float> w3,
                        std::span<float> y, int threads = 0, MoeRouting<float>* routing = nullptr);
// The float64 reference: one token at a time, every sum in double.
double moe_feed_forward(const MoeSizes& sizes, std::span<const double> x, std::span<const double> router,
                        std::span<const double> w1, std::span<const double> w2, std::span<const double> w3,
                        std::span<double> y, int threads = 0, MoeRouting<double>* routing = nullptr);

// Gradients of moe_feed_forward. Given dy = dL/dy (tokens, dim) and daux = dL/d(aux loss), writes
// dL/dx, dL/drouter, dL/dw1, dL/dw2, dL/dw3 (each the shape of its input; overwritten, not added
// to). The routing choice is a constant (top_k picks the same experts as the forward); the chosen
// experts' weights w = p_top / sum p_top carry their gradient through the renormalisation and the
// softmax into the router and x, and daux flows through P_e (f_e counts tokens: a constant). An
// expert no token chose gets zero gradients. The float32 form re-runs the forward's routing and
// gathering (so it picks the experts the float32 forward picked), then runs each expert's backward
// as matrix products over its gathered tokens, in blocks of weight rows over the threads; every
// value is computed by one call in a fixed order: the same bits for any `threads`. The double form
// is the plain per-token reference (every sum in double). Bad input throws attn::Error naming the
// argument (moe_feed_forward's checks, and dy and each gradient's length).
template <class T>
struct MoeGradients {
  std::span<T> dx, drouter, dw1, dw2, dw3;
};
void moe_feed_forward_backward(const MoeSizes& sizes, std::span<const float> dy, double daux,
                               std::span<const float> x, std::span<const float> router, std::span<const float> w1,
                               std::span<const float> w2, std::span<const float> w3, const MoeGradients<float>& grads,
                               int threads = 0);
void moe_feed_forward_backward(const MoeSizes& sizes, std::span<const double> dy, double daux,
                               std::span<const double> x, std::span<const double> router, std::span<const double> w1,
                               std::span<const double> w2, std::span<const double> w3,
                               const MoeGradients<double>& grads, int threads = 0);

}  // namespace attn
