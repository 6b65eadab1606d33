// Choosing the next token from a row of logits: greedy (temperature 0), or a draw from
// softmax(logits / temperature) restricted to the smallest set of most likely tokens whose
// probability reaches top_p (nucleus sampling). Draws are counter-based on (seed, step), so a
// seed gives the same text on every machine and thread count.
#pragma once
#include <cstdint>
#include <string>

namespace attn {

struct SamplingOptions {
  double temperature = 0.0;  // 0: greedy; > 0: sample
  double top_p = 1.0;        // in (0, 1]
  uint64_t seed = 0;
};

class Sampler {
 public:
  explicit Sampler(const SamplingOptions& options);  // throws Error naming a bad option
  // The next token from logits[0..vocab); every call advances the draw counter (the step).
  // Logits must be finite or -inf, one finite at least: NaN, +inf or all -inf throw Error
  // naming the step (NaN weights give NaN logits, never a silent token 0).
  int32_t next(const float* logits, int64_t vocab);

 private:
  SamplingOptions options_;
  uint64_t step_ = 0;
};

// Generation's limits, checked before anything is decoded (the CLI's generate and chat and
// Python's Model.generate share it): max_tokens >= 0, and prompt_tokens + max_tokens within the
// context of max_seq_len tokens. Throws Error naming `argument` (how the caller spells max_tokens).
void check_generation_length(const std::string& argument, int64_t prompt_tokens, int64_t max_tokens, int64_t max_seq_len);

}  // namespace attn
