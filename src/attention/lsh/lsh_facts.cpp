// What Reformer's LSH attention is (core/facts.hpp): exact softmax over hashed chunks; the
// buckets move with every new key, so a cache keeps every row.
#include <string>

#include "lsh/lsh.hpp"

namespace attn::lsh {

core::Facts LshFamily::facts(const Lsh& m) {
  core::Facts f;
  f.causal = m.causal;
  f.can_be_causal = true;
  f.position_mask = m.causal;
  f.cache = CacheKind::kv;
  f.no_key_pattern = "its keys follow the hashed inputs: see lsh_buckets";
  f.params = params(m);
  f.symbols = {{"rounds", std::to_string(m.rounds)}, {"half", std::to_string(m.buckets / 2)}};
  f.ranges = ranges(m);
  f.limits = {"buckets even, in [2, min(65536, max(64, 2 M))]", "rounds in [1, 64]", "chunk >= 1", "N, M < 2^31",
              "shared_qk: N == M"};
  return f;
}

std::vector<core::OptionRange> LshFamily::ranges(const Lsh& m) { return {core::scale_range(m.scale)}; }

std::vector<core::ParamSpec> LshFamily::params(const Lsh&) {
  return {{"rotations", {"rounds", "D", "half"}, "random rotations, bucket = argmax([xR, -xR])", true, "normal:1"}};
}

}  // namespace attn::lsh
