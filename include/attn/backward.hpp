// Training: the gradients of attend()'s output with respect to q, k and v. As flash-attention's
// backward, nothing of size N x M is stored: each score is recomputed from q, k and the forward's
// log-sum-exp, and D_i = dO_i . O_i is taken from the forward's output.
//
//   t_ij = softcap(scale_i q_i . k_j) + bias_ij      (over the keys query i sees)
//   P_ij = exp(t_ij - lse_i),  P~_ij = P_ij keep_ij / (1 - dropout)
//   dV_j = sum_i P~_ij dO_i                      dP_ij = keep_ij / (1 - dropout) dO_i . v_j
//   dT_ij = P_ij (dP_ij - D_i + dlse_i)          dS_ij = dT_ij (1 - tanh^2(s_ij / softcap))
//   dQ_i = scale_i sum_j dS_ij k_j               dK_j = sum_i scale_i dS_ij q_i
//
// GQA/MQA: a kv head's dK and dV sum over its group's query heads. The fast form accumulates in
// float32 whatever the storage dtype, and its result is bitwise the same for any thread count.
#pragma once
#include <map>
#include <string>

#include "attn/attend.hpp"

namespace attn {

struct AttendGradients {
  Tensor dq;  // q's shape (B, H, N, D) and dtype, bhnd
  Tensor dk;  // k's shape (B, Hkv, M, D) and dtype, bhnd
  Tensor dv;  // v's shape (B, Hkv, M, Dv) and dtype, bhnd
  // The linear family: the gradient of params["initial_state"], float32 of its shape
  // (B, H, state_rows, state_cols); empty when the call has no initial state.
  Tensor d_initial_state;
  // The gradients of the call's learned params, by name (additive scores: "wq", "wk" (1, 1, A, D), "w"
  // (1, 1, 1, A); Linformer: "E" and "F", float32 (k, M),
  // held as (1, 1, k, M) tensors; PolaFormer: "power" (D) and "coefficients" (Dv) as (1, 1, 1, n);
  // filled when the call passes them in options.params); empty for
  // mechanisms without learned params. attn::info's ParamInfo::gradient says which params have one.
  std::map<std::string, Tensor> dparams;
};

// dout: the loss's gradient with respect to out, (B, H, N, Dv) in q's dtype; out and lse: what
// attend() returned for the same inputs, mechanism and options (lse (B, H, N, 1) float32).
// Mechanisms: softmax (dot, cosine and additive scores) and the patterns over it (longformer,
// bigbird), with every option of attend(): causal, windows, sinks, patterns, boolean, block and mask_mod masks, an
// additive bias, ALiBi, softcap, scale, the entropy-invariant scale, key padding, dropout (the
// same seed regenerates the same mask), grouped heads; float32, bfloat16 and float16 storage.
// Forms (options.form; explain_backward lists them with their reasons): "tiled" (the fast form:
// 64 query rows against the key tiles of the forward's block mask, five tile products each),
// "rows" (float32, row by row) and "reference" (float64 throughout); cosine and additive scores:
// "scores" (float32 from the forward's LSE: cosine as the tiled form on the normalised rows, additive
// one (query, key) pair at a time) and "reference"; the additive score's params "wq" (A, D), "wk"
// (A, D) and "w" (A) get their gradients in dparams (as (1, 1, A, D) and (1, 1, 1, A)). GAU takes
// the same call with an empty lse (forms tiled, reference). int8 K/V rows and paged caches are an
// Error naming what has no backward. Packed sequences: attend_varlen_backward (attn/kv_cache.hpp).
//
// DCA (one softmax over the pairs' remapped RoPE positions; the forward's merged lse, dlse too):
// the same formulas with t_ij = scale q~_i . k~_j, q~ the query rotated for the pair's part and k~
// the key rotated at j mod chunk, so dQ and dK are rotated back (R^T) and summed over the parts.
// Forms "parts" (float32: the tiled softmax backward on each part against the merged lse and out)
// and "reference" (float64).
//
// qsoftmax (o_i = scale softmax(q_i)^T (S0 + sum_j k_j v_j^T), no lse: an empty view): dq
// through the feature softmax's Jacobian, dk and dv through the state; with params["initial_state"]
// its gradient in d_initial_state, and dfinal_state the final state's gradient as for the linear
// family. Nothing in it is quantised or rounded, so the backward is the true derivative everywhere.
// Forms "right" (non-causal), "recurrent" (causal), "reference" (float64).
// dlse: the loss's gradient with respect to lse, (B, H, N, 1) float32, when the loss uses it
// (merging partial results, ring attention); none = 0.
//
// Linformer (K' = E K, V' = F V over each batch entry's valid keys, then softmax attention on the
// k projected rows; the forward's lse): forms "projected" (float32: the projections again, the tiled
// softmax backward on K', V', then dK = E^T dK', dV = F^T dV') and "reference" (float64). When the
// call passes E and F in params, dparams holds their gradients, dE = sum_(b, kv head) dK' K^T and
// dF = sum dV' V^T over the valid keys (float32 (k, M), as (1, 1, k, M) tensors).
//
// The linear family (linear and its alias retention, sana, normattn, performer, polaformer; every feature map,
// normalised or not, causal or not, a decay in the text or per head in params["decay"], key
// padding, grouped heads, params["initial_state"]): the same gradients of
//   o_i = y_i[:Dv] / (y_i[Dv] + eps)  (or y_i without normalize),
//   y_i = scale phi(q_i)^T (decay^(i+1) S0 + sum_(j <= i) decay^(i-j) phi(k_j) [v_j, 1]^T),
// lse: an empty view (the weights are no softmax), dlse none. dfinal_state: the loss's gradient
// with respect to the final state (what return_final_state gives, (B, H, state_rows, state_cols)
// float32; fla's dht), none = 0; the result's d_initial_state is the gradient of initial_state
// (fla's dh0). Forms: "chunked" (causal, float32 blocks of the mechanism's chunk), "right"
// (non-causal), "reference" (float64). normattn too (through its output norm); performer through
// its random features' Jacobian (the keys' |s k|^2 / 2 shift differentiated, the queries' max shift
// a constant that cancels in the normalised output); polaformer by its two streams (dq, dk summed
// over them), with dparams "power" (D) and "coefficients" (Dv) when the call gives them.
AttendGradients attend_backward(const TensorView& dout, const TensorView& q, const TensorView& k, const TensorView& v,
                                const TensorView& out, const TensorView& lse, const Mechanism& mechanism,
                                const AttendOptions& options = {}, const TensorView* dlse = nullptr,
                                const TensorView* dfinal_state = nullptr);

// The backward forms of the mechanism for these forward inputs and options, each with the reasons
// it cannot run them, and the one attend_backward runs (as explain() for the forward).
Explanation explain_backward(const TensorView& q, const TensorView& k, const TensorView& v, const Mechanism& mechanism,
                             const AttendOptions& options = {});

}  // namespace attn
