// The linear family: weights w_ij = scale * phi(q_i) . phi(k_j) * decay^(i - j), normalised by
// their row sum or not (attn/mechanism.hpp, Linear). One generalised recurrence over the state
//   S_i = decay S_(i-1) + phi(k_i) [v_i, 1]^T      (F x (Dv + 1); F x Dv without normalize)
// behind three fast forms that must agree with each other and with the quadratic reference,
// final state included:
//   right      non-causal: S = S0 + phi(K)^T [V 1] once, then every row against it
//   recurrent  causal, token by token: O(F Dv) per token whatever its position (decoding)
//   chunked    causal, Lightning: blocks of C rows, the block's own keys as a masked product,
//              earlier blocks through the state; every product GEMM-shaped
//   reference  quadratic, float64, with the weights and the final state
#pragma once
#include <array>
#include <optional>
#include <string>
#include <vector>

#include "core/facts.hpp"
#include "core/form.hpp"
#include "core/io_checks.hpp"
#include "core/reference_result.hpp"

namespace attn::linear {

struct LinearProblem : core::Dims {
  Linear mech;                  // the kernel: map, causal, normalize, decay, chunk (any of the family's kinds)
  double scale = 1.0;
  double eps = 0.0;             // added to every denominator (sana)
  OutputNorm norm = OutputNorm::none;  // of each output row (normattn)
  std::vector<float> omega_t;   // performer: random features transposed, (D, F) row-major; empty: mech.map
  std::vector<double> decay;    // per query head, in (0, 1]; 1 everywhere without decay
  int64_t F = 0;                // features per row (the head dim for the elementwise maps)
  // PolaFormer: per-channel powers (D), output coefficients (Dv); each of its two streams runs as
  // a sub-problem (stream 0 same-sign, 1 opposite-sign) on half of the value channels.
  std::vector<float> power, coef;
  bool power_given = false;     // params['power'] (its gradient is returned)
  int stream = -1;
  std::optional<ArrayView> initial;  // (B, H, state_rows, state_cols), validated; none: a zero state
  // Element (b, h, f, c) of the initial state (0 without one).
  float initial_at(int64_t b, int64_t h, int64_t f, int64_t c) const;
  bool polar() const { return !power.empty(); }
  // The state's rows and columns: F x (Dv [+ 1]); PolaFormer's whole problem: 4 D x (Dv / 2 + 1).
  int64_t state_rows() const { return polar() && stream < 0 ? 4 * D : F; }
  int64_t state_cols() const { return (polar() && stream < 0 ? Dv / 2 : Dv) + (mech.normalize ? 1 : 0); }
  bool decays() const;
};

// PolaFormer's power: the text option's range, also the bound of params['power'] (linear_facts.cpp).
core::OptionRange polaformer_power_range(const std::optional<double>& value);

struct LinearFamily {
  using Problem = LinearProblem;
  static constexpr bool has_lse = false;  // the weights are not a softmax
  // linear (and retention), normattn, performer, sana: each a kernel, a feature map and extras.
  static Problem validate(const TensorView& q, const TensorView& k, const TensorView& v, const Linear& m,
                          const AttendOptions& options, const core::Outputs& outs);
  static Problem validate(const TensorView& q, const TensorView& k, const TensorView& v, const NormAttn& m,
                          const AttendOptions& options, const core::Outputs& outs);
  static Problem validate(const TensorView& q, const TensorView& k, const TensorView& v, const Performer& m,
                          const AttendOptions& options, const core::Outputs& outs);
  static Problem validate(const TensorView& q, const TensorView& k, const TensorView& v, const Sana& m,
                          const AttendOptions& options, const core::Outputs& outs);
  static Problem validate(const TensorView& q, const TensorView& k, const TensorView& v, const PolaFormer& m,
                          const AttendOptions& options, const core::Outputs& outs);
  // What each kind is (linear_facts.cpp): a state of fixed size, its shape rule, params, limits.
  static core::Facts facts(const Linear& m);
  static core::Facts facts(const NormAttn& m);
  static core::Facts facts(const Performer& m);
  static core::Facts facts(const Sana& m);
  static core::Facts facts(const PolaFormer& m);
  // What facts(m) declares of each kind's float options and params, for validation (each without
  // the rest of the facts; performer has no float option).
  static std::vector<core::OptionRange> ranges(const Linear& m);
  static std::vector<core::OptionRange> ranges(const NormAttn& m);
  static std::vector<core::OptionRange> ranges(const Performer& m);
  static std::vector<core::OptionRange> ranges(const Sana& m);
  static std::vector<core::OptionRange> ranges(const PolaFormer& m);
  static std::vector<core::ParamSpec> params(const Linear& m);
  static std::vector<core::ParamSpec> params(const NormAttn& m);
  static std::vector<core::ParamSpec> params(const Performer& m);
  static std::vector<core::ParamSpec> params(const Sana& m);
  static std::vector<core::ParamSpec> params(const PolaFormer& m);
  static const std::vector<core::Form<Problem>>& forms();
  // Causal: 2 C (F + Dv) + 4 F Dv per query (the chunked form, C = min(chunk, N));
  // non-causal: 2 F Dv per key and per query (the right product).
  static double flops(const Problem& p);
  static core::ReferenceResult reference(const Problem& p, core::RefPrecision precision);
  // (B, H, F, state_cols) of the recurrent state.
  static std::array<int64_t, 4> state_shape(const Problem& p);
  // The backward (linear_backward.hpp): why this kind has none (performer with eps, in principle)
  // or ""; its forms in priority order: chunked (causal), right (non-causal), reference (float64).
  static std::string backward_refusal(const Problem& p);
  static const std::vector<core::BackwardForm<Problem>>& backward_forms();
  // The float64 backward, or the plain same-dtype baseline (linear_backward_reference).
  static void backward_reference(const Problem& p, const core::BackwardViews& g, core::RefPrecision precision);
  // PolaFormer's "power" (1, 1, 1, D) and "coefficients" (1, 1, 1, Dv) when the call gives them.
  static std::vector<core::LearnedParam> learned_params(const Problem& p);
};


// PolaFormer's stream s of a whole problem: F = 2 D, the value, output and state columns of its
// half (views into the caller's arrays, no copies).
LinearProblem stream_problem(const LinearProblem& p, int s);

// Performer's random feature rows (F, D) row-major for `seed` (see Performer in mechanism.hpp).
std::vector<double> performer_omega(int64_t F, int64_t D, uint64_t seed);

// The forms (one file each).
void refuse_right(const LinearProblem& p, const core::Outputs& o, core::Reasons& why);
void run_right(const LinearProblem& p, const core::Outputs& o, const core::Context& ctx);
void refuse_recurrent(const LinearProblem& p, const core::Outputs& o, core::Reasons& why);
void run_recurrent(const LinearProblem& p, const core::Outputs& o, const core::Context& ctx);
void refuse_chunked(const LinearProblem& p, const core::Outputs& o, core::Reasons& why);
void run_chunked(const LinearProblem& p, const core::Outputs& o, const core::Context& ctx);
core::ReferenceResult linear_reference(const LinearProblem& p, core::RefPrecision precision);
// The row statistics of the whole problem into o.stats (a second pass after any form; PolaFormer:
// its two streams' rows averaged), see linear_stats.cpp.
void linear_row_stats(const LinearProblem& p, const core::Outputs& o, const core::Context& ctx);

}  // namespace attn::linear
