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
//   softmax:causal,window=256:0,sinks=4   sliding window keeping the first 4 keys (StreamingLLM)
//   softmax:causal,dilation=4       dilated (atrous): distances that are multiples of 4
//   softmax:causal,strided=64       Sparse Transformer: the last 64 keys and every 64th
//   softmax:chunk=512               block-diagonal: attend within chunks of 512 positions
//   longformer:window=128:128,global=0;17;33   window + global tokens
//   bigbird:block=64,window=3,global=2,random=3,seed=7   BigBird's block pattern
//   linformer:k=256,seed=1          keys and values projected to 256 rows (low rank)
//   lsh:buckets=32,rounds=2,chunk=64,seed=1   Reformer: hash, sort by bucket, attend in chunks
//   dca:chunk=4096,local=1024,theta=10000     Dual Chunk Attention (RoPE applied inside)
//   linear:map=elu,causal,chunk=64  linear attention, phi(q).phi(k) weights, O(N d^2)
//   linear:map=identity,causal,normalize=0,decay=0.97   retention (alias: retention:decay=0.97)
//   normattn:map=elu,norm=rms       TransNormer: no denominator, the output RMS-normalised
//   performer:features=256,seed=1   FAVOR+ random features estimating softmax attention
//   sana                            SANA's ReLU linear attention (eps 1e-15 in the denominator)
//   polaformer:power=3              PolaFormer: same- and opposite-sign streams, sharpened by a power
//   efficient                       efficient attention: softmax of q over features, of k over tokens
//   gau:bias=0,causal               GAU's relu^2(q.k/sqrt(d) + b)/n weights (quadratic)
//   qsoftmax:causal                 linear attention with softmax(q) over features, raw keys
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
#include <vector>

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
  // Sparsity patterns (positions p = i + M - N; src/mask/pattern.hpp has the exact rules):
  int64_t sinks = 0;              // keys j < sinks stay visible to every query (causal still applies)
  int64_t dilation = 1;           // inside the window, only keys with (p - j) mod dilation = 0
  int64_t strided = 0;            // > 0: inside the window, |p - j| <= strided or (p - j) mod strided = 0
  int64_t chunk = 0;              // > 0: query and key in the same chunk of this many positions

  bool operator==(const Softmax&) const = default;
};

// Longformer (Beltagy et al. 2020): a sliding window (optionally dilated) plus global
// positions that see every key and are seen by every query. Exact softmax over that pattern.
struct Longformer {
  static constexpr std::string_view kind = "longformer";
  int64_t window_left = 256, window_right = 256;  // text: window=LEFT:RIGHT
  int64_t dilation = 1;
  std::vector<int64_t> global;    // text: global=0;17;33
  bool causal = false;
  std::optional<double> scale;    // none: 1/sqrt(d)

  bool operator==(const Longformer&) const = default;
};

// BigBird (Zaheer et al. 2020): positions in blocks of `block`; each query block sees `window`
// blocks around its own, the first `global` blocks (which also see everything) and `random`
// key blocks drawn per query block from `seed` (reproducible). Exact softmax over that pattern.
struct BigBird {
  static constexpr std::string_view kind = "bigbird";
  int64_t block = 64;
  int64_t window = 3;             // odd: the block itself and (window - 1) / 2 on each side
  int64_t global = 2;
  int64_t random = 3;
  uint64_t seed = 0;
  bool causal = false;
  std::optional<double> scale;    // none: 1/sqrt(d)

  bool operator==(const BigBird&) const = default;
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

// Reformer's LSH attention (Kitaev et al. 2020). Per round, q and k are hashed by a random
// rotation R (D, buckets/2): bucket(x) = argmax([xR, -xR]); queries and keys are each sorted by
// (bucket, position) and cut into chunks of `chunk`; query chunk c sees key chunks c and c - 1.
// A query sees the union over rounds (each key once: rounds merge through their log-sum-exp
// with every pair counted in the first round that has it). shared_qk: keys hashed from the
// queries (q and k are the same tokens, N = M), and a token sees itself only when it sees
// nothing else. R comes from the named param "rotations" (rounds, D, buckets/2) or from `seed`.
// Keys past a batch's valid length take no part in the sort.
struct Lsh {
  static constexpr std::string_view kind = "lsh";
  int64_t buckets = 32;           // even, >= 2
  int64_t rounds = 2;
  int64_t chunk = 64;
  uint64_t seed = 0;
  bool causal = false;
  bool shared_qk = false;
  std::optional<double> scale;    // none: 1/sqrt(d)

  bool operator==(const Lsh&) const = default;
};

// Dual Chunk Attention (An et al. 2024): training-free context extension of a RoPE model. q and
// k arrive without RoPE; positions are cut into chunks of `chunk` (s) and every key is rotated
// to its position inside its chunk, j mod s. The query is rotated three ways: inside its own
// chunk at i mod s (intra), against the chunk just before at min(s + i mod s, s + local - 1)
// (successive: true distances for the first `local` queries of a chunk), and against earlier
// chunks at s + local - 1 (inter). One softmax over all three (merged through their
// log-sum-exp), causal. With chunk >= the sequence it is causal RoPE attention.
struct Dca {
  static constexpr std::string_view kind = "dca";
  int64_t chunk = 4096;
  int64_t local = 1024;
  double theta = 10000.0;         // RoPE base
  bool interleaved = false;       // RoPE pairs (2c, 2c+1); default rotate-half (c, c + D/2)
  std::optional<double> scale;    // none: 1/sqrt(d)

  bool operator==(const Dca&) const = default;
};

// Feature maps of linear attention, applied to each q and k row: elu(x) + 1, max(x, 0), x,
// exp(x), max(x, 0)^2.
enum class FeatureMap { elu, relu, identity, exp, relu2 };

// Linear attention (Katharopoulos et al. 2020 and its relatives): weights
//   w_ij = scale * phi(q_i) . phi(k_j) * decay^(i - j)      (decay only when causal)
// over the keys the query sees (all of them, or j <= i when causal), and
//   o_i = sum_j w_ij v_j / sum_j w_ij     (normalize; a zero denominator gives a zero row)
//   o_i = sum_j w_ij v_j                  (normalize=0)
// Computed without the N x M matrix: the state S = sum_j phi(k_j) [v_j, 1]^T (F x (Dv + 1),
// the last column the normaliser z; F x Dv without normalize) is built once (non-causal) or
// carried along the sequence (causal: S_i = decay S_(i-1) + phi(k_i) [v_i, 1]^T). The state
// can be passed in (named param "initial_state", (B, H, F, Dv [+ 1])) and returned
// (AttendOptions::return_final_state), so a sequence split into calls equals one call and a
// new token costs O(F Dv) whatever its position. Per-head decays: named param "decay" (H).
// Causal calls take as many queries as keys (each token brings q, k and v).
struct Linear {
  static constexpr std::string_view kind = "linear";
  FeatureMap map = FeatureMap::elu;
  bool causal = false;
  bool normalize = true;
  std::optional<double> decay;    // in (0, 1]; needs causal
  int64_t chunk = 64;             // rows per block of the chunked (Lightning) form
  std::optional<double> scale;    // none: 1

  bool operator==(const Linear&) const = default;
};

// TransNormer's NormAttention (Qin et al. 2022): linear attention without the denominator, the
// output normalised instead (RMSNorm or LayerNorm over its Dv channels, no affine, eps 1e-6).
enum class OutputNorm { none, rms, layer };
struct NormAttn {
  static constexpr std::string_view kind = "normattn";
  FeatureMap map = FeatureMap::elu;
  OutputNorm norm = OutputNorm::rms;  // rms or layer
  bool causal = false;
  std::optional<double> decay;    // in (0, 1]; needs causal
  int64_t chunk = 64;

  bool operator==(const NormAttn&) const = default;
};

// Performer's FAVOR+ (Choromanski et al. 2021): positive random features
//   phi(x) = exp(w_f . x' - |x'|^2 / 2) / sqrt(m),  x' = x d^(-1/4),  f < m = features
// so that phi(q) . phi(k) estimates exp(q . k / sqrt(d)) and the normalised linear attention
// estimates softmax attention. The rows w_f come in blocks of d orthonormal rows (Gram-Schmidt
// of a Gaussian matrix: R's diagonal is positive, so each block is Haar-distributed), each row
// rescaled to the norm of an independent Gaussian vector; drawn from `seed`, or given as the
// named param "omega" (features, d). Queries are shifted by their row maximum (it cancels in the
// normalisation); keys are not (their shift would not cancel across calls with a state).
struct Performer {
  static constexpr std::string_view kind = "performer";
  int64_t features = 256;
  uint64_t seed = 0;
  bool causal = false;
  int64_t chunk = 64;

  bool operator==(const Performer&) const = default;
};

// SANA's ReLU linear attention (Xie et al. 2024, LiteLA): relu features, normalised with eps
// added to the denominator: o_i = sum_j (relu(q_i).relu(k_j)) v_j / (sum_j relu(q_i).relu(k_j) + eps).
struct Sana {
  static constexpr std::string_view kind = "sana";
  bool causal = false;
  double eps = 1e-15;
  int64_t chunk = 64;

  bool operator==(const Sana&) const = default;
};

// PolaFormer (Meng et al. 2025): q and k split into positive and negative parts raised to a
// per-channel power p > 1 (sharper, lower-entropy weights), x+ = relu(x)^p, x- = relu(-x)^p.
// Two normalised linear-attention streams, each on half of the value channels:
//   same-sign      phi(q) = [q+, q-], psi(k) = [k+, k-]   -> o[:, :Dv/2]
//   opposite-sign  phi(q) = [q+, q-], psi(k) = [k-, k+]   -> o[:, Dv/2:]
// each output channel then scaled by a coefficient. Named params (optional): "power" (D) per
// channel (default: `power` everywhere) and "coefficients" (Dv) (default 1). The state holds both
// streams: (B, H, 4 D, Dv / 2 + 1), the same-sign stream's 2 D rows first.
struct PolaFormer {
  static constexpr std::string_view kind = "polaformer";
  double power = 3.0;
  bool causal = false;
  int64_t chunk = 64;

  bool operator==(const PolaFormer&) const = default;
};

// Efficient attention (Shen et al. 2021): the query's features softmax-normalised over the head
// dim, the keys' over the sequence, nothing else normalised:
//   o_i = scale * sum_f softmax_f(q_i)[f] * sum_j softmax_j(k_j[f]) v_j
// over the keys the query sees (all of them; causal: j <= i, the key softmax then runs over the
// prefix). Padded keys take no part in the key softmax. Its state is per feature f: the context
// C_f = sum_j e^(k_j[f] - m_f) v_j / z_f, the sum z_f = sum_j e^(k_j[f] - m_f) and the running
// maximum m_f: (B, H, D, Dv + 2) = [C | z | m] (z = 0: no tokens yet).
struct Efficient {
  static constexpr std::string_view kind = "efficient";
  bool causal = false;
  std::optional<double> scale;    // none: 1/sqrt(d)

  bool operator==(const Efficient&) const = default;
};

// GAU / FLASH's squared-ReLU attention (Hua et al. 2022): un-normalised weights
//   a_ij = relu(scale * q_i . k_j + bias)^2 / n,   n = the batch entry's valid key count
// over the keys the query sees (all, or j <= i + M - N when causal). No factorisation: a
// quadratic family (tiled products, no N x M buffer) with a float64 reference.
struct Gau {
  static constexpr std::string_view kind = "gau";
  double bias = 0.0;
  bool causal = false;
  std::optional<double> scale;    // none: 1/sqrt(d)

  bool operator==(const Gau&) const = default;
};

// A linear-attention variant, softmax(Q) (K^T V): efficient attention (above) with its key
// softmax left out. The query's features softmax-normalised, the keys raw, no denominator,
//   o_i = scale * sum_f softmax_f(q_i)[f] * sum_j k_j[f] v_j
// over the keys the query sees (all; causal: j <= i). Its state is S = sum_j k_j v_j^T, (B, H, D,
// Dv); named param "initial_state" continues a sequence.
struct QSoftmax {
  static constexpr std::string_view kind = "qsoftmax";
  bool causal = false;
  std::optional<double> scale;    // none: 1 (the form has no scale)

  bool operator==(const QSoftmax&) const = default;
};

// The families. The model issues append theirs.
using Mechanism = std::variant<Softmax, Longformer, BigBird, Linformer, Lsh, Dca, Linear, NormAttn, Performer, Sana, PolaFormer, Efficient, Gau, QSoftmax>;

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
std::string to_string(FeatureMap f);
std::string to_string(OutputNorm n);
// The family's kind ("softmax").
std::string_view kind_of(const Mechanism& m);
// Every family's kind, in variant order ("softmax").
std::string known_kinds();

}  // namespace attn
