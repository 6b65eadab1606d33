// Dual Chunk Attention (attn::Dca in attn/mechanism.hpp has the rules). Forms: "parts" (the
// keys rotated once at j mod s, the queries three ways; intra-chunk, successive-chunk and
// inter-chunk attention as three exact softmax problems over chunk-lag patterns, run by the
// softmax family's fast forms and merged through their log-sum-exp) and "reference" (float64,
// every pair's remapped relative position, one softmax).
#pragma once
#include <vector>

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
};

}  // namespace attn::dca
