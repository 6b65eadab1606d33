// Dual Chunk Attention: intra-, successive- and inter-chunk parts.
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

void dca_check_cases(std::vector<Case>& out) {
  const char* mechs[] = {"dca:chunk=16,local=4", "dca:chunk=24,local=24,theta=500,interleaved",
                         "dca:chunk=64,local=40", "dca:chunk=5,local=2,scale=0.3"};
  int k = 0;
  for (const char* mech : mechs) {
    ++k;
    Case c;
    c.mechanism = mech;
    c.B = 2, c.H = 4, c.Hkv = 2, c.N = 131, c.M = 131, c.D = 32, c.Dv = 24;
    c.dtype = k % 3 == 0 ? DType::bf16 : k % 3 == 1 ? DType::f32 : DType::f16;
    c.layout = k % 2 ? Layout::bhnd : Layout::bnhd;
    c.extras.magnitude = 2.0f;  // RoPE turns scores: larger ones make a wrong position show
    out.push_back(c);
    if (k == 1) {  // row statistics merged over the three parts, top k over all of them and more
      for (int64_t top : {1, 40, 200}) {
        Case t = c;
        t.stats_topk = top;
        out.push_back(t);
      }
    }
    Case odd = c;  // a cache longer than the queries, padding, a mask or a bias on top
    odd.B = 3, odd.H = 2, odd.Hkv = 1, odd.N = 70, odd.M = 200, odd.D = 16, odd.Dv = 16, odd.dtype = DType::f32;
    odd.extras.padding = true, odd.extras.mask = k % 2 == 0, odd.extras.bias = k % 2 == 1;
    out.push_back(odd);
    Case decode = c;  // a few queries: the rows form inside each part
    decode.B = 2, decode.H = 8, decode.Hkv = 2, decode.N = k % 2 ? 1 : 3, decode.M = 300, decode.D = 16, decode.Dv = 16;
    decode.extras.padding = true;
    out.push_back(decode);
  }
  Case odd;  // odd sizes (three query heads on one kv head, D = 10, Dv = 7, 67 tokens, chunks of 9)
  odd.mechanism = "dca:chunk=9,local=4,theta=300";
  odd.B = 1, odd.H = 3, odd.Hkv = 1, odd.N = odd.M = 67, odd.D = 10, odd.Dv = 7;
  odd.extras.magnitude = 2.0f;
  out.push_back(odd);
}

void dca_bad_cases(std::vector<BadCase>& out) {
  Case c = small_case();
  auto add = [&](const char* name, const char* mech, const char* message) { add_bad_text(out, c, name, mech, message); };
  add("dca_local_beyond_chunk", "dca:chunk=8,local=9", "dca local must be in [1, chunk = 8], got 9");
  add("dca_theta", "dca:theta=1", "dca theta must be in (1, 1e+30], got 1");
  add("dca_theta_overflows", "dca:theta=1e300", "dca theta must be in (1, 1e+30], got 1e+300");
  add("dca_scale_overflows", "dca:scale=3e38", "dca scale must be in [1e-30, 1e+12], got 3e+38");
  c.D = 7;
  add("dca_odd_head_dim", "dca:chunk=4,local=2", "dca needs an even head dim (RoPE rotates pairs of channels), got D = 7");
  c.D = 8;
  c.mechanism = "dca";
  out.push_back({"dca_alibi", c, [](Inputs& in) { in.options.alibi_slopes = {1, 1}; },
                 "dca does not take ALiBi slopes"});
  Case int8 = c;  // its reference form once returned the rows' raw integers
  int8.extras.int8_kv = true;
  out.push_back({"dca_int8_rows", int8, [](Inputs&) {}, "dca takes float k and v"});
}

}  // namespace

void dca_cases(FamilyCases& out) {
  dca_check_cases(out.cases);
  dca_bad_cases(out.bad);
}

}  // namespace attn::harness
