// The exact softmax family's cases: shapes straddling the tiles, every option, dtype and layout, and its bad inputs.
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

void softmax_check_cases(std::vector<Case>& out) {
  // Lengths and head dims that straddle the 64-query and 64-key tiles and the micro-tiles.
  for (int64_t n : {1, 7, 63, 64, 65, 127, 129})
    for (int64_t m : {int64_t{1}, int64_t{65}, n}) {
      Case c;
      c.N = n, c.M = m;
      c.D = c.Dv = (n * 7 + m) % 3 == 0 ? 64 : 32;
      out.push_back(c);
      c.mechanism = "softmax:causal";
      out.push_back(c);
    }
  for (int64_t d : {1, 7, 32, 64, 80, 128, 256}) {
    Case c;
    c.N = 33, c.M = 70, c.D = d, c.Dv = d == 80 ? 48 : d;
    out.push_back(c);
  }
  for (DType dt : {DType::f32, DType::bf16, DType::f16})
    for (Layout lay : {Layout::bhnd, Layout::bnhd})
      for (const char* mech : {"softmax", "softmax:causal", "softmax:window=20:5", "softmax:causal,window=16:0"}) {
        Case c;
        c.B = 2, c.H = 4, c.Hkv = 2, c.N = 77, c.M = 131, c.D = 40, c.Dv = 24;
        c.dtype = dt, c.layout = lay, c.mechanism = mech;
        out.push_back(c);
      }
  for (int64_t hkv : {1, 2, 6}) {  // MQA, GQA, MHA
    Case c;
    c.H = 6, c.Hkv = hkv, c.N = 65, c.M = 65, c.D = 16, c.Dv = 16, c.mechanism = "softmax:causal";
    out.push_back(c);
  }
  for (const char* mech : {"softmax:scale=0.05", "softmax:softcap=10", "softmax:softcap=30,scale=1",
                           "softmax:score=cosine,scale=4", "softmax:entropy_scale=32", "softmax:causal,entropy_scale=16",
                           "softmax:window=0:0", "softmax:window=-1:3", "softmax:dropout=0.25,seed=9",
                           "softmax:causal,dropout=0.5,seed=3"})
    for (DType dt : {DType::f32, DType::bf16}) {
      Case c;
      c.B = 2, c.H = 2, c.Hkv = 1, c.N = 70, c.M = 90, c.D = 24, c.Dv = 20, c.mechanism = mech, c.dtype = dt;
      out.push_back(c);
    }
  for (int flags = 1; flags < 16; ++flags) {  // padding, boolean mask, bias, alibi combinations
    Case c;
    c.B = 3, c.H = 2, c.Hkv = 2, c.N = 66, c.M = 100, c.D = 16, c.Dv = 8;
    c.extras.padding = flags & 1, c.extras.mask = flags & 2, c.extras.bias = flags & 4, c.extras.alibi = flags & 8;
    c.mechanism = flags % 3 == 0 ? "softmax:causal" : "softmax";
    out.push_back(c);
  }
  for (int64_t k : {1, 3, 200}) {  // row statistics' top-k at its edges: the max alone, the whole row (k > M)
    Case c;
    c.N = 70, c.M = 131, c.D = 16, c.Dv = 16, c.stats_topk = k, c.mechanism = "softmax:causal";
    out.push_back(c);
    c.N = 2, c.H = 8, c.Hkv = 2, c.M = 300, c.mechanism = "softmax";  // decode-shaped: the rows form's chunks
    out.push_back(c);
  }
  for (float mag : {3.0f, 5.0f, 100.0f})
    for (const char* mech : {"softmax", "softmax:softcap=50"}) {
      Case c;
      c.N = 40, c.M = 129, c.D = 32, c.Dv = 32, c.extras.magnitude = mag, c.mechanism = mech;
      out.push_back(c);
    }
  {
    Case c;  // non-packed token stride, both layouts
    c.N = 65, c.M = 63, c.D = 24, c.Dv = 24, c.extras.pad = 5;
    out.push_back(c);
    c.layout = Layout::bnhd, c.dtype = DType::f16;
    out.push_back(c);
  }
  {
    Case c;  // additive (Bahdanau) scores, weights through the named params
    c.N = 20, c.M = 33, c.D = 8, c.Dv = 8, c.mechanism = "softmax:score=additive";
    out.push_back(c);
    c.mechanism = "softmax:score=additive,causal,scale=0.5", c.dtype = DType::bf16;
    out.push_back(c);
  }
  // Decode-shaped: a few new queries against a long cache (rows form: split-K over key chunks).
  for (int64_t n : {1, 2, 3})
    for (int64_t m : {1, 255, 256, 257, 1000, 5000}) {
      Case c;
      c.B = 2, c.H = 8, c.Hkv = n == 1 ? 1 : 4, c.N = n, c.M = m, c.D = 64, c.Dv = 40, c.mechanism = "softmax:causal";
      c.dtype = m % 2 ? DType::bf16 : DType::f32;
      c.layout = n == 2 ? Layout::bnhd : Layout::bhnd;
      out.push_back(c);
    }
  for (int64_t d : {1, 3, 20}) {
    // Regression: the rows form kept R = group * N scores in a buffer sized by the head dim, and
    // overflowed it when R > D (found by the Python property tests, D = 1 with 8 rows per kv head).
    // D = 20: whole vectors and a scalar tail (keys in fours take whole vectors only).
    Case c;
    c.B = 1, c.H = 8, c.Hkv = 1, c.N = 2, c.M = 300, c.D = d, c.Dv = d;
    out.push_back(c);
  }
  for (int flags = 1; flags < 16; flags += 2) {
    Case c;  // decode with padding + masks/bias/alibi, softcap and windows
    c.B = 3, c.H = 4, c.Hkv = 2, c.N = 2, c.M = 700, c.D = 32, c.Dv = 32;
    c.extras.padding = true, c.extras.mask = flags & 2, c.extras.bias = flags & 4, c.extras.alibi = flags & 8;
    c.mechanism = flags == 1 ? "softmax:softcap=20"
                             : (flags == 3 ? "softmax:causal,window=300:0" : "softmax:entropy_scale=64");
    out.push_back(c);
  }
  {
    Case c;  // more queries than keys: causal rows before the diagonal see nothing
    c.N = 100, c.M = 30, c.D = 16, c.Dv = 16, c.mechanism = "softmax:causal";
    out.push_back(c);
  }
  // Pairs of forms that must agree: rows and tiled on decode shapes.
  for (DType dt : {DType::f32, DType::bf16})
    for (const char* mech : {"softmax:causal", "softmax:softcap=30", "softmax:window=100:0"}) {
      Case c;
      c.B = 2, c.H = 8, c.Hkv = 2, c.N = 2, c.M = 777, c.D = 48, c.Dv = 48, c.mechanism = mech, c.dtype = dt;
      c.form = "rows", c.agree_with = "tiled";
      c.extras.padding = true;
      out.push_back(c);
    }
  // An 8-bit KV cache (int8 rows with a scale each): decode shapes (rows), prefill shapes
  // (tiled), grouped heads, padding, a window, softcap, q float32 or bfloat16, strided rows.
  for (DType dt : {DType::f32, DType::bf16})
    for (const char* mech : {"softmax:causal", "softmax:softcap=30", "softmax:window=100:0"}) {
      Case c;
      c.B = 2, c.H = 6, c.Hkv = 2, c.N = 2, c.M = 301, c.D = 40, c.Dv = 24, c.mechanism = mech, c.dtype = dt;
      c.extras.padding = true, c.extras.int8_kv = true;
      out.push_back(c);
      c.N = 70, c.M = 90, c.layout = Layout::bnhd, c.extras.pad = dt == DType::f32 ? 3 : 0;
      out.push_back(c);
    }
  {
    Case c;  // rows and tiled agree on int8 rows (SmolLM2's decode shape: 3 query heads per kv head)
    c.B = 1, c.H = 9, c.Hkv = 3, c.N = 1, c.M = 1000, c.D = 64, c.Dv = 64, c.mechanism = "softmax:causal";
    c.extras.int8_kv = true, c.form = "rows", c.agree_with = "tiled";
    out.push_back(c);
  }
}

// Bad input, per family: each promise of docs/reliability.md that validation keeps.
void softmax_bad_cases(std::vector<BadCase>& out) {
  Case c;
  c.B = 2, c.H = 4, c.Hkv = 2, c.N = 5, c.M = 6, c.D = 8, c.Dv = 8;
  auto add = [&](const char* name, const char* mech, void (*breaks)(Inputs&), const char* message) {
    Case b = c;
    b.mechanism = mech;
    out.push_back({name, b, breaks, message});
  };
  add("heads_do_not_divide", "softmax", [](Inputs& in) { in.k.view.shape[1] = in.v.view.shape[1] = 3; },
      "k has 3 heads, which does not divide q's 4");
  add("head_dims_differ", "softmax", [](Inputs& in) { in.k.view.shape[3] = 7; }, "k has head_dim 7, q has 8");
  add("negative_length", "softmax", [](Inputs& in) { in.q.view.shape[2] = -1; }, "q has negative dimension 2");
  add("threads_beyond_limit", "softmax", [](Inputs& in) { in.options.threads = 100000; },
      "threads must be in [0, 256]");
  add("scale_infinite_as_float32", "softmax:scale=1e39", [](Inputs&) {}, "softmax scale must be in [1e-30, 1e+12], got 1e+39");
  add("softcap_infinite_as_float32", "softmax:softcap=1e39", [](Inputs&) {},
      "softmax softcap must be in [1e-30, 1e+30], got 1e+39 (0 = off)");
  add("int8_rows_without_scales", "softmax", [](Inputs& in) { in.k.view.dtype = in.v.view.dtype = DType::i8; },
      "k must be float32, bfloat16 or float16, got int8 (int8 rows need their scales: options.kv_scales)");
  add("scales_for_float_rows", "softmax",
      [](Inputs& in) { in.options.kv_scales = KvScales{in.k.view, in.v.view}; },
      "k must be int8 with options.kv_scales, got float32");
  {
    Case b = c;
    b.extras.int8_kv = true;
    out.push_back({"int8_scales_of_another_shape", b, [](Inputs& in) { in.options.kv_scales->v.shape[2] = 5; },
                   "kv_scales.v must have shape (B, Hkv, M, 1) = (2, 2, 6, 1), got (2, 2, 5, 1)"});
    out.push_back({"int8_scales_not_float32", b, [](Inputs& in) { in.options.kv_scales->k.dtype = DType::f16; },
                   "kv_scales.k must be float32, got float16"});
  }
  add("padding_beyond_keys", "softmax", [](Inputs& in) { in.options.key_padding_lengths = {6, 7}; },
      "key_padding_lengths[1] must be in [0, 6], got 7");
  add("param_not_taken", "softmax", [](Inputs& in) { in.options.params["w"] = make_array_view(&in.q.bytes[0], DType::f32, {1}); },
      "params has 'w', which softmax does not take");
  add("param_missing", "softmax:score=additive", [](Inputs& in) { in.options.params.clear(); }, "softmax:score=additive needs params['wq']");
  add("forced_form_refuses", "softmax:dropout=0.5", [](Inputs& in) { in.options.form = "rows"; },
      "form 'rows' cannot run softmax:dropout=0.5 for these inputs; forms: rows: dropout");
  add("unknown_form", "softmax", [](Inputs& in) { in.options.form = "fast"; }, "form must be one of rows, tiled_bf16, tiled, reference");
  add("stats_topk_zero", "softmax", [](Inputs& in) { in.options.return_stats = true, in.options.stats_topk = 0; },
      "stats_topk must be in [1, 1024], got 0");
  add("stats_topk_beyond_limit", "softmax", [](Inputs& in) { in.options.return_stats = true, in.options.stats_topk = 1025; },
      "stats_topk must be in [1, 1024], got 1025");
  add("alibi_count", "softmax", [](Inputs& in) { in.options.alibi_slopes = {1, 2, 3}; },
      "alibi_slopes must have H (4) or B*H (8) values, got 3");
}

}  // namespace

void softmax_cases(FamilyCases& out) {
  softmax_check_cases(out.cases);
  softmax_bad_cases(out.bad);
}

}  // namespace attn::harness
