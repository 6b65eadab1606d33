// What a mechanism is, as its family declares it: whether it is causal, what a decoder layer
// must keep for it (K/V rows, a recurrent state, nothing) and how many rows, its named
// parameters, forms, text grammar and limits. The model, cache, CLI, harness and Python ask this
// instead of re-deriving a family's rules.
//
//   attn::info(attn::parse_mechanism("softmax:causal,window=255:0,sinks=4"), 32768).cache_rows   // 260
//   attn::info(attn::parse_mechanism("linear:causal")).cache                                      // CacheKind::state
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "attn/mechanism.hpp"

namespace attn {

// What a decoder layer keeps between calls for a mechanism: K/V rows, a recurrent state of fixed
// size, or nothing (a mechanism that cannot be continued, e.g. Linformer's projection over all keys).
enum class CacheKind { kv, state, none };
std::string to_string(CacheKind c);

// A named parameter tensor a mechanism takes (AttendOptions::params).
struct ParamInfo {
  std::string name;
  // Dimensions as symbols or numbers: B, H (query heads), N, M, D, Dv; "state" dims are the
  // recurrent state's (attn::state_shape); other symbols (A) are free, bound by first use.
  std::vector<std::string> shape;
  std::string dtype = "float32";
  std::string meaning;
  bool optional = false;
  // How the test harness draws a valid value: "normal:S" (N(0, S^2)), "decay" (0.8 + 0.19 h / H
  // per head), "state" (normal, normalisers positive), "positive:S" (|N(0, S^2)| + 1),
  // "ones".
  std::string generate;
  // attend_backward returns its gradient when the call passes it (AttendGradients::dparams, or
  // d_initial_state for a linear family's initial_state).
  bool gradient = false;
};

struct MechanismInfo {
  std::string family;          // the kind ("softmax", "linear", ...)
  std::string text;            // canonical text form
  bool causal = false;         // each query sees only keys at or before its position
  bool can_be_causal = false;  // the family has a causal variant
  bool has_lse = false;        // weights are a softmax: a log-sum-exp is returned
  bool applies_positions = false;  // rotates q and k itself (DCA): a decoder must not apply RoPE
  bool position_mask = false;  // which keys a query sees depends on its position (causal, windows)
  CacheKind cache = CacheKind::none;
  // Rows of K/V a layer needs at `context` tokens: all of them, or a bound (window + sinks + the
  // query's own row, chunk); 0 for a state or no cache. attn's decoder keeps align - 1 + 32 rows
  // more (its compaction step and 32 queries per call: Decoder::layer_caches says what it holds).
  int64_t context = 0;
  int64_t cache_rows = 0;
  // The bound's parts (cache == kv): keys a query may see at most `lookback` positions back, plus
  // the first `sinks` keys; -1: unbounded. Rows may only be dropped in runs that keep
  // (position - sinks) mod `align` (the pattern's chunk) unchanged.
  int64_t lookback = -1, sinks = 0, align = 1;
  std::string state_shape;     // cache == state: the rule, e.g. "(B, H, D, Dv + 1)"
  // Why which keys a query sees is not fixed by the mechanism (LSH: they follow the hashed
  // inputs); empty when it is (attn::mask_of draws it).
  std::string no_key_pattern;
  std::vector<ParamInfo> params;
  std::vector<std::string> forms;   // in priority order
  std::string grammar;              // the text form: kind[:option,...]
  std::vector<std::string> limits;  // what the family refuses, in words (the ranges first)
  // The range of every float option of the text form, e.g. "scale in [1e-30, 1e+12]",
  // "power in (1, 10]": past it the option overflows float32 and is refused.
  std::vector<std::string> option_ranges;

  // Rows one layer keeps at `tokens` of context (kv: min(tokens, bound); else 0).
  int64_t rows_at(int64_t tokens) const;
  // One JSON object with every field above ("params": the names, "param_specs": each ParamInfo)
  // and "cache_bound" (rows kept at any context; -1: grows with it).
  std::string to_json() const;
};

// The facts of `mechanism`; `context` (tokens, >= 0) sets cache_rows.
MechanismInfo info(const Mechanism& mechanism, int64_t context = 0);
// One entry per family (its default mechanism), in the Mechanism variant's order: what
// `attn list --json` prints.
std::vector<MechanismInfo> family_infos();

}  // namespace attn
