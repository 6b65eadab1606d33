// Text form of Dual Chunk Attention:
//   dca[:chunk=S,local=W,theta=T,interleaved,scale=X]   (chunks of 4096, local 1024, theta 10000)
#include "mechanism/family_text.hpp"

namespace attn::mechanism {

void read_options(OptionReader& r, Dca& m) {
  m.chunk = r.integer("chunk").value_or(4096);
  m.local = r.integer("local").value_or(1024);
  m.theta = r.number("theta").value_or(10000.0);
  m.interleaved = r.flag("interleaved");
  m.scale = r.number("scale");
}

void write_options(OptionWriter& w, const Dca& m) {
  if (m.chunk != 4096) w.integer("chunk", m.chunk);
  if (m.local != 1024) w.integer("local", m.local);
  if (m.theta != 10000.0) w.number("theta", m.theta);
  if (m.interleaved) w.flag("interleaved");
  if (m.scale) w.number("scale", *m.scale);
}

}  // namespace attn::mechanism
