// The snippet's linear attention in the one case list (compiled into the harness, not the
// library): every form against the float64 reference, states passed in and returned, padded keys,
// strided rows, half types, GQA, one token against a state, and its bad inputs.
#include "harness/case.hpp"
#include "harness/inputs.hpp"

namespace attn::harness {

void qsoftmax_cases(FamilyCases& out) {
  int k = 0;
  for (const char* mech : {"qsoftmax", "qsoftmax:causal", "qsoftmax:scale=0.5", "qsoftmax:causal,scale=2"}) {
    ++k;
    const bool causal = std::string(mech).find("causal") != std::string::npos;
    Case c;
    c.mechanism = mech;
    c.B = 2, c.H = 4, c.Hkv = 2, c.N = 131, c.M = causal ? 131 : 70, c.D = 16, c.Dv = 24;
    c.dtype = k % 3 == 0 ? DType::bf16 : k % 3 == 1 ? DType::f32 : DType::f16;
    c.layout = k % 2 ? Layout::bhnd : Layout::bnhd;
    c.extras.magnitude = 3.0f;  // peaked feature softmaxes
    out.cases.push_back(c);
    Case st = c;  // a state passed in, padded keys, strided rows
    st.B = 3, st.H = 2, st.Hkv = 1, st.N = st.M = 40, st.D = 8, st.Dv = 8, st.dtype = DType::f32;
    st.extras.params = {"initial_state"}, st.extras.padding = true, st.extras.pad = 3;
    out.cases.push_back(st);
    st.N = st.M = 1, st.extras.padding = false;  // one token against a state: decoding
    out.cases.push_back(st);
  }
  for (const char* mech : {"qsoftmax", "qsoftmax:causal"}) {  // odd sizes: D = 7, Dv = 5, three heads on one kv head
    Case odd;
    odd.mechanism = mech;
    odd.B = 2, odd.H = 3, odd.Hkv = 1, odd.D = 7, odd.Dv = 5;
    odd.N = 65, odd.M = std::string(mech) == "qsoftmax" ? 47 : 65;
    odd.extras.magnitude = 3.0f, odd.extras.padding = true;
    out.cases.push_back(odd);
  }
  Case top;  // row statistics at the top-k's edges
  top.mechanism = "qsoftmax:causal", top.N = top.M = 70, top.D = top.Dv = 8, top.stats_topk = 1;
  out.cases.push_back(top);
  top.mechanism = "qsoftmax", top.stats_topk = 100, top.extras.padding = true;
  out.cases.push_back(top);

  out.demo.push_back({"softmax(q) linear attention, raw keys (the snippet)", "qsoftmax:causal"});

  Case bad;
  bad.N = 5, bad.M = 6, bad.D = bad.Dv = 8;
  bad.mechanism = "qsoftmax:causal";
  out.bad.push_back({"qsoftmax_causal_needs_square", bad, [](Inputs&) {}, "so N (queries) must equal M (keys), got N = 5, M = 6"});
  bad.mechanism = "qsoftmax", bad.extras.mask = true;
  out.bad.push_back({"qsoftmax_mask", bad, [](Inputs&) {}, "qsoftmax does not take a boolean mask"});
  bad.extras.mask = false;
  Case scale = bad;
  scale.mechanism = "qsoftmax:scale=3e38";  // class 6: refused, it would overflow the feature softmax
  out.bad.push_back({"qsoftmax_scale_overflows", scale, [](Inputs&) {}, "qsoftmax scale must be in [1e-30, 1e+12], got 3e+38"});
  out.bad.push_back({"qsoftmax_lse", bad, [](Inputs& in) { in.options.return_lse = true; },
                     "qsoftmax has no log-sum-exp (its weights are not a softmax)"});
}

}  // namespace attn::harness
