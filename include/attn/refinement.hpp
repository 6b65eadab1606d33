// Attention-weight refinement (AWRSR; Liu, Liu & Liu, "Pay Attention to Attention for Sequential
// Recommendation", RecSys 2024). The paper's equations were not found: these formulas are our
// reading of a prose description of its four forms [unverified] (docs/attention-refinement.md).
//
// Input: a causal weight matrix A (N, N) per batch entry (row i sums to 1, a_ij = 0 for j > i,
// N the fixed maximum length as in SASRec), values V (N, dv) and two trained matrices
// W_1, W_2 (N, r) shared by the batch. The weights are turned into new queries and keys:
//   A^ = softmax((A W_1)(A W_2)^T / sqrt(r) + causal mask)          (row-wise, keys j <= i)
// and the forms are
//   simple          O = A^ V
//   value_weighted  O = (A^ A) V
//   additive        O = ((1 - gamma) A + gamma A^) V,  gamma in [0, 1] (default 0.5)
//   stochastic      mu = A W_mu, sigma = elu(A W_Sigma) + 1 (W_1 = W_mu, W_2 = W_Sigma),
//                   A^ = softmax(-|mu_i - mu_j|^2 - |sigma_i - sigma_j|^2 + causal mask)
//                   (the squared 2-Wasserstein distance of diagonal Gaussians), O = A^ V.
// Every form is O = R V with R the "refined weights": rows summing to 1, zero above the diagonal.
//
// A is checked: entries above the diagonal must be exactly 0, and every row whose entries are
// all finite must sum to 1 within `row_sum_tolerance` (rows holding NaN or inf are not checked:
// non-finite inputs propagate to the output instead). Bad input throws attn::Error naming the
// argument, the expected and the actual value.
//
// Arrays are row-major and contiguous: a (batch, N, N), v (batch, N, dv), out (batch, N, dv).
// float: products through the kernel table's gemm (float sums), the softmax in float; double:
// the plain reference (everything in double, the N x N matrices written out). Rows are
// independent, so results do not depend on `threads` (0 = the library's default).
#pragma once
#include <cstdint>
#include <string>
#include <string_view>

#include "attn/output_softmax.hpp"  // MatrixRef

namespace attn {

enum class RefineForm { simple, value_weighted, additive, stochastic };

// "simple", "value_weighted", "additive", "stochastic"; parse_refine_form throws Error on any
// other text (listing the four).
std::string_view refine_form_name(RefineForm form);
RefineForm parse_refine_form(std::string_view text);

struct RefineOptions {
  RefineForm form = RefineForm::simple;
  double gamma = 0.5;                // additive only; in [0, 1]
  double row_sum_tolerance = 1e-4;   // |sum_j a_ij - 1| allowed for a finite row
  int threads = 0;
};

// out (batch, n, dv) = R V for each batch entry. w1, w2: (n, r), r >= 1 (stochastic: W_mu,
// W_Sigma). float: the fast form; double: the reference.
void refine_attention(const float* a, const float* v, int64_t batch, int64_t n, int64_t dv, MatrixRef<float> w1,
                      MatrixRef<float> w2, float* out, const RefineOptions& options = {});
void refine_attention(const double* a, const double* v, int64_t batch, int64_t n, int64_t dv,
                      MatrixRef<double> w1, MatrixRef<double> w2, double* out, const RefineOptions& options = {});

// The refined weights R (batch, n, n) of the form (simple and stochastic: A^; value_weighted:
// A^ A; additive: (1 - gamma) A + gamma A^), computed as the double reference does and rounded
// to T. For inspection and tests: O(n^2 (n + r)) per batch entry.
void refined_weights(const float* a, int64_t batch, int64_t n, MatrixRef<float> w1, MatrixRef<float> w2,
                     float* out, const RefineOptions& options = {});
void refined_weights(const double* a, int64_t batch, int64_t n, MatrixRef<double> w1, MatrixRef<double> w2,
                     double* out, const RefineOptions& options = {});

// Training: the gradients of refine_attention's output with respect to a, v, w1 and w2, given
// dout = dL/dO (batch, n, dv). With P1 = A W1, P2 = A W2, S the scores of A^, Vt = V (A V for
// value_weighted) and c = gamma (additive) or 1:
//   dA^ = c dO Vt^T,  dS_ij = A^_ij (dA^_ij - sum_k A^_ik dA^_ik)   (j <= i),
//   dP1 = dS P2 / sqrt(r), dP2 = dS^T P1 / sqrt(r)
//   (stochastic: X = [mu | sigma], dX = 2 ((dS + dS^T) X - (rowsum dS + colsum dS) * X),
//    dP2 = dsigma * elu'(P2)),
//   dA = dP1 W1^T + dP2 W2^T + dU V^T,  dW1 = sum_b A^T dP1,  dW2 = sum_b A^T dP2 (over the batch),
// where U = A V has dU = A^^T dO (value_weighted), (1 - gamma) dO (additive), 0 otherwise, and
//   dV = A^T dU + (c A^^T dO unless value_weighted).
// grad_a is the derivative of the formulas in every entry of a, those above the diagonal included
// (what autograd of A @ W1 gives; an upstream causal softmax's backward zeroes them). Outputs:
// grad_a (batch, n, n), grad_v (batch, n, dv), grad_w1 and grad_w2 (n, r); none may be null or
// overlap an input. float: the fast form (products by the kernel table's gemm, parallel over
// blocks of rows; every element summed in a fixed order, so bitwise the same for any thread
// count); double: the plain reference (every matrix written out, differentiated by hand).
// Non-finite inputs give non-finite gradients. Checks as refine_attention.
void refine_attention_backward(const float* dout, const float* a, const float* v, int64_t batch, int64_t n,
                               int64_t dv, MatrixRef<float> w1, MatrixRef<float> w2, float* grad_a, float* grad_v,
                               float* grad_w1, float* grad_w2, const RefineOptions& options = {});
void refine_attention_backward(const double* dout, const double* a, const double* v, int64_t batch, int64_t n,
                               int64_t dv, MatrixRef<double> w1, MatrixRef<double> w2, double* grad_a,
                               double* grad_v, double* grad_w1, double* grad_w2, const RefineOptions& options = {});

}  // namespace attn
