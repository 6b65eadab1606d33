// attn demo: built-in data, the exact-attention variants side by side: error against the
// float64 reference, time, GFLOP/s. Later mechanisms add their rows here.
#include <fmt/core.h>

#include <omp.h>

#include <cmath>

#include "attn/attn.hpp"
#include "commands.hpp"
#include "workload.hpp"

namespace attn::cli {
namespace {

struct DemoArgs {
  int64_t n = 512, d = 64, heads = 8;
  int threads = 0;
};

struct Variant {
  std::string label, mechanism;
  DType dtype = DType::f32;
  int64_t kv_heads = 0;  // 0: same as heads
  bool alibi = false;
  bool decode = false;   // one query per head against the n keys
};

int run(const DemoArgs& a) {
  const std::vector<Variant> variants = {
      {"MHA", "softmax"},
      {"causal", "softmax:causal"},
      {"sliding window 128", "softmax:causal,window=128:0"},
      {"softcap 30", "softmax:causal,softcap=30"},
      {"ALiBi (slopes 2^(-8h/H))", "softmax:causal", DType::f32, 0, true},
      {"GQA (kv heads = H/4)", "softmax:causal", DType::f32, std::max<int64_t>(1, a.heads / 4)},
      {"MQA (1 kv head)", "softmax:causal", DType::f32, 1},
      {"cosine score", "softmax:score=cosine,scale=10"},
      {"entropy-invariant scale", "softmax:causal,entropy_scale=128"},
      {"bfloat16 storage", "softmax:causal", DType::bf16},
      {"float16 storage", "softmax:causal", DType::f16},
      {"decode: 1 query, GQA", "softmax:causal", DType::f32, std::max<int64_t>(1, a.heads / 4), false, true},
      {"decode: 1 query, bf16", "softmax:causal", DType::bf16, 0, false, true},
  };
  fmt::print("attn demo: B=1 H={} N=M={} d={}, isa {}, {} threads; error = max |fast - float64 reference|\n\n",
             a.heads, a.n, a.d, isa_name(active_isa()), a.threads > 0 ? a.threads : omp_get_max_threads());
  fmt::print("{:<26} {:<32} {:>9} {:>11} {:>10} {:>9}\n", "variant", "mechanism", "dtype", "max error", "time ms", "GFLOP/s");
  for (const Variant& var : variants) {
    Workload w;
    w.H = a.heads, w.Hkv = var.kv_heads ? var.kv_heads : a.heads, w.N = w.M = a.n, w.D = a.d, w.dtype = var.dtype;
    if (var.decode) w.N = 1;
    w.generate();
    const Mechanism mech = parse_mechanism(var.mechanism);
    AttendOptions opt;
    opt.threads = a.threads;
    if (var.alibi)
      for (int64_t h = 0; h < w.H; ++h) opt.alibi_slopes.push_back(std::pow(2.0f, -8.0f * (h + 1) / w.H));
    AttendResult fast;
    const double secs = best_seconds(3, [&] { fast = attend(w.q.view(), w.k.view(), w.v.view(), mech, opt); });
    AttendOptions ref_opt = opt;
    ref_opt.use_reference = true;
    const AttendResult ref = attend(w.q.view(), w.k.view(), w.v.view(), mech, ref_opt);
    double err = 0;
    const auto& o = fast.out.view();
    for (int64_t h = 0; h < o.shape[1]; ++h)
      for (int64_t i = 0; i < o.shape[2]; ++i)
        for (int64_t c = 0; c < o.shape[3]; ++c)
          err = std::max(err, static_cast<double>(std::abs(o.at(0, h, i, c) - ref.out.at(0, h, i, c))));
    const double gflops = attention_flops(w.q.view(), w.k.view(), w.v.view(), mech) / secs / 1e9;
    fmt::print("{:<26} {:<32} {:>9} {:>11.2e} {:>10.3f} {:>9.1f}\n", var.label, var.mechanism + (var.alibi ? " +alibi" : ""), dtype_name(var.dtype),
               err, secs * 1e3, gflops);
  }
  fmt::print("\nThe reference accumulates in float64 over full score rows; bf16/fp16 errors include the\n"
             "rounding of the output to that dtype. `attn bench` measures speed against the sgemm roofline.\n");
  return 0;
}

}  // namespace

Runner add_demo(CLI::App& app) {
  auto args = std::make_shared<DemoArgs>();
  CLI::App* c = app.add_subcommand("demo", "Built-in data: every exact-attention variant side by side");
  c->add_option("-n,--tokens", args->n, "Query and key length")->capture_default_str()->check(CLI::Range(1, 1 << 16));
  c->add_option("-d,--head-dim", args->d, "Head dimension")->capture_default_str()->check(CLI::Range(1, 1024));
  c->add_option("--heads", args->heads, "Query heads")->capture_default_str()->check(CLI::Range(1, 256));
  c->add_option("--threads", args->threads, "Threads (0 = all cores)")->capture_default_str();
  return [args] { return run(*args); };
}

}  // namespace attn::cli
