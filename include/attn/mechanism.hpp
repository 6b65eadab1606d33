// Mechanism descriptions: small value types, one per family, that say which keys each query
// sees and how scores become weights. Each family has a text form shared by the CLI, the
// benchmarks and Python:  <kind>[:<option>(,<option>)*]
//
//   softmax                         exact attention, scale 1/sqrt(d)
//   softmax:causal,window=128:0     causal, sliding window (left 128, right 0)
//   softmax:scale=0.1,softcap=30    user scale, tanh soft-capping
//   softmax:score=cosine            cosine-similarity scores
//   softmax:entropy_scale=512       scale log_512(n)/sqrt(d), n = visible keys of the row
//   softmax:dropout=0.1,seed=7      dropout on the weights
//   linformer:k=256,seed=1          keys and values projected to 256 rows (low rank)
//
// A family is a struct with `static constexpr std::string_view kind`, an alternative of the
// Mechanism variant, and a text parser/printer beside its kernels (src/exact/softmax_text.cpp
// for Softmax). Every visit over Mechanism is exhaustive (use `overloaded`), so a new family
// that some place does not handle is a compile error, not a silent no-op.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>

namespace attn {

enum class ScoreKind { dot, cosine, additive };

// Exact softmax attention and its score/mask options.
struct Softmax {
  static constexpr std::string_view kind = "softmax";
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

// Linformer (Wang et al. 2020): keys and values projected along the sequence, K' = E K and
// V' = F V with E, F of shape (k, M), then exact softmax attention against the k rows. E and F
// come from the named params "E" and "F", or are drawn N(0, 1/k) from `seed` (the same for
// every batch and head). Key padding zeroes the projection's columns of padded keys.
struct Linformer {
  static constexpr std::string_view kind = "linformer";
  int64_t k = 256;                // projected length
  uint64_t seed = 0;              // for E and F when they are not given
  std::optional<double> scale;    // none: 1/sqrt(d)

  bool operator==(const Linformer&) const = default;
};

// The families. The sparse, linear and model issues append theirs.
using Mechanism = std::variant<Softmax, Linformer>;

// For exhaustive visits: std::visit(overloaded{[](const Softmax&) {...}, ...}, mechanism).
template <class... Fs>
struct overloaded : Fs... {
  using Fs::operator()...;
};
template <class... Fs>
overloaded(Fs...) -> overloaded<Fs...>;

// Parses the text form; throws Error naming the offending token. Strict: an option given twice,
// an unknown option, or a number not in plain decimal is an error.
Mechanism parse_mechanism(std::string_view text);
// Canonical text form; parse_mechanism(to_string(m)) == m.
std::string to_string(const Mechanism& m);
std::string to_string(ScoreKind s);
// The family's kind ("softmax").
std::string_view kind_of(const Mechanism& m);
// Every family's kind, in variant order ("softmax").
std::string known_kinds();

}  // namespace attn
