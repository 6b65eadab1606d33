// The linear family: kernelised weights through the right product, the recurrence and chunks
// (feature maps, decays, retention, SANA, TransNormer, Performer, PolaFormer), and its bad inputs.
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

void linear_check_cases(std::vector<Case>& out) {
  const char* mechs[] = {
      "linear:map=elu",
      "linear:map=relu,causal",
      "linear:map=identity,causal,normalize=0",
      "linear:map=elu,causal,chunk=64",
      "linear:map=identity,causal,normalize=0,decay=0.97",
      "retention:decay=0.9,chunk=16",
      "linear:map=exp,causal,chunk=7",
      "linear:map=relu2,causal,decay=0.8,chunk=5",
      "linear:map=relu2,scale=0.25",
      "linear:map=elu,causal,normalize=0,scale=0.125,chunk=100",
      "normattn:map=elu,norm=rms",
      "normattn:map=relu,norm=layer,causal,decay=0.95,chunk=16",
      "performer:features=40,seed=3",
      "performer:features=24,seed=4,causal,chunk=8",
      "sana",
      "sana:causal,eps=0.001,chunk=32",
      "polaformer:power=3",
      "polaformer:power=1.5,causal,chunk=16",
  };
  int k = 0;
  for (const char* mech : mechs) {
    ++k;
    const bool causal = std::string(mech).find("causal") != std::string::npos ||
                        std::string(mech).find("retention") != std::string::npos;
    const bool performer = std::string(mech).find("performer") != std::string::npos;
    Case c;  // odd sizes, grouped heads, every dtype and layout in turn
    c.mechanism = mech;
    c.B = 2, c.H = 4, c.Hkv = 2, c.N = c.M = 131, c.D = 16, c.Dv = 24;
    c.dtype = k % 3 == 0 ? DType::bf16 : k % 3 == 1 ? DType::f32 : DType::f16;
    c.layout = k % 2 ? Layout::bhnd : Layout::bnhd;
    if (performer) c.extras.magnitude = 0.7f;  // random features: moderate exponents
    out.push_back(c);
    Case st = c;  // a state passed in, padded keys, strided rows
    st.B = 3, st.H = 2, st.Hkv = 1, st.N = st.M = 70, st.D = 8, st.Dv = 8, st.dtype = DType::f32;
    st.extras.params = {"initial_state"}, st.extras.padding = true, st.extras.pad = 3;
    out.push_back(st);
    if (causal) {  // short: the recurrent and chunked forms against each other, final states included
      Case few = st;
      few.N = few.M = 13, few.extras.padding = k % 2 == 0, few.form = "recurrent", few.agree_with = "chunked";
      out.push_back(few);
      few.N = few.M = 1, few.extras.padding = false;  // one new token against a state: decoding
      out.push_back(few);
    } else {  // queries and keys of different lengths
      Case wide = c;
      wide.N = 33, wide.M = 90, wide.dtype = DType::f32;
      out.push_back(wide);
    }
    if (std::string(mech).rfind("polaformer", 0) == 0) {  // its learned params (the backward checks theirs)
      Case learned = st;
      learned.extras.params = {"power", "coefficients", "initial_state"};
      out.push_back(learned);
    }
  }
  Case many;  // many chunks, a decay, wider heads
  many.mechanism = "linear:map=identity,causal,normalize=0,decay=0.99";
  many.B = 1, many.H = 2, many.Hkv = 2, many.N = many.M = 600, many.D = many.Dv = 64;
  out.push_back(many);
  many.mechanism = "linear:map=elu,causal", many.D = many.Dv = 128, many.N = many.M = 200;
  out.push_back(many);
  Case heads = small_case();  // a decay per head through the named param
  heads.mechanism = "retention:chunk=4", heads.N = heads.M = 37, heads.H = 4, heads.Hkv = 2;
  heads.extras.params = {"decay"};
  out.push_back(heads);
  heads.extras.params = {"decay", "initial_state"}, heads.N = heads.M = 9, heads.form = "recurrent", heads.agree_with = "chunked";
  out.push_back(heads);
  Case far;  // decay 0.8 over 600 keys: lambda^d underflows to 0 in float far back (zeros of the row)
  far.mechanism = "linear:map=elu,causal,decay=0.8,chunk=64";
  far.B = 1, far.H = 2, far.Hkv = 1, far.N = far.M = 600, far.D = 16, far.Dv = 16;
  out.push_back(far);
  for (const char* mech : {"linear:map=elu,causal,chunk=16", "linear:map=identity,normalize=0", "polaformer:power=3",
                           "polaformer:power=2,causal,chunk=8"})
    for (int64_t k : {1, 200}) {  // row statistics' top-k: the max alone, the whole row (k > M)
      Case top = small_case();
      top.mechanism = mech, top.N = top.M = 70, top.stats_topk = k;
      if (k == 1) top.extras.params = {"initial_state"};
      out.push_back(top);
    }
}

void linear_bad_cases(std::vector<BadCase>& out) {
  Case c = small_case();
  auto add = [&](const char* name, const char* mech, const char* message) { add_bad_text(out, c, name, mech, message); };
  add("linear_causal_needs_square", "linear:causal", "so N (queries) must equal M (keys), got N = 5, M = 6");
  add("linear_decay_needs_causal", "linear:decay=0.9", "a decay needs causal");
  c.N = c.M = 6;
  add("linear_decay_range", "linear:causal,decay=1.5", "linear decay must be in (0, 1], got 1.5 (1 = none; needs causal)");
  add("linear_chunk_range", "linear:causal,chunk=0", "linear chunk must be in [1, 4096], got 0");
  c.mechanism = "linear";
  out.push_back({"linear_lse", c, [](Inputs& in) { in.options.return_lse = true; },
                 "linear has no log-sum-exp (its weights are not a softmax)"});
  out.push_back({"linear_alibi", c, [](Inputs& in) { in.options.alibi_slopes = {1, 1}; },
                 "linear does not take ALiBi slopes"});
  out.push_back({"linear_state_shape", c, [](Inputs& in) {
                   static const float zeros[2 * 8 * 8] = {};
                   in.options.params["initial_state"] = make_array_view(zeros, DType::f32, {1, 2, 8, 8});
                 }, "params['initial_state'] must have shape"});
  c.N = 5, c.Dv = 7;  // the family's other kinds
  add("efficient_causal_needs_square", "efficient:causal", "so N (queries) must equal M (keys), got N = 5, M = 6");
  add("polaformer_odd_value_dim", "polaformer", "polaformer needs an even value head dim (two streams on its halves), got Dv = 7");
  c.Dv = 8;
  add("polaformer_power", "polaformer:power=1", "polaformer power must be in (1, 10], got 1");
  add("performer_features", "performer:features=0", "performer features must be in [1, 65536], got 0");
  add("sana_eps", "sana:eps=-1", "sana eps must be in [0, 1e+30], got -1 (added to the normaliser)");
  // class 6: float options whose computation would overflow float32 from ordinary inputs
  add("polaformer_power_overflows", "polaformer:power=100", "polaformer power must be in (1, 10], got 100");
  add("linear_scale_overflows", "linear:scale=3e38", "linear scale must be in [1e-30, 1e+12], got 3e+38");
  add("gau_bias_overflows", "gau:bias=3e38", "gau bias must be in [-1e+12, 1e+12], got 3e+38");
  add("gau_scale_overflows", "gau:scale=1e20", "gau scale must be in [1e-30, 1e+12], got 1e+20");
  add("efficient_scale_overflows", "efficient:scale=3e38", "efficient scale must be in [1e-30, 1e+12], got 3e+38");
  add("sana_eps_overflows", "sana:eps=1e39", "sana eps must be in [0, 1e+30], got 1e+39");
  add("normattn_decay_range", "normattn:causal,decay=2", "normattn decay must be in (0, 1], got 2");
  add("softmax_scale_overflows", "softmax:scale=3e38", "softmax scale must be in [1e-30, 1e+12], got 3e+38");
  add("longformer_scale_overflows", "longformer:scale=3e38", "longformer scale must be in [1e-30, 1e+12], got 3e+38");
  add("bigbird_scale_tiny", "bigbird:scale=1e-40", "bigbird scale must be in [1e-30, 1e+12], got 1e-40");
  // class 5: performer's omega (features x D) is bounded before it is drawn
  c.D = 32;
  add("performer_features_by_head_dim", "performer:features=65536",
      "performer features x head dim must be at most 2^20 (the random feature matrix omega), got 65536 x D = 32");
  c.D = 8;
  add("normattn_decay_needs_causal", "normattn:decay=0.9", "a decay needs causal");
  c.mechanism = "gau", c.extras.mask = true;
  out.push_back({"gau_mask", c, [](Inputs&) {}, "gau does not take a boolean mask"});
  c.mechanism = "efficient", c.extras.mask = false, c.N = c.M = 6;
  out.push_back({"efficient_negative_sums", c, [](Inputs& in) {
                   static std::vector<float> state(2 * 8 * 10, 0.0f);
                   state[8] = -1.0f;  // z of (b 0, h 0, f 0)
                   in.options.params["initial_state"] = make_array_view(state.data(), DType::f32, {1, 2, 8, 10});
                 }, "params['initial_state'] column Dv (the sums z) must be >= 0, got -1"});
  Case softmax = c;
  softmax.mechanism = "softmax";
  out.push_back({"softmax_final_state", softmax, [](Inputs& in) { in.options.return_final_state = true; },
                 "softmax has no recurrent state"});
}

}  // namespace

void linear_cases(FamilyCases& out) {
  linear_check_cases(out.cases);
  linear_bad_cases(out.bad);
}

}  // namespace attn::harness
