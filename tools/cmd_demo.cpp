// attn demo: the demo suite of the case list on built-in data, side by side: which form ran,
// error against the float64 reference and the tolerance it must meet, time, GFLOP/s.
#include <fmt/core.h>

#include <cmath>

#include <algorithm>
#include <optional>

#include <omp.h>

#include "attn/attn.hpp"
#include "families/internal_api.hpp"
#include "harness/backward_check.hpp"
#include "base/parallel.hpp"
#include "commands.hpp"
#include "model_option.hpp"
#include "usage.hpp"
#include "text_model.hpp"
#include "workload.hpp"

namespace attn::cli {
namespace {

struct DemoArgs {
  int64_t n = 512, d = 64, heads = 8;
  int threads = 0;
  harness::Filter filter;
  std::vector<std::string> models;  // GGUF language models: a real-model section each
};

// A real language model answering one question with exact attention and with short windows, so
// what a mechanism does to a model's text is seen, not only its error on random data. A model
// trained with sliding-window layers (Gemma 3) runs as trained, with every layer global, and with
// the short window everywhere; a model without a chat template continues a sentence instead.
void model_section(const std::string& path, int threads) {
  TextModel as_trained({path, "q4_1", "", threads, 1024});  // also the first run of a hybrid
  const std::vector<DecoderLayerSpec>& layers = as_trained.decoder().config().layers;
  const int64_t local = std::count_if(layers.begin(), layers.end(), [](const DecoderLayerSpec& l) { return l.local; });
  const bool chat = as_trained.tokenizer().has_chat_template();
  const std::string question = chat ? "Explain in two sentences why the sky is blue." : "Once upon a time";
  fmt::print("\nA real model through attn: {}\n{}: {}\n", path, chat ? "Q" : "Continue", question);
  if (local)
    fmt::print("Trained with {} sliding-window layers and {} global ones: run as trained, with every layer global,\n"
               "and with a window of 16 keys + 4 sinks everywhere.\n", local, static_cast<int64_t>(layers.size()) - local);
  const std::vector<std::pair<std::string, std::string>> runs =
      local ? std::vector<std::pair<std::string, std::string>>{{"", "as trained"},
                                                               {"softmax:causal", "every layer global"},
                                                               {"softmax:causal,window=15:0,sinks=4", ""}}
            : std::vector<std::pair<std::string, std::string>>{{"softmax:causal", ""},
                                                               {"softmax:causal,window=15:0,sinks=4", ""},
                                                               {"softmax:causal,window=15:0", ""}};
  for (const auto& [mechanism, label] : runs) {
    std::optional<TextModel> other;
    if (!mechanism.empty()) other.emplace(TextModelOptions{path, "q4_1", mechanism, threads, 1024});
    TextModel& m = other ? *other : as_trained;
    const std::vector<int32_t> prompt =
        m.prompt_ids(chat ? m.tokenizer().chat_prompt({{"user", question}}, true) : question);
    fmt::print("\n[{}]\n", label.empty() ? mechanism : label + (mechanism.empty() ? "" : ": " + mechanism));
    std::fflush(stdout);
    ReplyStats stats;
    m.reply(prompt, 60, {}, [](const std::string& piece) { fmt::print("{}", piece), std::fflush(stdout); }, stats);
    fmt::print("\n  ({})\n", m.stats_line(stats));
  }
  if (local)
    fmt::print("\nA sliding-window layer's cache is allocated once for its window (here, after a few dozen tokens,\n"
               "the larger part) and stays that size at any context, where a global layer's grows by its bytes per\n"
               "token. What each choice costs over thousands of tokens: `attn eval-ppl --model {}` and\n"
               "`python -m attn.lab gemma` (perplexity as trained, all local, all global).\n", path);
  else
    fmt::print("\nExact attention answers; a window of 16 keys plus 4 attention sinks keeps much of it; the same\n"
               "window without sinks loses the thread. `attn eval-ppl` measures this as perplexity.\n");
}

// Mean sparsity and mean effective keys (exp of the entropy) over the rows of the call, from its
// streamed row statistics; "-" where a row's entropy is undefined (signed weights).
std::pair<std::string, std::string> concentration_of(const harness::Inputs& in) {
  AttendOptions o = in.options;
  o.return_lse = false;
  o.return_stats = true;
  const AttendResult r = attend(in.q.view, in.k.view, in.v.view, in.mechanism, o);
  double s = 0, keys = 0;
  int64_t n = 0, nk = 0;
  for (int64_t e = 0; e < r.sparsity.view().numel(); ++e) {
    const float x = static_cast<const float*>(r.sparsity.view().data)[e];
    const float h = static_cast<const float*>(r.entropy.view().data)[e];
    if (x == x) s += x, ++n;
    if (h == h) keys += std::exp(static_cast<double>(h)), ++nk;
  }
  return {n ? fmt::format("{:.3f}", s / static_cast<double>(n)) : "-",
          nk == n && nk ? fmt::format("{:.0f}", keys / static_cast<double>(nk)) : "-"};
}

// Training: the gradients of the demo's float32 rows whose mechanism has a backward, by the form
// attend_backward walks to, against the float64 backward reference (tolerance: 3x a plain float32 backward's error), timed
// (best of 3, the forward's out and lse as inputs, as in a training step).
int gradients_section(const std::vector<harness::Case>& cases, const harness::Filter& filter, int threads, size_t mw) {
  fmt::print("\nGradients (attend_backward: dq, dk, dv for a random dout; float32 rows whose mechanism has one):\n");
  fmt::print("{:<{}} {:<9} {:>10} {:>10} {:>4} {:>9} {:>8}\n", "mechanism", mw, "form", "max error", "tolerance", "",
             "time ms", "GFLOP/s");
  int failed = 0;
  std::vector<std::string> seen;
  for (const harness::Run& r : harness::expand(cases, harness::kDemo, filter)) {
    const harness::Case& c = *r.c;
    if (c.dtype != DType::f32 || std::find(seen.begin(), seen.end(), c.mechanism) != seen.end()) continue;
    seen.push_back(c.mechanism);
    harness::Inputs in;
    harness::make_inputs(c, in);
    AttendOptions o = in.options;
    o.return_lse = o.return_probs = o.return_stats = o.return_final_state = false;
    o.form.clear();
    o.threads = threads;
    if (!families::backward_refusal(in.q.view, in.k.view, in.v.view, in.mechanism, o).empty()) continue;
    AttendOptions fo = o;
    fo.return_lse = info(in.mechanism).has_lse;
    const AttendResult fwd = attend(in.q.view, in.k.view, in.v.view, in.mechanism, fo);
    const harness::GradientReferences ref = harness::gradient_references_for(c, in);
    AttendGradients g;
    const double secs = best_seconds(3, [&] {
      g = attend_backward(ref.dout.view, in.q.view, in.k.view, in.v.view, fwd.out.view(), fwd.lse.view(), in.mechanism, o);
    });
    const std::string form = explain_backward(in.q.view, in.k.view, in.v.view, in.mechanism, o).chosen;
    harness::Outcome out;
    harness::check_gradients(g, ref, form, out);
    failed += !out.pass;
    fmt::print("{:<{}} {:<9} {:>10.2e} {:>10.2e} {:>4} {:>9.3f} {:>8.1f}\n", c.mechanism, mw, form, out.err, out.tol,
               out.pass ? "ok" : "FAIL", secs * 1e3, 2.5 * c.flops() / secs / 1e9);
    if (!out.pass) fmt::print("    {}\n", out.failure);
    std::fflush(stdout);
  }
  fmt::print("GFLOP/s of a backward: on 2.5x the forward's FLOPs (flash-attention's count).\n");
  return failed;
}

int run(const DemoArgs& a) {
  const std::vector<harness::Case> cases = harness::demo_cases(a.n, a.d, a.heads);
  const auto runs = selected_runs([&](const harness::Filter& f) { return harness::expand(cases, harness::kDemo, f); },
                                  a.filter, "demo runs on the active ISA (ATTN_ISA sets it)");
  check_runs_start(runs, fmt::format("-n {} -d {} --heads {}{}", a.n, a.d, a.heads,
                                     a.filter.form.empty() ? "" : " --form " + a.filter.form));
  fmt::print("attn demo: B=1 H={} N=M={} d={}, isa {}, {} threads; error = max |attn - float64 reference|,\n"
             "tolerance = 2 x the error of a plain same-dtype implementation + a rounding floor\n\n",
             a.heads, a.n, a.d, isa_name(active_isa()), resolve_threads(a.threads, int64_t{1} << 30));
  size_t lw = 7, mw = 9;  // columns as wide as the longest label and mechanism
  for (const harness::Run& r : runs) {
    lw = std::max(lw, r.c->label.size());
    mw = std::max(mw, r.c->mechanism.size() + (r.c->extras.alibi ? 7 : 0));
  }
  fmt::print("{:<{}} {:<{}} {:>8} {:<9} {:>10} {:>10} {:>4} {:>9} {:>8} {:>6} {:>6}\n", "variant", lw, "mechanism", mw,
             "dtype", "form", "max error", "tolerance", "", "time ms", "GFLOP/s", "S", "keys");
  int failed = 0;
  for (const harness::Run& r : runs) {
    const harness::Case& c = *r.c;
    harness::Inputs in;
    harness::make_inputs(c, in);
    in.options.threads = a.threads;
    in.options.form = r.form;
    const bool lse = in.options.return_lse;  // timed without it, checked with it
    in.options.return_lse = false;
    AttendResult out;
    const double secs = best_seconds(3, [&] { out = attend(in.q.view, in.k.view, in.v.view, in.mechanism, in.options); });
    in.options.return_lse = lse;
    const harness::References ref = harness::references_for(c, in);
    const harness::Outcome o = harness::check_run(r, in, ref);
    failed += !o.pass;
    const double gflops = c.flops() / secs / 1e9;
    const auto [sparsity, keys] = concentration_of(in);
    fmt::print("{:<{}} {:<{}} {:>8} {:<9} {:>10.2e} {:>10.2e} {:>4} {:>9.3f} {:>8.1f} {:>6} {:>6}\n", c.label, lw,
               c.mechanism + (c.extras.alibi ? " +alibi" : ""), mw, dtype_name(c.dtype), o.form, o.err, o.tol,
               o.pass ? "ok" : "FAIL", secs * 1e3, gflops, sparsity, keys);
    if (!o.pass) fmt::print("    {}\n", o.failure);
    std::fflush(stdout);
  }
  fmt::print("\nThe reference accumulates in float64 over full score rows; bf16/fp16 errors include the\n"
             "rounding of the output to that dtype. `attn bench` measures speed against the sgemm roofline;\n"
             "`attn run --explain` tells which form runs a call and why. S and keys: how concentrated the\n"
             "rows are, streamed out of the call (return_stats): mean sparsity E|a|/sqrt(E a^2) (1 = even,\n"
             "1/sqrt(n) = one key) and mean effective keys exp(entropy) per row (docs/concentration.md).\n");
  failed += gradients_section(cases, a.filter, a.threads, mw);
  for (const std::string& model : a.models) model_section(model, a.threads);
  return failed ? 1 : 0;
}

}  // namespace

Runner add_demo(CLI::App& app) {
  auto args = std::make_shared<DemoArgs>();
  CLI::App* c = app.add_subcommand("demo", "Built-in data: every mechanism variant side by side (error, tolerance, speed)");
  c->add_option("-n,--tokens", args->n, "Query and key length")->capture_default_str()->check(in_range(1, 1 << 16));
  c->add_option("-d,--head-dim", args->d, "Head dimension")->capture_default_str()->check(in_range(1, 1024));
  c->add_option("--heads", args->heads, "Query heads")->capture_default_str()->check(in_range(1, 256));
  c->add_option("--threads", args->threads, "Threads (0 = all cores)")->capture_default_str()->check(in_range(0, 256));
  c->add_option("--model", args->models,
                "Also run a GGUF language model with exact and windowed attention: a file, or a name (attn models); "
                "repeatable")
      ->transform(model_file());
  add_filter_options(c, args->filter);
  return [args] { return run(*args); };
}

}  // namespace attn::cli
