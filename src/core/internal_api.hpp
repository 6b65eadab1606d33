// Library internals the test/benchmark harness needs beyond the public API (harness/).
#pragma once
#include <string>
#include <vector>

#include "attn/attend.hpp"
#include "core/reference_result.hpp"

namespace attn::core {

// The family's reference for this call, float64 (the oracle) or plain (the same-dtype
// baseline of the tolerance rule). Validates like attend().
ReferenceResult reference_outputs(const TensorView& q, const TensorView& k, const TensorView& v,
                                  const Mechanism& mechanism, const AttendOptions& options, RefPrecision precision);

// Whether the family returns a log-sum-exp (softmax-like weights).
bool has_lse(const Mechanism& mechanism);
// Whether the family has a recurrent state (final_state, initial_state).
bool has_state(const Mechanism& mechanism);

// The names of the family's forms, in priority order.
std::vector<std::string> form_names(const Mechanism& mechanism);

}  // namespace attn::core
