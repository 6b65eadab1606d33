// THE case list: every mechanism's cases for check, bench and demo. A new mechanism adds its
// cases here (a block per family), nothing else.
#include <algorithm>
#include <cctype>
#include <set>
#include <sstream>

#include "harness/case.hpp"
#include "harness/inputs.hpp"

namespace attn::harness {

std::string Tolerance::describe() const { return "2x plain + floor"; }

std::string Case::op() const { return std::string(kind_of(parse_mechanism(mechanism))); }

namespace {

// "_initial_state_decay": the optional params a case passes, in its name.
std::string param_names(const std::vector<std::string>& params) {
  std::string o;
  for (const std::string& p : params) o += "_" + p;
  return o;
}

}  // namespace

std::string Case::name() const {
  std::ostringstream s;
  s << mechanism << "__B" << B << "H" << H << "kv" << Hkv << "N" << N << "M" << M << "D" << D << "Dv" << Dv << "_"
    << dtype_name(dtype) << (layout == Layout::bnhd ? "_bnhd" : "") << (extras.padding ? "_pad" : "")
    << (extras.mask ? "_mask" : "") << (extras.bias ? "_bias" : "") << (extras.alibi ? "_alibi" : "")
    << (extras.block_mask ? "_blocks" : "") << (extras.mask_mod ? "_mod" : "")
    << param_names(extras.params) << (extras.magnitude != 1.0f ? "_x" + std::to_string(int(extras.magnitude)) : "")
    << (extras.pad ? "_strided" : "") << (agree_with.empty() ? "" : "_vs_" + agree_with)
    << (seed != 1234 ? "_seed" + std::to_string(seed) : "") << (stats_topk != 8 ? "_top" + std::to_string(stats_topk) : "");
  std::string r = s.str();
  for (char& ch : r)
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  return r;
}

double Case::flops() const {
  Inputs in;
  make_inputs(*this, in, /*shapes_only=*/true);
  return attention_flops(in.q.view, in.k.view, in.v.view, in.mechanism, in.options);
}

double Case::kv_bytes() const {
  return static_cast<double>(B * Hkv * M * (D + Dv)) * static_cast<double>(dtype_size(dtype));
}

std::vector<Case> bench_grid(const std::vector<int64_t>& sizes, const std::vector<int64_t>& dims,
                             const std::vector<std::string>& mechanisms, const std::vector<DType>& dtypes,
                             int64_t heads, int64_t kv_heads) {
  std::vector<Case> out;
  for (int64_t n : sizes)
    for (int64_t d : dims)
      for (const auto& m : mechanisms)
        for (DType dt : dtypes) {
          Case c;
          c.mechanism = m;
          c.B = 1, c.H = heads, c.Hkv = kv_heads ? kv_heads : heads, c.N = c.M = n, c.D = c.Dv = d, c.dtype = dt;
          c.suites = kBench;
          c.seed = 42;
          out.push_back(c);
        }
  return out;
}

std::vector<Case> decode_grid(const std::vector<int64_t>& cache_lengths, const std::vector<int64_t>& dims,
                              const std::vector<DType>& dtypes, int64_t heads) {
  std::vector<Case> out;
  for (int64_t m : cache_lengths)
    for (int64_t d : dims)
      for (int64_t hkv : {heads, std::max<int64_t>(1, heads / 4)})
        for (DType dt : dtypes) {
          Case c;
          c.B = 1, c.H = heads, c.Hkv = hkv, c.N = 1, c.M = m, c.D = c.Dv = d, c.dtype = dt;
          c.suites = kDecode;
          c.seed = 42;
          out.push_back(c);
        }
  return out;
}

std::vector<Case> demo_cases(int64_t n, int64_t d, int64_t heads) {
  struct Row {
    const char* label;
    const char* mechanism;
    DType dtype = DType::f32;
    int64_t kv_heads = 0;  // 0: same as heads
    bool alibi = false;
    bool decode = false;  // one query per head against the n keys
    bool state = false;   // one token against a recurrent state (linear decoding)
  };
  const int64_t gqa = std::max<int64_t>(1, heads / 4);
  const Row rows[] = {
      {"MHA", "softmax"},
      {"causal", "softmax:causal"},
      {"sliding window 128", "softmax:causal,window=128:0"},
      {"window 128 + 4 sinks (StreamingLLM)", "softmax:causal,window=128:0,sinks=4"},
      {"dilated 4 (atrous)", "softmax:causal,dilation=4"},
      {"strided 32 (Sparse Transformer)", "softmax:causal,strided=32"},
      {"chunked 128 (block-diagonal)", "softmax:chunk=128"},
      {"Longformer window 64, 3 globals", "longformer:window=64:64,global=0;17;33"},
      {"BigBird block 32", "bigbird:block=32,window=3,global=2,random=3,seed=7"},
      {"softcap 30", "softmax:causal,softcap=30"},
      {"ALiBi (slopes 2^(-8h/H))", "softmax:causal", DType::f32, 0, true},
      {"GQA (kv heads = H/4)", "softmax:causal", DType::f32, gqa},
      {"MQA (1 kv head)", "softmax:causal", DType::f32, 1},
      {"cosine score", "softmax:score=cosine,scale=10"},
      {"entropy-invariant scale", "softmax:causal,entropy_scale=128"},
      {"bfloat16 storage", "softmax:causal", DType::bf16},
      {"float16 storage", "softmax:causal", DType::f16},
      {"decode: 1 query, GQA", "softmax:causal", DType::f32, gqa, false, true},
      {"decode: 1 query, bf16", "softmax:causal", DType::bf16, 0, false, true},
      {"Linformer k=64 (low rank)", "linformer:k=64,seed=1"},
      {"Reformer LSH, 2 rounds, chunks of 64", "lsh:buckets=16,rounds=2,chunk=64,seed=1,causal,shared_qk"},
      {"Dual Chunk Attention, chunks of 128", "dca:chunk=128,local=32"},
      {"linear elu+1 (right product)", "linear:map=elu"},
      {"linear elu+1 causal (chunked Lightning)", "linear:map=elu,causal"},
      {"retention decay 0.97 (chunked)", "retention:decay=0.97"},
      {"GAU relu^2 (quadratic, tiled)", "gau:causal"},
      {"PolaFormer power 3, causal (two streams)", "polaformer:power=3,causal"},
      {"efficient attention (key softmax over tokens)", "efficient"},
      {"TransNormer NormAttention (RMS-normalised)", "normattn:map=elu,norm=rms,causal"},
      {"SANA ReLU linear attention", "sana"},
      {"Performer 256 features (estimates softmax)", "performer:features=256,seed=1"},
      {"linear decode: 1 token + state (recurrent)", "linear:map=relu,causal", DType::f32, 0, false, false, true},
  };
  std::vector<Case> out;
  for (const Row& r : rows) {
    Case c;
    c.label = r.label, c.mechanism = r.mechanism, c.dtype = r.dtype;
    c.B = 1, c.H = heads, c.Hkv = r.kv_heads ? r.kv_heads : heads, c.N = r.decode ? 1 : n, c.M = n, c.D = c.Dv = d;
    c.extras.alibi = r.alibi;
    if (r.state) c.N = c.M = 1, c.extras.params = {"initial_state"};
    c.suites = kDemo;
    c.seed = 42;
    out.push_back(c);
  }
  return out;
}

namespace {

// ---- softmax: the exact family -------------------------------------------------------------
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
  add("scale_infinite_as_float32", "softmax:scale=1e39", [](Inputs&) {}, "scale must be a positive finite float32");
  add("softcap_infinite_as_float32", "softmax:softcap=1e39", [](Inputs&) {}, "softcap (when not 0) must be a positive finite float32");
  add("padding_beyond_keys", "softmax", [](Inputs& in) { in.options.key_padding_lengths = {6, 7}; },
      "key_padding_lengths[1] must be in [0, 6], got 7");
  add("param_not_taken", "softmax", [](Inputs& in) { in.options.params["w"] = make_array_view(&in.q.bytes[0], DType::f32, {1}); },
      "params has 'w', which softmax does not take");
  add("param_missing", "softmax:score=additive", [](Inputs& in) { in.options.params.clear(); }, "softmax:score=additive needs params['wq']");
  add("forced_form_refuses", "softmax:dropout=0.5", [](Inputs& in) { in.options.form = "rows"; },
      "form 'rows' cannot run softmax:dropout=0.5 for these inputs; forms: rows: dropout");
  add("unknown_form", "softmax", [](Inputs& in) { in.options.form = "fast"; }, "form must be one of rows, tiled, reference");
  add("stats_topk_zero", "softmax", [](Inputs& in) { in.options.return_stats = true, in.options.stats_topk = 0; },
      "stats_topk must be in [1, 1024], got 0");
  add("stats_topk_beyond_limit", "softmax", [](Inputs& in) { in.options.return_stats = true, in.options.stats_topk = 1025; },
      "stats_topk must be in [1, 1024], got 1025");
  add("alibi_count", "softmax", [](Inputs& in) { in.options.alibi_slopes = {1, 2, 3}; },
      "alibi_slopes must have H (4) or B*H (8) values, got 3");
}

// ---- sparse patterns: exact softmax over a block mask (src/sparse/) -------------------------
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

// A small valid call for bad-input cases: 2 heads, 5 queries, 6 keys, d = 8.
Case small_case() {
  Case c;
  c.B = 1, c.H = 2, c.Hkv = 2, c.N = 5, c.M = 6, c.D = 8, c.Dv = 8;
  return c;
}

// `base` with mechanism text `mech`, which attend() and explain() must refuse with `message`.
void add_bad_text(std::vector<BadCase>& out, Case base, const char* name, const char* mech, const char* message) {
  base.mechanism = mech;
  out.push_back({name, base, [](Inputs&) {}, message});
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

// ---- linformer: low-rank projections along the sequence ------------------------------------
void linformer_check_cases(std::vector<Case>& out) {
  for (DType dt : {DType::f32, DType::bf16})
    for (Layout lay : {Layout::bhnd, Layout::bnhd}) {
      Case c;
      c.B = 2, c.H = 4, c.Hkv = 2, c.N = 33, c.M = 70, c.D = 16, c.Dv = 8, c.dtype = dt, c.layout = lay;
      c.mechanism = "linformer:k=16,seed=3";
      out.push_back(c);
    }
  Case c;
  c.B = 3, c.H = 2, c.Hkv = 1, c.N = 65, c.M = 129, c.D = 24, c.Dv = 24;
  c.mechanism = "linformer:k=100,seed=1,scale=0.2";  // k close to M
  c.extras.padding = true;
  out.push_back(c);
  c.stats_topk = 150;  // row statistics' top k beyond the k projected rows: the whole row
  out.push_back(c);
  c.N = 1, c.mechanism = "linformer:k=64";  // one query: the softmax rows form on the projections
  out.push_back(c);
  c.N = 7, c.M = 5, c.mechanism = "linformer:k=9,seed=2";  // k > M
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
}

// ---- lsh: Reformer's hashed chunks ----------------------------------------------------------
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
  c.N = c.M = 6, c.mechanism = "lsh", c.extras.mask = true;
  out.push_back({"lsh_mask", c, [](Inputs&) {}, "lsh does not take a boolean mask"});
}

// ---- dca: Dual Chunk Attention ----------------------------------------------------------------
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
}

void dca_bad_cases(std::vector<BadCase>& out) {
  Case c = small_case();
  auto add = [&](const char* name, const char* mech, const char* message) { add_bad_text(out, c, name, mech, message); };
  add("dca_local_beyond_chunk", "dca:chunk=8,local=9", "dca local must be in [1, chunk = 8], got 9");
  add("dca_theta", "dca:theta=1", "dca theta must be a finite number > 1");
  c.D = 7;
  add("dca_odd_head_dim", "dca:chunk=4,local=2", "dca needs an even head dim (RoPE rotates pairs of channels), got D = 7");
  c.D = 8;
  c.mechanism = "dca";
  out.push_back({"dca_alibi", c, [](Inputs& in) { in.options.alibi_slopes = {1, 1}; },
                 "dca does not take ALiBi slopes"});
}

// ---- linear: kernelised weights, right product / recurrence / chunks -------------------------
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

// ---- gau: squared-ReLU weights (quadratic) --------------------------------------------------
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

// ---- efficient: per-feature softmax of the keys over the sequence ----------------------------
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

void linear_bad_cases(std::vector<BadCase>& out) {
  Case c = small_case();
  auto add = [&](const char* name, const char* mech, const char* message) { add_bad_text(out, c, name, mech, message); };
  add("linear_causal_needs_square", "linear:causal", "so N (queries) must equal M (keys), got N = 5, M = 6");
  add("linear_decay_needs_causal", "linear:decay=0.9", "a decay needs causal");
  c.N = c.M = 6;
  add("linear_decay_range", "linear:causal,decay=1.5", "linear decay must be in (0, 1]");
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
  add("polaformer_power", "polaformer:power=1", "polaformer power must be > 1, got 1");
  add("performer_features", "performer:features=0", "performer features must be in [1, 65536], got 0");
  add("sana_eps", "sana:eps=-1", "sana eps must be >= 0");
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

std::vector<Case> build() {
  std::vector<Case> all;
  softmax_check_cases(all);
  sparse_check_cases(all);
  linformer_check_cases(all);
  lsh_check_cases(all);
  dca_check_cases(all);
  linear_check_cases(all);
  gau_check_cases(all);
  efficient_check_cases(all);
  // Bench suite: the foundation's grid (N = M = 1024, 4096; d = 64, 128; softmax and causal;
  // f32 and bf16; 8 heads) and decode against 4096 / 16384 / 65536 cached keys.
  for (Case& c : bench_grid({1024, 4096}, {64, 128}, {"softmax", "softmax:causal"}, {DType::f32, DType::bf16}, 8, 0))
    all.push_back(c);
  for (Case& c : decode_grid({4096, 16384, 65536}, {128}, {DType::f32, DType::bf16}, 8)) all.push_back(c);
  for (Case& c : demo_cases(512, 64, 8)) all.push_back(c);
  // Identical cases appear once (the loops above produce a few twice).
  std::vector<Case> unique;
  std::set<std::string> seen;
  for (Case& c : all)
    if (seen.insert(c.name() + "#" + std::to_string(c.suites) + c.form).second) unique.push_back(std::move(c));
  return unique;
}

}  // namespace

const std::vector<Case>& case_list() {
  static const std::vector<Case> list = build();
  return list;
}

const std::vector<BadCase>& bad_case_list() {
  static const std::vector<BadCase> list = [] {
    std::vector<BadCase> out;
    softmax_bad_cases(out);
    sparse_bad_cases(out);
    linformer_bad_cases(out);
    lsh_bad_cases(out);
    dca_bad_cases(out);
    linear_bad_cases(out);
    return out;
  }();
  return list;
}

}  // namespace attn::harness
