// Text form: qsoftmax[:causal,scale=S]
#include "mechanism/family_text.hpp"

namespace attn::mechanism {

void read_options(OptionReader& r, QSoftmax& m) {
  m.causal = r.flag("causal");
  m.scale = r.number("scale");
}

void write_options(OptionWriter& w, const QSoftmax& m) {
  if (m.causal) w.flag("causal");
  if (m.scale) w.number("scale", *m.scale);
}

}  // namespace attn::mechanism
