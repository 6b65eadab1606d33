// attn bench: exact-attention throughput as a ratio to the sgemm roofline measured in the
// same run, for the shapes of the foundation issue. One JSON object per case with --json.
#include <fmt/core.h>
#include <omp.h>
#include <sys/resource.h>

#include <cblas.h>

#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "attn/attn.hpp"
#include "commands.hpp"
#include "roofline.hpp"
#include "workload.hpp"

namespace attn::cli {
namespace {

struct BenchArgs {
  std::vector<int64_t> sizes{1024, 4096}, dims{64, 128};
  std::vector<int> threads{1, 2};
  std::vector<std::string> dtypes{"f32", "bf16"};
  std::vector<std::string> mechanisms{"softmax", "softmax:causal"};
  int64_t heads = 8, kv_heads = 0;
  int reps = 2;
  std::string json;
  bool big = false, memory = false;
  std::vector<int64_t> decode;  // cache lengths for decode-shaped cases (N = 1)
};

DType dtype_of(const std::string& s) {
  if (s == "f32") return DType::f32;
  if (s == "bf16") return DType::bf16;
  if (s == "f16") return DType::f16;
  fail("--dtypes", "expected f32, bf16 or f16, got '" + s + "'");
}

// Peak resident memory (VmHWM) in MiB; reset_peak_rss() restarts it from the current RSS
// (Linux >= 4.0), so earlier phases such as the bandwidth buffer do not count.
double peak_rss_mib() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("VmHWM:", 0) == 0) return std::stod(line.substr(6)) / 1024.0;
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_maxrss) / 1024.0;
}

void reset_peak_rss() { std::ofstream("/proc/self/clear_refs") << "5"; }

int run(const BenchArgs& a) {
  std::ofstream json;
  if (!a.json.empty()) {
    json.open(a.json);
    if (!json) fail("--json", "cannot open '" + a.json + "' for writing");
  }
  fmt::print("roofline (same run): ");
  std::map<int, double> roof;
  for (int t : a.threads) {
    roof[t] = sgemm_gflops(2048, t);
    fmt::print("sgemm n=2048 {}T {:.1f} GFLOP/s; ", t, roof[t]);
  }
  std::map<int, double> bws;
  for (int t : a.threads) {
    bws[t] = memory_bandwidth_gbs(t);
    fmt::print("{}read bandwidth {}T {:.1f} GB/s", t == a.threads.front() ? "" : "; ", t, bws[t]);
  }
  const double bw = bws[a.threads.back()];
  fmt::print("\n");
  fmt::print("isa {}, OpenBLAS core {}\n\n", isa_name(active_isa()), openblas_get_corename());

  struct Case { int64_t n, d; std::string dt; Mechanism mech; int threads; };
  std::vector<Case> cases;
  for (int64_t n : a.sizes)
    for (int64_t d : a.dims)
      for (const auto& m : a.mechanisms)
        for (const auto& dt : a.dtypes)
          for (int t : a.threads) cases.push_back({n, d, dt, parse_mechanism(m), t});

  fmt::print("{:>7} {:>6} {:>5} {:<32} {:>5} {:>3} {:>10} {:>9} {:>8}\n", "case", "N=M", "d", "mechanism", "dtype",
             "T", "ms", "GFLOP/s", "ratio");
  size_t idx = 0;
  for (const Case& c : cases) {
    ++idx;
    Workload w;
    w.H = a.heads, w.Hkv = a.kv_heads ? a.kv_heads : a.heads, w.N = w.M = c.n, w.D = c.d, w.dtype = dtype_of(c.dt);
    w.generate();
    const Mechanism& mech = c.mech;
    const auto* softmax = std::get_if<Softmax>(&mech);
    const bool causal = softmax && softmax->causal;
    AttendOptions opt;
    opt.threads = c.threads;
    Tensor out(w.dtype, {w.B, w.H, w.N, w.D});
    const double secs = best_seconds(a.reps, [&] {
      attend_into(w.q.view(), w.k.view(), w.v.view(), mech, opt, out.view(), nullptr, nullptr);
    });
    const double flops = attention_flops(w.q.view(), w.k.view(), w.v.view(), mech);
    const double gflops = flops / secs / 1e9;
    const double ratio = gflops / roof[c.threads];
    fmt::print("{:>3}/{:<3} {:>6} {:>5} {:<32} {:>5} {:>3} {:>10.2f} {:>9.1f} {:>8.3f}\n", idx, cases.size(), c.n, c.d,
               to_string(mech), c.dt, c.threads, secs * 1e3, gflops, ratio);
    std::fflush(stdout);
    if (json) {
      nlohmann::json j = {{"mechanism", to_string(mech)}, {"dtype", c.dt}, {"batch", w.B}, {"heads", w.H},
                          {"kv_heads", w.Hkv}, {"q_len", w.N}, {"kv_len", w.M}, {"head_dim", w.D},
                          {"causal", causal}, {"threads", c.threads}, {"seconds", secs},
                          {"gflops", gflops}, {"roofline_gflops", roof[c.threads]}, {"ratio", ratio},
                          {"isa", isa_name(active_isa())}, {"bandwidth_gbs", bw}};
      json << j.dump() << "\n";
    }
  }

  if (!a.decode.empty()) {  // memory-bound: one query per head against a cache of M keys
    fmt::print("\ndecode (B=1, H={}, N=1): GB/s of K+V read, ratio to the same-run read bandwidth\n", a.heads);
    fmt::print("{:>7} {:>4} {:>4} {:>5} {:>3} {:>10} {:>9} {:>8}\n", "M", "d", "Hkv", "dtype", "T", "ms", "GB/s", "ratio");
    for (int64_t m : a.decode)
      for (int64_t d : a.dims)
        for (int64_t hkv : {a.heads, std::max<int64_t>(1, a.heads / 4)})
          for (const auto& dt : a.dtypes)
            for (int t : a.threads) {
              Workload w;
              w.H = a.heads, w.Hkv = hkv, w.N = 1, w.M = m, w.D = d, w.dtype = dtype_of(dt);
              w.generate();
              AttendOptions opt;
              opt.threads = t;
              Tensor out(w.dtype, {w.B, w.H, 1, w.D});
              const double secs = best_seconds(a.reps * 5, [&] {
                attend_into(w.q.view(), w.k.view(), w.v.view(), Softmax{}, opt, out.view(), nullptr, nullptr);
              });
              const double gbs = 2.0 * static_cast<double>(w.k.view().numel() * dtype_size(w.dtype)) / secs / 1e9;
              fmt::print("{:>7} {:>4} {:>4} {:>5} {:>3} {:>10.3f} {:>9.1f} {:>8.3f}\n", m, d, hkv, dt, t, secs * 1e3, gbs,
                         gbs / bws[t]);
              if (json) {
                nlohmann::json j = {{"mechanism", "softmax"}, {"dtype", dt}, {"batch", 1}, {"heads", w.H},
                                    {"kv_heads", hkv}, {"q_len", 1}, {"kv_len", m}, {"head_dim", d}, {"causal", false},
                                    {"threads", t}, {"seconds", secs}, {"gbs", gbs}, {"bandwidth_gbs", bws[t]},
                                    {"ratio", gbs / bws[t]}, {"isa", isa_name(active_isa())}};
                json << j.dump() << "\n";
              }
            }
  }
  if (a.memory) {  // no N x M allocation: peak RSS at N = M = 32768, d = 64 stays near the inputs
    Workload w;
    w.H = 8, w.Hkv = 8, w.N = w.M = 32768, w.D = 64;
    reset_peak_rss();
    const double before = peak_rss_mib();
    w.generate();
    Tensor out(DType::f32, {w.B, w.H, w.N, w.D});
    const double inputs = peak_rss_mib();
    reset_peak_rss();
    const auto t0 = std::chrono::steady_clock::now();
    attend_into(w.q.view(), w.k.view(), w.v.view(), Softmax{}, AttendOptions{}, out.view(), nullptr, nullptr);
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const double scores_mib = 8.0 * 32768 * 32768 * 4 / (1 << 20);
    const double during = peak_rss_mib();
    fmt::print("\nmemory: N=M=32768 d=64 H=8 fp32: RSS {:.0f} MiB before the inputs, {:.0f} MiB with q/k/v/out "
               "(256 MiB of data); peak during attention {:.0f} MiB (+{:.0f} MiB) in {:.1f} s. "
               "The score matrix alone would be {:.0f} MiB.\n",
               before, inputs, during, during - inputs, secs, scores_mib);
  }
  if (a.big) {  // 64-bit indexing: N*M = 2^32 scores per head, streamed
    Workload w;
    w.H = w.Hkv = 1, w.N = w.M = 65536, w.D = 16;
    w.generate();
    Tensor out(DType::f32, {1, 1, w.N, w.D});
    AttendOptions opt;
    opt.return_lse = false;
    const auto t0 = std::chrono::steady_clock::now();
    attend_into(w.q.view(), w.k.view(), w.v.view(), parse_mechanism("softmax:causal"), opt, out.view(), nullptr, nullptr);
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    // Check the last row against a float64 computation of that row alone.
    const auto& q = w.q.view();
    const auto& k = w.k.view();
    const auto& v = w.v.view();
    const int64_t i = w.N - 1;
    std::vector<double> s(static_cast<size_t>(w.M));
    double mx = -1e300, sum = 0;
    for (int64_t j = 0; j < w.M; ++j) {
      double d = 0;
      for (int64_t c = 0; c < w.D; ++c) d += double(q.at(0, 0, i, c)) * k.at(0, 0, j, c);
      s[j] = d / 4.0;
      mx = std::max(mx, s[j]);
    }
    double err = 0;
    std::vector<double> o(static_cast<size_t>(w.D), 0.0);
    for (int64_t j = 0; j < w.M; ++j) {
      const double e = std::exp(s[j] - mx);
      sum += e;
      for (int64_t c = 0; c < w.D; ++c) o[c] += e * v.at(0, 0, j, c);
    }
    for (int64_t c = 0; c < w.D; ++c) err = std::max(err, std::abs(o[c] / sum - out.at(0, 0, i, c)));
    fmt::print("\nbig: N=M=65536 (N*M = 2^32 > 2^31 scores, streamed), d=16, causal: {:.1f} s, last row max error {:.2e} {}\n",
               secs, err, err < 1e-4 ? "OK" : "FAILED");
    if (err >= 1e-4) return 1;
  }
  return 0;
}

}  // namespace

Runner add_bench(CLI::App& app) {
  auto args = std::make_shared<BenchArgs>();
  CLI::App* c = app.add_subcommand("bench", "Exact attention throughput vs this machine's sgemm roofline");
  c->footer(
      "Reports GFLOP/s (4*N*M*d per head, counting only the (query, key) pairs the mask lets through)\n"
      "and ratio = GFLOP/s divided by\n"
      "OpenBLAS sgemm (n=2048) GFLOP/s on the same thread count, measured first in the same run.\n"
      "Example: attn bench --sizes 4096 --dims 128 --dtypes f32 --threads 2 --json out.jsonl");
  c->add_option("--sizes", args->sizes, "N = M values")->capture_default_str();
  c->add_option("--dims", args->dims, "Head dims")->capture_default_str();
  c->add_option("--threads", args->threads, "Thread counts")->capture_default_str();
  c->add_option("--dtypes", args->dtypes, "f32, bf16, f16")->capture_default_str();
  c->add_option("--mechanisms", args->mechanisms, "Mechanism text forms to time (e.g. softmax:causal,window=256:0)")
      ->capture_default_str();
  c->add_option("--heads", args->heads, "Query heads")->capture_default_str();
  c->add_option("--kv-heads", args->kv_heads, "Key/value heads (0 = same as heads)")->capture_default_str();
  c->add_option("--reps", args->reps, "Timed repetitions per case (best is reported)")->capture_default_str();
  c->add_option("--json", args->json, "Write one JSON object per case to this file");
  c->add_option("--decode", args->decode, "Also time decode-shaped calls (N=1) against these cache lengths")
      ->expected(0, -1);
  c->add_flag("--memory", args->memory, "Also report peak RSS at N=M=32768, d=64");
  c->add_flag("--big", args->big, "Also run N=M=65536 (N*M > 2^31, 64-bit indexing) and check its last row");
  return [args] { return run(*args); };
}

}  // namespace attn::cli
