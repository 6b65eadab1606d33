// What Linformer is (core/facts.hpp): its projection mixes every key, so it is never causal and
// a call cannot be continued (no cache).
#include <algorithm>
#include <cmath>
#include <string>

#include "linformer/linformer.hpp"

namespace attn::lowrank {

core::Facts LinformerFamily::facts(const Linformer& m) {
  core::Facts f;
  f.cache = CacheKind::none;
  f.no_key_pattern = "it attends to k projected rows, not to the keys";
  f.params = params(m);
  f.symbols = {{"k", std::to_string(m.k)}};
  f.ranges = ranges(m);
  f.limits = {"k in [1, min(M, 2^20)] (M: the key count)", "E and F both given or both drawn from the seed", "not causal"};
  return f;
}

std::vector<core::OptionRange> LinformerFamily::ranges(const Linformer& m) { return {core::scale_range(m.scale)}; }

std::vector<core::ParamSpec> LinformerFamily::params(const Linformer& m) {
  // Both given, or both drawn N(0, 1/k) from the seed.
  const std::string drawn = "normal:" + std::to_string(1.0 / std::sqrt(static_cast<double>(std::max<int64_t>(m.k, 1))));
  return {{"E", {"k", "M"}, "key projection along the sequence, K' = E K", true, drawn, true},
          {"F", {"k", "M"}, "value projection along the sequence, V' = F V", true, drawn, true}};
}

}  // namespace attn::lowrank
