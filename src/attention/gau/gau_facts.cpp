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
  f.ranges = ranges(m);
  f.limits = {"no named params", "only causal and key padding as masks"};
  return f;
}

std::vector<core::OptionRange> GauFamily::ranges(const Gau& m) {
  // relu(scale q.k + bias)^2: bias^2 and scale^2 |q.k|^2 must stay finite in float32
  return {{"bias", m.bias, -1e12, 1e12, false, false, ""}, core::scale_range(m.scale)};
}

}  // namespace attn::gau
