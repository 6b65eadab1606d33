// Token negative log-likelihoods of a text under a decoder (perplexity = exp(mean)).
#include <cmath>

#include "attn/error.hpp"
#include "attn/model.hpp"

namespace attn {

std::vector<double> token_nll(Decoder& d, const std::vector<int32_t>& tokens,
                              const std::function<void(int64_t, int64_t)>& progress) {
  const int64_t n = static_cast<int64_t>(tokens.size()), vocab = d.config().vocab_size;
  if (n < 2) fail("token_nll", "tokens must hold at least 2 ids, got " + std::to_string(n));
  if (n > d.config().max_seq_len)
    fail("token_nll", std::to_string(n) + " tokens exceed the decoder's max_seq_len " + std::to_string(d.config().max_seq_len));
  for (int64_t i = 0; i < n; ++i)
    if (tokens[i] < 0 || tokens[i] >= vocab)
      fail("token_nll", "tokens[" + std::to_string(i) + "] must be in [0, " + std::to_string(vocab) + "), got " +
                            std::to_string(tokens[i]));
  constexpr int64_t kStep = 256;  // logits of one step at a time (steps x vocab floats)
  std::vector<double> nll;
  nll.reserve(static_cast<size_t>(n - 1));
  d.reset();
  try {
    for (int64_t t0 = 0; t0 < n - 1; t0 += kStep) {
      const int64_t m = std::min(kStep, n - 1 - t0);  // rows with a next token to score
      const std::vector<float>& logits = d.forward({tokens.begin() + t0, tokens.begin() + t0 + m}, t0, true);
      for (int64_t i = 0; i < m; ++i) {
        const float* row = logits.data() + i * vocab;
        double top = row[0];
        for (int64_t v = 1; v < vocab; ++v) top = std::max(top, static_cast<double>(row[v]));
        double sum = 0;
        for (int64_t v = 0; v < vocab; ++v) sum += std::exp(static_cast<double>(row[v]) - top);
        nll.push_back(top + std::log(sum) - row[tokens[static_cast<size_t>(t0 + i + 1)]]);
      }
      if (progress) progress(t0 + m, n - 1);
    }
  } catch (...) {
    d.reset();
    throw;
  }
  d.reset();
  return nll;
}

}  // namespace attn
