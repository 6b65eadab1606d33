// Text form of Reformer's LSH attention:
//   lsh[:buckets=B,rounds=R,chunk=C,seed=N,causal,shared_qk,scale=S]   (32 buckets, 2 rounds, chunks of 64)
#include "mechanism/family_text.hpp"

namespace attn::mechanism {

void read_options(OptionReader& r, Lsh& m) {
  m.buckets = r.integer("buckets").value_or(32);
  m.rounds = r.integer("rounds").value_or(2);
  m.chunk = r.integer("chunk").value_or(64);
  m.seed = r.unsigned_integer("seed").value_or(0);
  m.causal = r.flag("causal");
  m.shared_qk = r.flag("shared_qk");
  m.scale = r.number("scale");
}

void write_options(OptionWriter& w, const Lsh& m) {
  if (m.buckets != 32) w.integer("buckets", m.buckets);
  if (m.rounds != 2) w.integer("rounds", m.rounds);
  if (m.chunk != 64) w.integer("chunk", m.chunk);
  if (m.seed != 0) w.unsigned_integer("seed", m.seed);
  if (m.causal) w.flag("causal");
  if (m.shared_qk) w.flag("shared_qk");
  if (m.scale) w.number("scale", *m.scale);
}

}  // namespace attn::mechanism
