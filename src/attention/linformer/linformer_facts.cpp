// What Linformer is (core/facts.hpp): its projection mixes every key, so it is never causal and
// a call cannot be continued (no cache).
#include <cmath>
#include <string>

#include "linformer/linformer.hpp"

namespace attn::lowrank {

core::Facts LinformerFamily::facts(const Linformer& m) {
  core::Facts f;
  f.cache = CacheKind::none;
  f.no_key_pattern = "it attends to k projected rows, not to the keys";
  // Both given, or both drawn N(0, 1/k) from the seed.
  const std::string drawn = "normal:" + std::to_string(1.0 / std::sqrt(static_cast<double>(std::max<int64_t>(m.k, 1))));
  f.params = {{"E", {"k", "M"}, "key projection along the sequence, K' = E K", true, drawn, true},
              {"F", {"k", "M"}, "value projection along the sequence, V' = F V", true, drawn, true}};
  f.symbols = {{"k", std::to_string(m.k)}};
  f.ranges = {core::scale_range(m.scale)};
  f.limits = {"k in [1, min(M, 2^20)] (M: the key count)", "E and F both given or both drawn from the seed", "not causal"};
  return f;
}

}  // namespace attn::lowrank
