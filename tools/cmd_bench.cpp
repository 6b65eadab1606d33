// attn bench: exact-attention throughput as a ratio to the sgemm roofline measured in the
// same run, for the shapes of the foundation issue; with --backward, attend_backward's too (on
// 2.5 x the forward's FLOPs, timed_backward.hpp). One JSON object per case and direction with --json.
#include <fmt/core.h>
#include <omp.h>
#include <sys/resource.h>

#include <cblas.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <random>
#include <nlohmann/json.hpp>

#include "attn/attn.hpp"
#include "commands.hpp"
#include "usage.hpp"
#include "json_lines.hpp"
#include "roofline.hpp"
#include "timed_backward.hpp"
#include "harness/check.hpp"
#include "kernels/bf16_tiles.hpp"
#include "harness/inputs.hpp"
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
  bool big = false, memory = false, stats = false, grid_given = false, decode_given = false, layout_given = false,
       page_given = false, backward = false;
  std::vector<int64_t> decode;  // cache lengths for decode-shaped cases (N = 1); none: the list's
  std::string layout = "bhnd";  // of q, k, v in the --decode grid
  int64_t page = 0;              // > 0: the --decode caches are read as pools of pages of this many rows
  harness::Filter filter;
  std::string case_options;  // the options that shape the cases, as typed (for messages)
  std::string precision = "auto";  // AttendOptions::precision of every forward case
};

// The same-run ceilings a row's ratio divides by: OpenBLAS sgemm for float32 products, the bf16
// dot-product peak (vdpbf16ps) for rows computed in bf16 where the CPU has it.
struct Rooflines {
  std::map<int, double> sgemm, f32_fma, bf16_dot, int8_dot;
  // The roofline of a row of `form` on `threads` threads: its name and GFLOP/s.
  std::pair<const char*, double> of(const std::string& form, int threads) const {
    // bf16 products on vdpbf16ps: the bf16 peak; on float32 instructions (no AVX512-BF16 on the
    // active ISA): sgemm's, like every float32 row
    if (harness::bf16_products(form) && kernels::bf16_kernels_for(active_isa()) && bf16_dot.at(threads) > 0)
      return {"bf16-dot", bf16_dot.at(threads)};
    return {"sgemm", sgemm.at(threads)};
  }
};

DType dtype_of(const std::string& s) {
  if (s == "f32") return DType::f32;
  if (s == "bf16") return DType::bf16;
  if (s == "f16") return DType::f16;
  fail("--dtypes", "expected f32, bf16 or f16, got '" + s + "'");
}

// --mechanisms: each text must parse (before the grid is made of it).
void check_mechanism_text(const std::string& text) {
  try {
    parse_mechanism(text);
  } catch (const Error& e) {
    fail("--mechanisms", e.what());
  }
}

std::vector<harness::Run> joined(std::vector<harness::Run> a, const std::vector<harness::Run>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// The options among `names` given on the command line, as typed ("--heads 3 --kv-heads 2").
std::string given_options(const CLI::App& c, std::initializer_list<const char*> names) {
  std::string out;
  for (const char* name : names) {
    if (c.count(name) == 0) continue;
    out += (out.empty() ? "" : " ") + std::string(name);
    for (const std::string& v : c.get_option(name)->results()) out += " " + v;
  }
  return out.empty() ? "the bench suite" : out;
}

std::string short_name(DType t) { return t == DType::f32 ? "f32" : t == DType::bf16 ? "bf16" : "f16"; }

// A run's inputs, output and chosen form, ready to time.
struct Timed {
  harness::Inputs in;
  Tensor out;
  std::string form;
  Timed(const harness::Run& r, Precision precision) {
    const harness::Case& c = *r.c;
    harness::make_inputs(c, in);
    in.options.return_lse = false;
    in.options.form = r.form;
    in.options.precision = precision;
    out = Tensor(c.dtype, {c.B, c.H, c.N, c.Dv});
    form = explain(in.q.view, in.k.view, in.v.view, in.mechanism, in.options).chosen;
  }
  // Best of `reps` calls on `threads` threads (after warm-up); with stats, also streaming the
  // row statistics (return_stats, k = 8).
  double seconds(int threads, int reps, bool stats = false) {
    in.options.threads = threads;
    if (stats && stat_rows.empty()) {
      const TensorView& q = in.q.view;
      for (int s = 0; s < 4; ++s) stat_rows.emplace_back(DType::f32, std::array<int64_t, 4>{q.shape[0], q.shape[1], q.shape[2], 1});
    }
    const RowStatsViews views = stats ? RowStatsViews{stat_rows[0].view(), stat_rows[1].view(), stat_rows[2].view(),
                                                      stat_rows[3].view()}
                                      : RowStatsViews{};
    size_t turn = 0;  // with copies, each call reads the next (k, v) pair
    return best_seconds(reps, [&] {
      const size_t i = turn++ % (kv.size() + 1);  // 0: the inputs themselves
      const TensorView& k = i == 0 ? in.k.view : kv[i - 1].first.view;
      const TensorView& v = i == 0 ? in.v.view : kv[i - 1].second.view;
      attend_into(in.q.view, as_pages(k), as_pages(v), in.mechanism, in.options, out.view(), nullptr, nullptr, nullptr,
                  stats ? &views : nullptr);
    });
  }
  // From now on k and v are read as pools of pages of `rows` rows through a shuffled block table
  // (the cache's M rows must fill whole pages).
  void page_kv(int64_t rows) {
    page = rows;
    const int64_t blocks = in.k.view.shape[2] / rows;
    PagedKv paged{std::vector<int32_t>(static_cast<size_t>(blocks)), blocks, in.k.view.shape[2]};
    for (int64_t b = 0; b < blocks; ++b) paged.block_table[static_cast<size_t>(b)] = static_cast<int32_t>(b);
    std::shuffle(paged.block_table.begin(), paged.block_table.end(), std::mt19937(7));
    in.options.paged = std::move(paged);
  }
  // A (1, Hkv, M, D) cache in either layout as the pool (M / page, Hkv, page, D) of its pages.
  TensorView as_pages(TensorView t) const {
    if (page == 0) return t;
    t.strides = {page * t.strides[2], t.strides[1], t.strides[2], t.strides[3]};
    t.shape = {t.shape[2] / page, t.shape[1], page, t.shape[3]};
    return t;
  }
  int64_t page = 0;
  // Copies of k and v until they and the inputs hold at least `bytes` (at most 16 pairs), so that
  // calls taking turns read from memory, not from a cache the last call filled.
  void cycle_kv(double bytes) {
    kv.clear();
    const auto copy = [](const harness::Buffer& b) {
      harness::Buffer c{b.bytes, b.view};
      c.view.data = c.bytes.data() + (static_cast<const uint8_t*>(b.view.data) - b.bytes.data());
      return c;
    };
    const double pair = static_cast<double>(in.k.bytes.size() + in.v.bytes.size());
    for (double held = pair; held < bytes && kv.size() < 15; held += pair) kv.emplace_back(copy(in.k), copy(in.v));
  }
  std::vector<Tensor> stat_rows;
  std::vector<std::pair<harness::Buffer, harness::Buffer>> kv;
};

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

// One JSON row of the throughput table: `direction` "forward" (attend) or "backward"
// (attend_backward); flops is what the row's gflops and ratio count (backward: 2.5 x the forward's).
// `roofline` names what roofline_gflops and ratio are measured against ("sgemm" or "bf16-dot");
// sgemm_ratio is always against sgemm, so rows of either precision compare.
nlohmann::json row_json(const harness::Case& c, const Mechanism& m, const char* direction, const std::string& form,
                        int threads, double secs, double flops, const Rooflines& roofs, double bw) {
  const double gflops = flops / secs / 1e9;
  const auto [roof_name, roof] = roofs.of(form, threads);
  return {{"mechanism", to_string(m)}, {"dtype", short_name(c.dtype)}, {"batch", c.B}, {"heads", c.H},
          {"kv_heads", c.Hkv}, {"q_len", c.N}, {"kv_len", c.M}, {"head_dim", c.D}, {"causal", info(m).causal},
          {"direction", direction}, {"form", form}, {"threads", threads}, {"seconds", secs}, {"flops", flops},
          {"gflops", gflops}, {"roofline", roof_name}, {"roofline_gflops", roof}, {"ratio", gflops / roof},
          {"sgemm_gflops", roofs.sgemm.at(threads)}, {"sgemm_ratio", gflops / roofs.sgemm.at(threads)},
          {"isa", isa_name(active_isa())}, {"bandwidth_gbs", bw}};
}

int run(const BenchArgs& a) {
  for (const auto& [given, name] : {std::pair{a.layout_given, "--layout"}, std::pair{a.page_given, "--page"}})
    if (given && a.decode.empty())
      fail(name, "applies to the --decode cases: give their cache lengths, e.g. --decode 32768");
  for (int64_t m : a.decode)
    if (a.page > 0 && m % a.page != 0)
      fail("--page", "the cache lengths must be whole pages: " + std::to_string(m) + " is not a multiple of " +
                         std::to_string(a.page));
  // The cases, every one checked before anything is measured: the list's bench suite, or the
  // grid given on the command line; the decode cases with --decode.
  std::vector<DType> dtypes;
  for (const auto& d : a.dtypes) dtypes.push_back(dtype_of(d));
  for (const std::string& m : a.mechanisms) check_mechanism_text(m);
  const std::vector<harness::Case> grid =
      a.grid_given ? harness::bench_grid(a.sizes, a.dims, a.mechanisms, dtypes, a.heads, a.kv_heads)
                   : std::vector<harness::Case>{};
  std::vector<harness::Case> dgrid =
      a.decode.empty() ? std::vector<harness::Case>{} : harness::decode_grid(a.decode, a.dims, dtypes, a.heads);
  for (harness::Case& c : dgrid) c.layout = a.layout == "bnhd" ? Layout::bnhd : Layout::bhnd;
  const auto forward = [&](const harness::Filter& f) {
    return harness::expand(a.grid_given ? grid : harness::case_list(), harness::kBench, f);
  };
  const auto decode = [&](const harness::Filter& f) {
    return a.decode_given ? harness::expand(a.decode.empty() ? harness::case_list() : dgrid, harness::kDecode, f)
                          : std::vector<harness::Run>{};
  };
  selected_runs([&](const harness::Filter& f) { return joined(forward(f), decode(f)); }, a.filter,
                "bench runs on the active ISA (ATTN_ISA sets it)");
  const auto runs = forward(a.filter), druns = decode(a.filter);
  check_runs_start(joined(runs, druns), a.case_options);

  const Precision precision = parse_precision(a.precision, "--precision");
  JsonLines json("--json", a.json);  // checked and opened now; replaced at its first line
  fmt::print("roofline (same run): ");
  Rooflines roofs;
  for (int t : a.threads) {
    roofs.sgemm[t] = sgemm_gflops(2048, t);
    fmt::print("sgemm n=2048 {}T {:.1f} GFLOP/s; ", t, roofs.sgemm[t]);
  }
  std::map<int, double> bws;
  for (int t : a.threads) {
    bws[t] = memory_bandwidth_gbs(t);
    fmt::print("{}read bandwidth {}T {:.1f} GB/s", t == a.threads.front() ? "" : "; ", t, bws[t]);
  }
  const double bw = bws[a.threads.back()];
  fmt::print("\npeaks (same run, register-resident chains; 0: not on this CPU): ");
  for (int t : a.threads) {
    roofs.f32_fma[t] = f32_fma_gflops(t);
    roofs.bf16_dot[t] = bf16_dot_gflops(t);
    roofs.int8_dot[t] = int8_dot_gops(t);
    fmt::print("{}{}T f32 FMA {:.0f}, bf16 dot {:.0f} GFLOP/s, int8 dot {:.0f} GOP/s", t == a.threads.front() ? "" : "; ",
               t, roofs.f32_fma[t], roofs.bf16_dot[t], roofs.int8_dot[t]);
  }
  fmt::print("\nratio: to sgemm, or to the bf16 dot peak for rows computed in bf16 (roof column)\n");
  fmt::print("isa {}, OpenBLAS core {}\n\n", isa_name(active_isa()), openblas_get_corename());

  fmt::print("{:>7} {:>6} {:>5} {:<32} {:>5} {:<10} {:<3} {:>3} {:>10} {:>9} {:>8} {:<8}\n", "case", "N=M", "d",
             "mechanism", "dtype", "form", "dir", "T", "ms", "GFLOP/s", "ratio", "roof");
  const size_t total = runs.size() * a.threads.size();
  size_t idx = 0;
  for (const harness::Run& r : runs) {
    const harness::Case& c = *r.c;
    Timed run(r, precision);
    const harness::Inputs& in = run.in;
    const std::string& form = run.form;
    const double flops = c.flops();
    for (int t : a.threads) {
      ++idx;
      const double secs = run.seconds(t, a.reps);
      const double gflops = flops / secs / 1e9;
      const auto [roof_name, roof] = roofs.of(form, t);
      fmt::print("{:>3}/{:<3} {:>6} {:>5} {:<32} {:>5} {:<10} {:<3} {:>3} {:>10.2f} {:>9.1f} {:>8.3f} {:<8}\n", idx,
                 total, c.N, c.D, c.mechanism, short_name(c.dtype), form, "fwd", t, secs * 1e3, gflops, gflops / roof,
                 roof_name);
      double stats_secs = 0;
      if (a.stats) {
        stats_secs = run.seconds(t, a.reps, true);
        fmt::print("{:>50} {:>10.2f} ms with return_stats: {:+.1f} %\n", "", stats_secs * 1e3,
                   (stats_secs / secs - 1) * 100);
      }
      std::fflush(stdout);
      if (json) {
        nlohmann::json j = row_json(c, in.mechanism, "forward", form, t, secs, flops, roofs, bw);
        j["precision"] = a.precision;
        if (a.stats) j["seconds_with_stats"] = stats_secs;
        json.line(j.dump());
      }
    }
    if (a.backward) {  // the same case's backward, from its forward's out and lse
      TimedBackward back(c, precision);
      if (!back.refusal.empty()) {
        fmt::print("{:>7} no backward: {}\n", "", back.refusal);
        continue;
      }
      const double bflops = kBackwardFlopsPerForwardFlop * flops;
      for (int t : a.threads) {
        const double secs = back.seconds(t, a.reps);
        const double gflops = bflops / secs / 1e9;
        const auto [roof_name, roof] = roofs.of(back.form, t);
        fmt::print("{:>7} {:>6} {:>5} {:<32} {:>5} {:<10} {:<3} {:>3} {:>10.2f} {:>9.1f} {:>8.3f} {:<8}\n", "", c.N,
                   c.D, c.mechanism, short_name(c.dtype), back.form, "bwd", t, secs * 1e3, gflops, gflops / roof,
                   roof_name);
        std::fflush(stdout);
        if (json) json.line(row_json(c, back.in.mechanism, "backward", back.form, t, secs, bflops, roofs, bw).dump());
      }
    }
  }

  if (a.decode_given) {  // memory-bound: one query per head against a cache of M keys
    fmt::print("\ndecode (B=1, N=1, {}{}): GB/s of K+V read; ratio to the read bandwidth measured just before each "
               "row\n",
               a.decode.empty() ? "the list's layouts" : a.layout,
               a.page > 0 ? fmt::format(", pages of {} rows in shuffled order", a.page) : std::string());
    fmt::print("{:>7} {:>4} {:>4} {:>4} {:>5} {:<6} {:>3} {:>10} {:>9} {:>9} {:>8}\n", "M", "d", "H", "Hkv", "dtype",
               "form", "T", "ms", "GB/s", "roof GB/s", "ratio");
    for (const harness::Run& r : druns) {
      const harness::Case& c = *r.c;
      Timed run(r, precision);
      run.cycle_kv(1 << 30);  // each call reads its cache from memory, not from the last level cache
      if (a.page > 0) run.page_kv(a.page);  // only with cache lengths (checked above)
      const harness::Inputs& in = run.in;
      const std::string& form = run.form;
      for (int t : a.threads) {
        // this machine's bandwidth can move between minutes: the row's own roofline sample
        const double roof = memory_bandwidth_gbs(t);
        const double secs = run.seconds(t, a.reps * 5);
        const double gbs = c.kv_bytes() / secs / 1e9;
        fmt::print("{:>7} {:>4} {:>4} {:>4} {:>5} {:<6} {:>3} {:>10.3f} {:>9.1f} {:>9.1f} {:>8.3f}\n", c.M, c.D, c.H,
                   c.Hkv, short_name(c.dtype), form, t, secs * 1e3, gbs, roof, gbs / roof);
        if (a.stats) {
          const double with = run.seconds(t, a.reps * 5, true);
          fmt::print("{:>44} {:>10.3f} ms with return_stats: {:+.1f} %\n", "", with * 1e3, (with / secs - 1) * 100);
        }
        if (json) {
          nlohmann::json j = {{"mechanism", to_string(in.mechanism)}, {"dtype", short_name(c.dtype)}, {"batch", c.B},
                              {"heads", c.H}, {"kv_heads", c.Hkv}, {"q_len", c.N}, {"kv_len", c.M},
                              {"head_dim", c.D}, {"causal", false}, {"form", form}, {"direction", "forward"},
                              {"threads", t},
                              {"seconds", secs}, {"gbs", gbs}, {"bandwidth_gbs", roof}, {"ratio", gbs / roof},
                              {"layout", c.layout == Layout::bnhd ? "bnhd" : "bhnd"}, {"page", run.page},
                              {"isa", isa_name(active_isa())}};
          json.line(j.dump());
        }
      }
    }
  }
  if (a.memory) {  // no N x M allocation: peak RSS at N = M = 32768, d = 64 stays near the inputs
    reset_peak_rss();
    const double before = peak_rss_mib();
    std::mt19937 rng(42);
    const auto q = harness::random_tensor(rng, DType::f32, 1, 8, 32768, 64);
    const auto k = harness::random_tensor(rng, DType::f32, 1, 8, 32768, 64);
    const auto v = harness::random_tensor(rng, DType::f32, 1, 8, 32768, 64);
    Tensor out(DType::f32, {1, 8, 32768, 64});
    const double inputs = peak_rss_mib();
    reset_peak_rss();
    const auto t0 = std::chrono::steady_clock::now();
    attend_into(q.view, k.view, v.view, Softmax{}, AttendOptions{}, out.view(), nullptr, nullptr);
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const double scores_mib = 8.0 * 32768 * 32768 * 4 / (1 << 20);
    const double during = peak_rss_mib();
    fmt::print("\nmemory: N=M=32768 d=64 H=8 fp32: RSS {:.0f} MiB before the inputs, {:.0f} MiB with q/k/v/out "
               "(256 MiB of data); peak during attention {:.0f} MiB (+{:.0f} MiB) in {:.1f} s. "
               "The score matrix alone would be {:.0f} MiB.\n",
               before, inputs, during, during - inputs, secs, scores_mib);
  }
  if (a.big) {  // 64-bit indexing: N*M = 2^32 scores per head, streamed
    struct { int64_t N = 65536, M = 65536, D = 16; } w;
    std::mt19937 rng(42);
    const auto qb = harness::random_tensor(rng, DType::f32, 1, 1, w.N, w.D);
    const auto kb = harness::random_tensor(rng, DType::f32, 1, 1, w.M, w.D);
    const auto vb = harness::random_tensor(rng, DType::f32, 1, 1, w.M, w.D);
    Tensor out(DType::f32, {1, 1, w.N, w.D});
    const auto t0 = std::chrono::steady_clock::now();
    attend_into(qb.view, kb.view, vb.view, parse_mechanism("softmax:causal"), AttendOptions{}, out.view(), nullptr,
                nullptr);
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    // Check the last row against a float64 computation of that row alone.
    const auto& q = qb.view;
    const auto& k = kb.view;
    const auto& v = vb.view;
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
  json.close();
  return 0;
}

}  // namespace

Runner add_bench(CLI::App& app) {
  auto args = std::make_shared<BenchArgs>();
  CLI::App* c = app.add_subcommand("bench", "Throughput of the case list's bench suite vs this machine's roofline");
  c->footer(
      "By default times the bench suite of the case list (harness/case_list.cpp): N = M = 1024, 4096;\n"
      "d = 64, 128; softmax and softmax:causal; f32 and bf16; 8 heads; and softmax:causal,window=256:0,sinks=4\n"
      "at N = M = 16384, d = 128, f32; on 1 and 2 threads. --sizes,\n"
      "--dims, --mechanisms, --dtypes, --heads, --kv-heads replace it with that grid.\n"
      "Reports GFLOP/s (2 (D + Dv) per (query, key) pair the mask lets through) and ratio = GFLOP/s\n"
      "divided by OpenBLAS sgemm (n=2048) GFLOP/s on the same thread count, measured first in the same run.\n"
      "--decode times one query per head against a cache (GB/s of K+V read vs the read bandwidth sampled\n"
      "just before each row; calls take turns over copies of the cache, >= 1 GiB in all, so that each\n"
      "reads from memory); --layout bnhd gives the caches flash-attn's layout, --page 16 reads them as a\n"
      "paged cache of 16-row pages.\n"
      "--backward also times attend_backward after each case's forward (rows marked bwd; JSON rows carry\n"
      "\"direction\": \"backward\", forward rows \"forward\"): dq, dk, dv from the forward's out and lse and a\n"
      "random dout, the backward's own form walk; GFLOP/s and ratio on 2.5 x the forward's FLOPs (recompute\n"
      "q.k, dO.v, dV, dQ, dK: 10 d per pair against the forward's 4 d), against the same sgemm roofline.\n"
      "Training-sized cases:\n"
      "  attn bench --backward --sizes 4096 --dims 128 --dtypes f32 --threads 2 --mechanisms softmax softmax:causal\n"
      "  attn bench --backward --sizes 16384 --dims 128 --dtypes f32 --threads 2 --mechanisms softmax:causal,window=256:0,sinks=4\n"
      "A small forward, then decoding against a 32k-token cache (32 heads, bnhd):\n"
      "  attn bench --sizes 64 --mechanisms softmax --dims 128 --heads 32 --threads 2 --decode 32768 --layout bnhd\n"
      "Example: attn bench --sizes 4096 --dims 128 --dtypes f32 --threads 2 --json out.jsonl");
  c->add_option("--sizes", args->sizes, "N = M values")->capture_default_str()->check(in_range(int64_t{1}, int64_t{1} << 20));
  c->add_option("--dims", args->dims, "Head dims")->capture_default_str()->check(in_range(int64_t{1}, int64_t{4096}));
  c->add_option("--threads", args->threads, "Thread counts (1 to 256)")->capture_default_str()->check(in_range(1, 256));
  c->add_option("--dtypes", args->dtypes, "f32, bf16, f16")->capture_default_str();
  c->add_option("--mechanisms", args->mechanisms, "Mechanism text forms to time (e.g. softmax:causal,window=256:0)")
           ->capture_default_str();
  c->add_option("--heads", args->heads, "Query heads")->capture_default_str()->check(in_range(int64_t{1}, int64_t{1024}));
  c->add_option("--kv-heads", args->kv_heads, "Key/value heads (0 = same as heads)")->capture_default_str()
      ->check(in_range(int64_t{0}, int64_t{1024}));
  c->add_option("--reps", args->reps, "Timed repetitions per case (best is reported)")->capture_default_str()
      ->check(in_range(1, 1000));
  c->add_option("--json", args->json, "Write one JSON object per case to this file, a line per finished case (an existing file is\n"
                "replaced when the first case is done)");
  c->add_option("--decode", args->decode,
                "Also time decode-shaped calls (N=1) against these cache lengths (none given: the list's 4096 16384 65536)")
      ->expected(0, -1)
      ->check(in_range(int64_t{1}, int64_t{1} << 30));
  c->add_option("--layout", args->layout,
                "Layout of q, k, v in the --decode cases (with cache lengths given): bhnd (B, H, M, D), or "
                "bnhd (B, M, H, D), flash-attn's KV caches, where a key's rows of every kv head are adjacent")
      ->check(CLI::IsMember({"bhnd", "bnhd"}))
      ->capture_default_str();
  c->add_option("--page", args->page,
                "Read the --decode caches (with cache lengths given) as pools of pages of this many rows through "
                "a shuffled block table, as a paged KV cache is read (0: contiguous)")
      ->check(in_range(int64_t{0}, int64_t{1} << 20))
      ->capture_default_str();
  c->add_flag("--backward", args->backward,
              "Also time the backward (attend_backward, training) of every case whose mechanism has one, on 2.5 x the "
              "forward's FLOPs; JSON rows carry \"direction\": \"backward\" (forward rows \"forward\")");
  c->add_option("--precision", args->precision,
                "Products of exact attention (AttendOptions::precision): auto (bf16 when q, k, v are bf16), f32, bf16; "
                "rows computed in bf16 report their ratio to the bf16 dot peak")
      ->check(CLI::IsMember({"auto", "f32", "bf16"}))
      ->capture_default_str();
  c->add_flag("--memory", args->memory, "Also report peak RSS at N=M=32768, d=64");
  c->add_flag("--stats", args->stats,
              "Also time each case with streamed row statistics (return_stats, k = 8) and report the extra time");
  c->add_flag("--big", args->big, "Also run N=M=65536 (N*M > 2^31, 64-bit indexing) and check its last row");
  add_filter_options(c, args->filter);
  return [args, c] {
    args->decode_given = c->count("--decode") > 0;
    args->layout_given = c->count("--layout") > 0;
    args->page_given = c->count("--page") > 0;
    for (const char* o : {"--sizes", "--dims", "--dtypes", "--mechanisms", "--heads", "--kv-heads"})
      args->grid_given = args->grid_given || c->count(o) > 0;
    args->case_options = given_options(*c, {"--mechanisms", "--sizes", "--dims", "--dtypes", "--heads", "--kv-heads",
                                            "--decode", "--layout", "--form"});
    return run(*args);
  };
}

}  // namespace attn::cli
