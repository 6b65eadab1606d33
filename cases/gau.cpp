// GAU: squared-ReLU weights (quadratic, tiled).
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

void gau_check_cases(std::vector<Case>& out) {
  const char* mechs[] = {"gau", "gau:bias=0.5,causal", "gau:bias=-0.2,scale=0.5", "gau:causal,bias=1"};
  int k = 0;
  for (const char* mech : mechs) {
    ++k;
    Case c;  // straddling the 64-query and 64-key blocks, grouped heads, each dtype and layout
    c.mechanism = mech;
    c.B = 2, c.H = 4, c.Hkv = 2, c.N = 131, c.M = k % 2 ? 131 : 70, c.D = 16, c.Dv = 24;
    c.dtype = k % 3 == 0 ? DType::bf16 : k % 3 == 1 ? DType::f32 : DType::f16;
    c.layout = k % 2 ? Layout::bhnd : Layout::bnhd;
    out.push_back(c);
    Case pad = c;
    pad.B = 3, pad.N = 65, pad.M = 129, pad.dtype = DType::f32, pad.extras.padding = true, pad.extras.pad = 2;
    out.push_back(pad);
  }
  for (int64_t k : {1, 200}) {  // top-k of the rows at its edges; causal: the diagonal tiles' short rows
    Case top = small_case();
    top.mechanism = "gau:causal,bias=0.3", top.N = top.M = 140, top.stats_topk = k;
    out.push_back(top);
  }
}

}  // namespace

void gau_cases(FamilyCases& out) {
  gau_check_cases(out.cases);
}

}  // namespace attn::harness
