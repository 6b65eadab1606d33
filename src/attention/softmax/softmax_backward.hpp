// The softmax family's backward: dQ, dK, dV of exact attention (formulas: attn/backward.hpp).
#pragma once
#include "core/backward_views.hpp"
#include "core/form.hpp"
#include "core/reference_result.hpp"
#include "softmax/problem.hpp"

namespace attn::exact {

using core::BackwardViews;

// From q, k, v and dout only (its own LSE and D): in float64 the oracle; `plain`: float with every
// intermediate rounded to the storage dtype, the same-dtype baseline of the tolerance rule.
void softmax_backward_reference(const Problem& p, const BackwardViews& g,
                                core::RefPrecision precision = core::RefPrecision::f64);
// float32, flash-style (the forward's LSE and out), parallel over (batch entry, kv head).
void softmax_backward_rows(const Problem& p, const BackwardViews& g, int threads);
// float32, flash-style on the kernel table's tile products (softmax_backward_tiled.cpp): blocks of
// 64 query rows against the key tiles of the forward's block mask.
void softmax_backward_tiled(const Problem& p, const BackwardViews& g, const core::Context& ctx);
// The same with bf16 products (AttendOptions::precision), as the forward's tiled_bf16.
void softmax_backward_tiled_bf16(const Problem& p, const BackwardViews& g, const core::Context& ctx);
// Cosine and additive scores (softmax_backward_scores.cpp): float32, flash-style, one (query, key)
// pair at a time on the KV-gradient tasks; with the additive score's parameter gradients (dparams
// "wq", "wk", "w") summed per task and added in task order.
void softmax_backward_scores(const Problem& p, const BackwardViews& g, const core::Context& ctx);

}  // namespace attn::exact
