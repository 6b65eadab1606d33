// Library internals the test/benchmark harness needs beyond the public API (harness/); defined
// in families/info.cpp (the forward reference) and families/backward_reference.cpp (the gradients).
#pragma once
#include <string>

#include "attn/attend.hpp"
#include "attn/backward.hpp"
#include "core/reference_result.hpp"

namespace attn::families {

// The family's reference for this call, float64 (the oracle) or plain (the same-dtype
// baseline of the tolerance rule). Validates like attend().
core::ReferenceResult reference_outputs(const TensorView& q, const TensorView& k, const TensorView& v,
                                  const Mechanism& mechanism, const AttendOptions& options, core::RefPrecision precision);

// Why attend_backward refuses this mechanism whatever the form ("" = it has a backward): its family
// declares none, or refuses this mechanism (softmax score=cosine). Validates like attend().
std::string backward_refusal(const TensorView& q, const TensorView& k, const TensorView& v, const Mechanism& mechanism,
                             const AttendOptions& options);

// The family's backward reference for dout (B, H, N, Dv) in q's dtype: float64 (the oracle) or plain
// (the reference algorithm with its intermediates rounded to the storage dtype: the baseline of
// the gradients' tolerance rule). The gradients are float32 tensors whatever the storage dtype, so
// a comparison with them is not limited by its rounding. Validates like attend(); an Error when
// backward_refusal is not "".
AttendGradients reference_gradients(const TensorView& dout, const TensorView& q, const TensorView& k,
                                    const TensorView& v, const Mechanism& mechanism, const AttendOptions& options,
                                    core::RefPrecision precision);

}  // namespace attn::families
