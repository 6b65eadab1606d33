// Linformer's cases: low-rank projections along the sequence, seeded or as params.
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

void linformer_check_cases(std::vector<Case>& out) {
  for (DType dt : {DType::f32, DType::bf16})
    for (Layout lay : {Layout::bhnd, Layout::bnhd}) {
      Case c;
      c.B = 2, c.H = 4, c.Hkv = 2, c.N = 33, c.M = 70, c.D = 16, c.Dv = 8, c.dtype = dt, c.layout = lay;
      c.mechanism = "linformer:k=16,seed=3";
      out.push_back(c);
    }
  Case given = out.back();  // E and F as params (the backward mode checks their gradients too)
  given.extras.params = {"E", "F"}, given.extras.padding = true;
  out.push_back(given);
  Case c;
  c.B = 3, c.H = 2, c.Hkv = 1, c.N = 65, c.M = 129, c.D = 24, c.Dv = 24;
  c.mechanism = "linformer:k=100,seed=1,scale=0.2";  // k close to M
  c.extras.padding = true;
  out.push_back(c);
  c.stats_topk = 150;  // row statistics' top k beyond the k projected rows: the whole row
  out.push_back(c);
  c.N = 1, c.mechanism = "linformer:k=64";  // one query: the softmax rows form on the projections
  out.push_back(c);
  c.N = 7, c.M = 5, c.mechanism = "linformer:k=5,seed=2";  // k = M, the most rows that mean anything
  out.push_back(c);
}

void linformer_bad_cases(std::vector<BadCase>& out) {
  Case c;
  c.B = 1, c.H = 2, c.Hkv = 2, c.N = 5, c.M = 6, c.D = 8, c.Dv = 8, c.mechanism = "linformer:k=4";
  out.push_back({"probabilities", c, [](Inputs& in) { in.options.return_probs = true; },
                 "linformer returns no probabilities"});
  out.push_back({"alibi", c, [](Inputs& in) {
                   in.options.alibi_slopes = {1, 1}; }, "linformer does not take ALiBi slopes"});
  out.push_back({"unknown_form", c, [](Inputs& in) { in.options.form = "tiled"; },
                 "form must be one of projected, reference for linformer:k=4, got 'tiled'"});
  // sizes from the option are checked against the input before E, F (k x M) exist
  add_bad_text(out, c, "k_beyond_keys", "linformer:k=1048576",
               "linformer k must be in [1, M] (E K and F V have rank at most the key count M = 6), got k = 1048576");
  add_bad_text(out, c, "linformer_scale_overflows", "linformer:scale=3e38",
               "linformer scale must be in [1e-30, 1e+12], got 3e+38");
}

}  // namespace

void linformer_cases(FamilyCases& out) {
  linformer_check_cases(out.cases);
  linformer_bad_cases(out.bad);
}

}  // namespace attn::harness
