// Reformer's LSH attention: hashed chunks, rounds, shared QK.
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

void lsh_check_cases(std::vector<Case>& out) {
  const char* mechs[] = {
      "lsh:buckets=8,rounds=2,chunk=8,seed=1",          "lsh:buckets=4,rounds=3,chunk=16,seed=2,causal",
      "lsh:buckets=8,rounds=2,chunk=8,seed=3,shared_qk", "lsh:buckets=6,rounds=2,chunk=5,seed=4,causal,shared_qk",
      "lsh:buckets=2,rounds=1,chunk=1,seed=5",          "lsh:buckets=16,rounds=4,chunk=100,seed=6,causal",
  };
  int k = 0;
  for (const char* mech : mechs) {
    ++k;
    Case c;
    c.mechanism = mech;
    c.B = 2, c.H = 4, c.Hkv = 2, c.N = 131, c.M = 131, c.D = 16, c.Dv = 24;
    c.dtype = k % 3 == 0 ? DType::bf16 : k % 3 == 1 ? DType::f32 : DType::f16;
    c.layout = k % 2 ? Layout::bhnd : Layout::bnhd;
    out.push_back(c);
    Case pad = c;  // keys past the valid length take no part in the sort
    pad.B = 3, pad.H = 2, pad.Hkv = 1, pad.N = pad.M = 70, pad.dtype = DType::f32, pad.extras.padding = true;
    out.push_back(pad);
    if (k == 3 || k == 5) {  // row statistics merged over the rounds (k = 1: the max; 300: every counted key)
      Case t = pad;
      t.stats_topk = k == 3 ? 300 : 1;
      out.push_back(t);
    }
    if (std::string(mech).find("shared_qk") != std::string::npos) continue;
    Case wide = c;  // queries and keys of different lengths
    wide.B = 1, wide.N = 33, wide.M = 90, wide.dtype = DType::f32;
    out.push_back(wide);
    wide.N = 97, wide.M = 40, wide.extras.pad = 3;
    out.push_back(wide);
  }
  Case many;  // many tiles and chunks, several rounds
  many.mechanism = "lsh:buckets=32,rounds=4,chunk=64,seed=9,causal,shared_qk";
  many.B = 1, many.H = 2, many.Hkv = 2, many.N = many.M = 600, many.D = 64, many.Dv = 64;
  out.push_back(many);
}

void lsh_bad_cases(std::vector<BadCase>& out) {
  Case c = small_case();
  auto add = [&](const char* name, const char* mech, const char* message) { add_bad_text(out, c, name, mech, message); };
  add("lsh_odd_buckets", "lsh:buckets=7", "lsh buckets must be even and in [2, 65536]");
  add("lsh_zero_rounds", "lsh:rounds=0", "lsh rounds must be in [1, 64], got 0");
  add("lsh_zero_chunk", "lsh:chunk=0", "lsh chunk must be >= 1, got 0");
  add("lsh_shared_needs_square", "lsh:shared_qk", "lsh shared_qk needs as many queries as keys");
  add("lsh_buckets_beyond_keys", "lsh:buckets=65536,rounds=64",
      "lsh buckets must be at most max(64, 2 M) = 64 for M = 6 keys");
  add("lsh_scale_overflows", "lsh:scale=1e13", "lsh scale must be in [1e-30, 1e+12], got 1e+13");
  c.N = c.M = 6, c.mechanism = "lsh", c.extras.mask = true;
  out.push_back({"lsh_mask", c, [](Inputs&) {}, "lsh does not take a boolean mask"});
}

}  // namespace

void lsh_cases(FamilyCases& out) {
  lsh_check_cases(out.cases);
  lsh_bad_cases(out.bad);
}

}  // namespace attn::harness
