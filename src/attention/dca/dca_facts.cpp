// What Dual Chunk Attention is (core/facts.hpp): causal by construction, it rotates q and k
// itself (a decoder applies no RoPE before it), and its inter-chunk part reads every key.
#include "dca/dca.hpp"

namespace attn::dca {

core::Facts DcaFamily::facts(const Dca& m) {
  core::Facts f;
  f.causal = true;
  f.can_be_causal = true;
  f.applies_positions = true;
  f.position_mask = true;
  f.cache = CacheKind::kv;
  f.ranges = ranges(m);
  f.limits = {"chunk in [1, 2^39]", "local in [1, chunk]", "even head dim", "no params, no ALiBi"};
  return f;
}

std::vector<core::OptionRange> DcaFamily::ranges(const Dca& m) {
  // theta: RoPE's base; frequencies theta^(-2i/D) stay normal float32 up to 1e30
  return {{"theta", m.theta, 1, 1e30, true, false, ""}, core::scale_range(m.scale)};
}

}  // namespace attn::dca
