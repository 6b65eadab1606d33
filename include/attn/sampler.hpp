// Choosing the next token from a row of logits: greedy (temperature 0), or a draw from
// softmax(logits / temperature) restricted to the smallest set of most likely tokens whose
// probability reaches top_p (nucleus sampling). Draws are counter-based on (seed, step), so a
// seed gives the same text on every machine and thread count.
//
// The rules, in llama.cpp's order (common/sampling: penalties, top-k, top-p, min-p, temperature):
//   1. repeat_penalty: each distinct id among the last repeat_last_n tokens of the context has
//      its logit divided by the penalty when positive, multiplied when negative (1 = off). It
//      applies to greedy decoding too (it can change the argmax).
//   2. top_k: only the k largest logits stay (ties to the lower id; 0 = off).
//   3. top_p, then min_p (keep p >= min_p * p_max; 0 = off), both on softmax(logits / temperature).
// One difference from llama.cpp: it divides by the temperature last, so its top-p and min-p see
// temperature-1 probabilities; here they see the tempered ones (the same at temperature 1).
// Greedy decoding ignores top_k, top_p and min_p (none of them changes the most likely token).
#pragma once
#include <cstdint>
#include <span>
#include <string>

namespace attn {

struct SamplingOptions {
  double temperature = 0.0;  // 0: greedy; > 0: sample
  double top_p = 1.0;        // in (0, 1]
  uint64_t seed = 0;
  int64_t top_k = 0;            // >= 0; 0: every token
  double min_p = 0.0;           // in [0, 1]; 0: off
  double repeat_penalty = 1.0;  // finite, > 0; 1: off
  int64_t repeat_last_n = 64;   // >= -1: the context's tokens penalised; 0: none, -1: all
};

class Sampler {
 public:
  explicit Sampler(const SamplingOptions& options);  // throws Error naming a bad option
  // The next token from logits[0..vocab); every call advances the draw counter (the step).
  // Logits must be finite or -inf, one finite at least: NaN, +inf or all -inf throw Error
  // naming the step (NaN weights give NaN logits, never a silent token 0). `context`: the
  // tokens before this one (prompt and generated), oldest first, for repeat_penalty; ids outside
  // [0, vocab) are an Error.
  int32_t next(const float* logits, int64_t vocab, std::span<const int32_t> context = {});

 private:
  SamplingOptions options_;
  uint64_t step_ = 0;
};

// Generation's limits, checked before anything is decoded (the CLI's generate and chat and
// Python's Model.generate share it): max_tokens >= 0, and prompt_tokens + max_tokens within the
// context of max_seq_len tokens. Throws Error naming `argument` (how the caller spells max_tokens).
void check_generation_length(const std::string& argument, int64_t prompt_tokens, int64_t max_tokens, int64_t max_seq_len);

}  // namespace attn
