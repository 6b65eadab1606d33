// Sparse patterns (exact softmax over a block mask: windows, sinks, dilation, strides, chunks,
// Longformer, BigBird) against the dense-mask reference, and their bad pattern texts.
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

// Against the dense-mask reference (Problem::visible, the pattern's definition), on odd sizes,
// N < M, N > M, every dtype and layout, padding and the boolean mask on top, decode shapes
// (the rows form walks the same block mask), and rows vs tiled.
void sparse_check_cases(std::vector<Case>& out) {
  const char* patterns[] = {
      "softmax:causal,window=20:0,sinks=4", "softmax:causal,dilation=4",     "softmax:causal,window=40:0,dilation=2",
      "softmax:causal,strided=16",          "softmax:strided=9",             "softmax:chunk=32",
      "softmax:causal,chunk=48",            "softmax:dilation=3,window=30:30", "longformer:window=8:8,global=0;17;33",
      "longformer:window=12:0,dilation=2,global=5;70,causal", "bigbird:block=16,window=3,global=1,random=2,seed=7",
      "bigbird:block=8,window=1,global=0,random=3,seed=2,causal",
  };
  int k = 0;
  for (const char* mech : patterns) {
    ++k;
    Case c;
    c.mechanism = mech;
    c.B = 2, c.H = 4, c.Hkv = 2, c.N = 131, c.M = 131, c.D = 32, c.Dv = 24;
    c.dtype = k % 3 == 0 ? DType::bf16 : k % 3 == 1 ? DType::f32 : DType::f16;
    c.layout = k % 2 ? Layout::bhnd : Layout::bnhd;
    out.push_back(c);
    Case odd = c;  // more keys than queries, padding and a boolean mask on top
    odd.B = 3, odd.H = 2, odd.Hkv = 1, odd.N = 70, odd.M = 200, odd.D = 16, odd.Dv = 16, odd.dtype = DType::f32;
    odd.extras.padding = true, odd.extras.mask = k % 2 == 0;
    out.push_back(odd);
    Case tall = c;  // more queries than keys
    tall.B = 1, tall.N = 97, tall.M = 60, tall.dtype = DType::f32, tall.layout = Layout::bhnd;
    out.push_back(tall);
    Case decode = c;  // a few queries against a longer cache: the rows form
    decode.B = 2, decode.H = 8, decode.Hkv = 2, decode.N = k % 2 ? 1 : 2, decode.M = 700, decode.D = 48, decode.Dv = 48;
    decode.extras.padding = true;
    out.push_back(decode);
    decode.form = "rows", decode.agree_with = "tiled";
    out.push_back(decode);
  }
  // The caller's own sparsity (block mask + mask_mod), alone and on top of a pattern, on the
  // tiled and rows forms.
  for (int flags = 1; flags < 4; ++flags)
    for (const char* mech : {"softmax", "softmax:causal,window=50:0,sinks=2", "bigbird:block=16,window=3,global=1,random=1"})
      for (int64_t n : {int64_t{2}, int64_t{90}}) {
        Case c;
        c.mechanism = mech, c.B = 2, c.H = 4, c.Hkv = 2, c.N = n, c.M = 150, c.D = 16, c.Dv = 16;
        c.extras.block_mask = flags & 1, c.extras.mask_mod = flags & 2, c.extras.padding = flags == 3;
        out.push_back(c);
      }
  for (const char* mech : {"longformer:window=8:8,global=0;65;140", "longformer:window=5:0,global=3;64,causal"})
    for (int64_t n : {int64_t{150}, int64_t{70}}) {
      Case c;  // global query rows computed apart (rows form), with a bias, ALiBi and GQA on top
      c.mechanism = mech, c.B = 2, c.H = 4, c.Hkv = 1, c.N = n, c.M = 150, c.D = 16, c.Dv = 16;
      c.extras.bias = true, c.extras.alibi = n == 150, c.extras.padding = n == 70;
      out.push_back(c);
    }
  for (const char* mech : {"softmax:causal,window=64:0,sinks=4", "softmax:causal,window=130:0"}) {
    Case c;  // many tiles: full runs, partial edges, skipped middles
    c.mechanism = mech, c.B = 1, c.H = 2, c.Hkv = 2, c.N = 600, c.M = 600, c.D = 64, c.Dv = 64;
    out.push_back(c);
  }
}

void sparse_bad_cases(std::vector<BadCase>& out) {
  Case c = small_case();
  auto add = [&](const char* name, const char* mech, const char* message) { add_bad_text(out, c, name, mech, message); };
  add("dilation_zero", "softmax:causal,dilation=0", "dilation must be >= 1 (1 = every key), got 0");
  add("strided_with_dilation", "softmax:strided=4,dilation=2", "strided and dilation cannot be combined");
  add("negative_sinks", "softmax:sinks=-2", "sinks must be >= 0 (0 = none), got -2");
  add("longformer_negative_global", "longformer:window=2:2,global=1;-3",
      "longformer global position must be >= 0 (positions count from 0), got -3");
  add("bigbird_even_window", "bigbird:window=4", "bigbird window must be an odd number of blocks >= 1");
}

}  // namespace

void sparse_patterns_cases(FamilyCases& out) {
  sparse_check_cases(out.cases);
  sparse_bad_cases(out.bad);
}

}  // namespace attn::harness
