// Dual Chunk Attention (attn::Dca in attn/mechanism.hpp has the rules). Forms: "parts" (the
// keys rotated once at j mod s, the queries three ways; intra-chunk, successive-chunk and
// inter-chunk attention as three exact softmax problems over chunk-lag patterns, run by the
// softmax family's fast forms and merged through their log-sum-exp) and "reference" (float64,
// every pair's remapped relative position, one softmax). Backward (dca_backward.cpp): "parts"
// (the softmax family's tiled backward on each part against the merged LSE and output, the
// gradients rotated back) and "reference" (float64).
#pragma once
#include <string>
#include <vector>

#include "attn/rope.hpp"
#include "attn/tensor.hpp"
#include "core/backward_views.hpp"

#include "core/facts.hpp"
#include "core/form.hpp"
#include "core/reference_result.hpp"
#include "softmax/problem.hpp"

namespace attn::dca {

// The causal softmax problem over the inputs as given (padding, masks, bias, scale), plus DCA's
// chunking.
struct DcaProblem : exact::Problem {
  Dca dca;
};

// The three parts: which key chunks (query chunk - key chunk) and where the query sits.
enum class DcaPart { intra, successive, inter };
// RoPE position of the query at position p against a key of part `part`; keys sit at j mod s.
int64_t dca_query_position(const Dca& m, DcaPart part, int64_t p);
DcaPart dca_part(const Dca& m, int64_t p, int64_t j);

// The parts in the order their partials are merged: each part's key chunks (query chunk - key
// chunk in [lag_min, lag_max], lag_max -1: unbounded).
struct DcaPartSpec {
  DcaPart part;
  int64_t lag_min, lag_max;
};
inline constexpr int kDcaParts = 3;
inline constexpr DcaPartSpec kDcaPartSpecs[kDcaParts] = {
    {DcaPart::intra, 0, 0}, {DcaPart::successive, 1, 1}, {DcaPart::inter, 2, -1}};

// RoPE as DCA applies it (its theta and style, every channel).
Rope dca_rope(const Dca& m);
// A float32 copy of x rotated with token n at positions[n].
Tensor dca_rotated(const kernels::TileKernels& kern, const TensorView& x, const Rope& rope,
                   const std::vector<int64_t>& positions);
// The keys rotated at j mod chunk (float32, shared by the three parts).
Tensor dca_rotated_keys(const kernels::TileKernels& kern, const DcaProblem& p);
// The queries rotated for part t (float32).
Tensor dca_rotated_queries(const kernels::TileKernels& kern, const DcaProblem& p, int t);
// Part t as an exact softmax problem over rotated q and k (views of dca_rotated_* tensors): the
// problem's masks, padding and bias, its keys restricted to the part's chunk lags.
exact::Problem dca_part_problem(const DcaProblem& p, int t, const TensorView& q, const TensorView& k);

struct DcaFamily {
  using Mechanism = Dca;
  using Problem = DcaProblem;
  static Problem validate(const TensorView& q, const TensorView& k, const TensorView& v, const Dca& m,
                          const AttendOptions& options, const core::Outputs& outs);
  static core::Facts facts(const Dca& m);
  // Its float options' ranges (facts(m).ranges; validate checks them on every call).
  static std::vector<core::OptionRange> ranges(const Dca& m);
  static const std::vector<core::Form<Problem>>& forms();
  // The causal pairs: 2 (D + Dv) each, whatever part they fall in.
  static double flops(const Problem& p);
  static core::ReferenceResult reference(const Problem& p, core::RefPrecision precision);
  // dQ, dK, dV (dca_backward.cpp): forms parts (float32) and reference (float64). Nothing refused
  // beyond what validate refuses (int8 K/V rows, ALiBi, params): DCA is one softmax over scores that
  // are smooth in q and k (the rotations are linear, the positions constants).
  static std::string backward_refusal(const Problem& p);
  static const std::vector<core::BackwardForm<Problem>>& backward_forms();
  // The float64 backward from q, k, v and dout alone (or, with RefPrecision::plain, the same in
  // float rounded to the storage dtype: the tolerance rule's baseline).
  static void backward_reference(const Problem& p, const core::BackwardViews& g, core::RefPrecision precision);
};

}  // namespace attn::dca
