// Efficient attention: a softmax of the keys per feature over the sequence.
#include <algorithm>
#include <cctype>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "harness/case.hpp"
#include "harness/inputs.hpp"

namespace attn::harness {
namespace {

void efficient_check_cases(std::vector<Case>& out) {
  const char* mechs[] = {"efficient", "efficient:causal", "efficient:scale=0.5", "efficient:causal,scale=2"};
  int k = 0;
  for (const char* mech : mechs) {
    ++k;
    const bool causal = std::string(mech).find("causal") != std::string::npos;
    Case c;
    c.mechanism = mech;
    c.B = 2, c.H = 4, c.Hkv = 2, c.N = 131, c.M = causal ? 131 : 70, c.D = 16, c.Dv = 24;
    c.dtype = k % 3 == 0 ? DType::bf16 : k % 3 == 1 ? DType::f32 : DType::f16;
    c.layout = k % 2 ? Layout::bhnd : Layout::bnhd;
    c.extras.magnitude = 3.0f;  // wide key softmaxes: the running maximum matters
    out.push_back(c);
    Case st = c;  // a state passed in, padded keys, strided rows
    st.B = 3, st.H = 2, st.Hkv = 1, st.N = st.M = 40, st.D = 8, st.Dv = 8, st.dtype = DType::f32;
    st.extras.params = {"initial_state"}, st.extras.padding = true, st.extras.pad = 3;
    out.push_back(st);
    st.N = st.M = 1, st.extras.padding = false;  // one token against a state
    out.push_back(st);
  }
  for (const char* mech : {"efficient", "efficient:causal"})
    for (int64_t k : {1, 200}) {  // top-k at its edges; causal: several blocks, each with its diagonal tile
      Case top = small_case();
      top.mechanism = mech, top.N = top.M = 140, top.stats_topk = k, top.extras.magnitude = 3.0f;
      top.extras.padding = k == 1;
      out.push_back(top);
    }
}

}  // namespace

void efficient_cases(FamilyCases& out) {
  efficient_check_cases(out.cases);
}

}  // namespace attn::harness
