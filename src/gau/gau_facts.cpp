// What GAU's squared-ReLU attention is (core/facts.hpp): quadratic, normalised by the valid key
// count, so a cache keeps every row.
#include "gau/gau.hpp"

namespace attn::gau {

core::Facts GauFamily::facts(const Gau& m) {
  core::Facts f;
  f.causal = m.causal;
  f.can_be_causal = true;
  f.position_mask = m.causal;
  f.cache = CacheKind::kv;
  f.limits = {"no named params", "only causal and key padding as masks", "scale > 0"};
  return f;
}

}  // namespace attn::gau
