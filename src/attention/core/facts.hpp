// What a family declares about each of its mechanisms, in one place: the facts attn::info
// returns (include/attn/info.hpp) and that the decoder, caches, CLI, harness and Python read
// instead of re-deriving a family's rules. A family provides, for each mechanism M it serves,
//   static core::Facts facts(const M& m);
//   static std::vector<core::OptionRange> ranges(const M& m);   what facts(m).ranges holds
// (the ranges alone are for validation: every attend call checks them, without building the rest
// of the facts); the concept below checks both where the family table (src/families/table.hpp) is
// built.
#pragma once
#include <concepts>
#include <map>
#include <string>
#include <vector>

#include "attn/info.hpp"
#include "core/option_range.hpp"
#include "core/params.hpp"

namespace attn::core {

struct Facts {
  bool causal = false;
  bool can_be_causal = false;
  bool applies_positions = false;  // rotates q and k itself (no RoPE before it)
  bool position_mask = false;      // causal or a sliding window: queries are rotated per token in caches
  CacheKind cache = CacheKind::none;
  // cache == kv: a query sees at most `lookback` positions back plus the first `sinks` keys
  // (-1: unbounded); dropped rows keep (position - sinks) mod align.
  int64_t lookback = -1, sinks = 0, align = 1;
  std::string state_shape;         // cache == state: "(B, H, F, Dv + 1)"
  std::string no_key_pattern;      // why the keys a query sees are not fixed (LSH, Linformer); empty: they are
  std::vector<ParamSpec> params;   // every named parameter the mechanism takes
  // What the params' symbols are for this mechanism ("k" -> "256", "F" -> "D"); B, H, N, M, D
  // and Dv stay symbols, others not listed are free (bound by the first parameter using them).
  std::map<std::string, std::string> symbols;
  std::vector<std::string> limits;
  // Every float option of the text form with its range: the family's ranges(m) (one place:
  // validation checks these, attn::info lists them before `limits`).
  std::vector<OptionRange> ranges;
};

// Whether check_params (core/params.hpp) has anything to report for an empty params map: a
// required param missing. Families whose params are all optional call check_params only when some
// are given (building no ParamSpec list per call otherwise) and assert this in debug builds.
inline bool none_required(const std::vector<ParamSpec>& specs) {
  for (const ParamSpec& s : specs)
    if (!s.optional) return false;
  return true;
}

template <class Family, class M>
concept DeclaresFacts = requires(const M& m) {
  { Family::facts(m) } -> std::same_as<Facts>;
  { Family::ranges(m) } -> std::same_as<std::vector<OptionRange>>;
};

}  // namespace attn::core
