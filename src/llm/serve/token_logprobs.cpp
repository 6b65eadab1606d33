#include "serve/token_logprobs.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace attn::serve {

TokenLogprob token_logprob(const float* logits, int64_t vocab, int32_t token, int top) {
  float most = -std::numeric_limits<float>::infinity();
  bool nan = false;
  for (int64_t i = 0; i < vocab; ++i) {
    nan |= std::isnan(logits[i]);
    most = std::max(most, logits[i]);
  }
  double sum = 0;
  for (int64_t i = 0; i < vocab; ++i) sum += std::exp(static_cast<double>(logits[i]) - most);
  const double log_z = static_cast<double>(most) + std::log(sum);
  auto logprob = [&](int64_t i) {
    return nan ? std::numeric_limits<float>::quiet_NaN() : static_cast<float>(static_cast<double>(logits[i]) - log_z);
  };
  TokenLogprob out;
  out.token = token;
  out.logprob = logprob(token);
  const int64_t k = std::min<int64_t>(std::max(top, 0), vocab);
  if (k == 0) return out;
  std::vector<int32_t> ids(static_cast<size_t>(vocab));
  for (int64_t i = 0; i < vocab; ++i) ids[static_cast<size_t>(i)] = static_cast<int32_t>(i);
  auto before = [&](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); };
  std::partial_sort(ids.begin(), ids.begin() + k, ids.end(), before);
  for (int64_t i = 0; i < k; ++i) out.top.push_back({ids[static_cast<size_t>(i)], logprob(ids[static_cast<size_t>(i)])});
  return out;
}

}  // namespace attn::serve
