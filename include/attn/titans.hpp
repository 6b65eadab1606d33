// Titans neural long-term memory (Behrouz et al. 2024): a small network M whose weights are
// written at test time by gradient steps on ||M(k_t) - v_t||^2, with momentum and forgetting,
// and read with the queries.
//   memory   linear  M(k) = W k                      W (d, d)
//            mlp     M(k) = W_2 gelu(W_1 k)          W_1 (4d, d), W_2 (d, 4d), no biases, exact gelu
//   loss     l = ||M(k) - v||^2  (mean: divided by d)
//   update   S_t = eta_t S_{t-1} - theta_t grad l(M_{t'}; k_t, v_t),  M_t = (1 - alpha_t) M_{t-1} + S_t,
//            S_0 = 0 (or given, to continue), M_0 given; t' = b floor((t - 1) / b) (mini-batches of b tokens share the
//            state their gradients are taken at; b = 1 is the online rule)
//   read     y_t = M_t(q_t), after token t's update
// Inputs per head: q, k, v (B, H, N, d), gates theta, eta, alpha (B, H, N): theta >= 0,
// eta and alpha in [0, 1] (NaN passes and propagates). Row-major and contiguous.
// Weights are handed over and returned flat, per sequence: linear W (d*d values); mlp W_1 then
// W_2 (4d*d + d*4d values), each row-major in the layout above (M(k) = W k).
// Sequences (b, h) are independent and each runs on one thread: results do not depend on
// `threads` (0 = the library's default). Bad input throws attn::Error naming the argument.
#pragma once
#include <cstdint>
#include <string>

namespace attn {

enum class TitansMemory { linear, mlp };
enum class TitansLoss { sum, mean };

struct TitansConfig {
  TitansMemory memory = TitansMemory::linear;
  TitansLoss loss = TitansLoss::sum;
  int64_t batch_size = 16;  // b >= 1
};

struct TitansShape {
  int64_t batch = 1, heads = 1, tokens = 0, dim = 0;  // B, H, N, d
};

// Values in one sequence's weights: d*d (linear) or 8*d*d (mlp).
int64_t titans_weight_count(TitansMemory memory, int64_t dim);
// "linear" / "mlp" and "sum" / "mean" (Error naming `what` otherwise).
TitansMemory titans_memory_from_text(const std::string& text);
TitansLoss titans_loss_from_text(const std::string& text);

struct TitansArgs {
  // (B, H, N, d)
  const float* q = nullptr;
  const float* k = nullptr;
  const float* v = nullptr;
  // (B, H, N)
  const float* theta = nullptr;
  const float* eta = nullptr;
  const float* alpha = nullptr;
  // M_0: w0_groups sequences' weights, w0_groups = 1 (shared), H (per head) or B*H (per
  // sequence); null = all zeros.
  const float* w0 = nullptr;
  int64_t w0_groups = 1;
  // S_0 (the momentum to start from, e.g. a previous call's s_out), laid out as w0 and in as
  // many groups; null = zeros (the rule's S_0 = 0).
  const float* s0 = nullptr;
};

// The fast form, float32. Per mini-batch of b tokens, the b gradients at the shared state, the
// reads and the state at the mini-batch's end are batched matrix products (the kernel table's
// gemm); the gate products within a mini-batch are running products (no division).
// y: (B, H, N, d); w_out: (B*H, weight count) the final M_N; s_out: null or (B*H, count), S_N.
void titans_memory(const TitansShape& shape, const TitansConfig& config, const TitansArgs& in, float* y,
                   float* w_out, float* s_out = nullptr, int threads = 0);

// The float64 reference: the plain token loop of the update rule above.
struct TitansArgs64 {
  const double* q = nullptr;
  const double* k = nullptr;
  const double* v = nullptr;
  const double* theta = nullptr;
  const double* eta = nullptr;
  const double* alpha = nullptr;
  const double* w0 = nullptr;
  int64_t w0_groups = 1;
  const double* s0 = nullptr;
};
void titans_memory_reference(const TitansShape& shape, const TitansConfig& config, const TitansArgs64& in,
                             double* y, double* w_out, double* s_out = nullptr);

// The loss l(M; k, v) and its gradient with respect to the weights (count values, the layout of
// the weights), in float64, by the closed forms (linear grad_W = 2 e k^T; mlp
// grad_W2 = 2 e a^T, grad_W1 = 2 ((W_2^T e) . gelu'(z)) k^T, z = W_1 k, a = gelu(z)).
double titans_loss_and_gradient(TitansMemory memory, TitansLoss loss, int64_t dim, const double* weights,
                                const double* k, const double* v, double* grad);

// Gradients of titans_memory (issue 56): the write is part of the graph, so the outer gradient
// differentiates through the memory's own gradient steps (second-order terms of the inner loss;
// src/blocks/titans/titans_backward_sequence.hpp derives them). Given dy = dL/dy (B, H, N, d),
// dw_out = dL/dM_N and ds_out = dL/dS_N ((B*H, count) each; any of the three may be null: zero),
// writes dq, dk, dv (B, H, N, d), dtheta, deta, dalpha (B, H, N) and, when not null, dw0 = dL/dM_0
// and ds0 = dL/dS_0 ((w0_groups, count): a group shared by several sequences gets their sum, added
// in sequence order). Outputs are overwritten. Each sequence replays its forward from checkpoints
// at mini-batch starts and runs the reverse token loop; sequences run in parallel, one per thread:
// the same bits for any `threads`. The float32 form is that loop in float32 (it mirrors the float64
// reference; the fast forward's batched products are not used). Errors as titans_memory's.
struct TitansGrads {
  float* dq = nullptr;
  float* dk = nullptr;
  float* dv = nullptr;
  float* dtheta = nullptr;
  float* deta = nullptr;
  float* dalpha = nullptr;
  float* dw0 = nullptr;
  float* ds0 = nullptr;
};
void titans_memory_backward(const TitansShape& shape, const TitansConfig& config, const TitansArgs& in,
                            const float* dy, const float* dw_out, const float* ds_out, const TitansGrads& grads,
                            int threads = 0);
struct TitansGrads64 {
  double* dq = nullptr;
  double* dk = nullptr;
  double* dv = nullptr;
  double* dtheta = nullptr;
  double* deta = nullptr;
  double* dalpha = nullptr;
  double* dw0 = nullptr;
  double* ds0 = nullptr;
};
// The float64 reference: the same reverse loop in double, one sequence after another.
void titans_memory_backward_reference(const TitansShape& shape, const TitansConfig& config, const TitansArgs64& in,
                                      const double* dy, const double* dw_out, const double* ds_out,
                                      const TitansGrads64& grads);

}  // namespace attn
