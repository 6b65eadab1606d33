// Mechanism descriptions: small value types that say which keys each query sees and how
// scores become weights. Each has a text form shared by the CLI, benchmarks and Python:
//
//   softmax                         exact attention, scale 1/sqrt(d)
//   softmax:causal,window=128:0     causal, sliding window (left 128, right 0)
//   softmax:scale=0.1,softcap=30    user scale, tanh soft-capping
//   softmax:score=cosine            cosine-similarity scores
//   softmax:entropy_scale=512       scale log_512(n)/sqrt(d), n = visible keys of the row
//   softmax:dropout=0.1,seed=7      dropout on the weights
//
// Later mechanisms (sparse, linear, ...) join the std::variant below.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>

namespace attn {

enum class ScoreKind { dot, cosine, additive };

struct Softmax {
  bool causal = false;            // bottom-right aligned: query i sees keys j <= i + M - N
  ScoreKind score = ScoreKind::dot;
  std::optional<double> scale;    // none: 1/sqrt(d) for dot and cosine, 1 for additive
  int64_t entropy_train_len = 0;  // > 1: multiply the scale by log(n_i)/log(train_len)
  int64_t window_left = -1;       // -1: unbounded; query i sees j >= i + M - N - left
  int64_t window_right = -1;      // -1: unbounded; query i sees j <= i + M - N + right
  double softcap = 0.0;           // > 0: score = cap * tanh(score / cap)
  double dropout = 0.0;           // probability of dropping a weight, in [0, 1)
  uint64_t seed = 0;              // dropout seed

  bool operator==(const Softmax&) const = default;
};

using Mechanism = std::variant<Softmax>;

// Parses the text form; throws Error naming the offending token.
Mechanism parse_mechanism(std::string_view text);
// Canonical text form; parse_mechanism(to_string(m)) == m.
std::string to_string(const Mechanism& m);
std::string to_string(ScoreKind s);

}  // namespace attn
