// A token's log-probability under a row of logits (log-softmax, float64 sums) and the most
// likely tokens of the row, as OpenAI's `logprobs` reports them.
#pragma once
#include <cstdint>

#include "attn/engine.hpp"

namespace attn::serve {

// logprob of `token` and the `top` most likely tokens (ties to the lower id), most likely first.
// A NaN among the logits makes every logprob NaN.
TokenLogprob token_logprob(const float* logits, int64_t vocab, int32_t token, int top);

}  // namespace attn::serve
