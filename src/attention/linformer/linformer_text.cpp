// Text form of Linformer:  linformer[:k=K,seed=N,scale=S]   (k defaults to 256)
#include "mechanism/family_text.hpp"

namespace attn::mechanism {

void read_options(OptionReader& r, Linformer& m) {
  m.k = r.integer("k").value_or(256);
  m.seed = r.unsigned_integer("seed").value_or(0);
  m.scale = r.number("scale");
}

void write_options(OptionWriter& w, const Linformer& m) {
  if (m.k != 256) w.integer("k", m.k);
  if (m.seed != 0) w.unsigned_integer("seed", m.seed);
  if (m.scale) w.number("scale", *m.scale);
}

}  // namespace attn::mechanism
