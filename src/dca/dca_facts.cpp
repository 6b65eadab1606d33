// What Dual Chunk Attention is (core/facts.hpp): causal by construction, it rotates q and k
// itself (a decoder applies no RoPE before it), and its inter-chunk part reads every key.
#include "dca/dca.hpp"

namespace attn::dca {

core::Facts DcaFamily::facts(const Dca&) {
  core::Facts f;
  f.causal = true;
  f.can_be_causal = true;
  f.applies_positions = true;
  f.position_mask = true;
  f.cache = CacheKind::kv;
  f.limits = {"chunk in [1, 2^39]", "local in [1, chunk]", "theta > 1", "even head dim", "no params, no ALiBi"};
  return f;
}

}  // namespace attn::dca
