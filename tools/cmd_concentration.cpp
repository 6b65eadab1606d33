// attn concentration: the concentration experiments (docs/concentration.md). They draw with
// matplotlib, so they live in the Python package (attn.lab.experiments); this command runs them with
// the Python that has attn installed (ATTN_PYTHON, else .venv/bin/python beside the working
// directory, else python3), passing its arguments through.
#include <string>
#include <utility>
#include <vector>

#include "commands.hpp"
#include "python_exec.hpp"

namespace attn::cli {
namespace {

struct ConcentrationArgs {
  std::string experiment, out = "concentration";
  std::string steps, seed, tokens, stats_tokens;  // passed through as typed (Python checks them); "": not given
  bool quick = false;
};

int run(const ConcentrationArgs& a) {
  std::vector<std::string> args = {a.experiment, "--out", a.out};
  for (const auto& [flag, value] : {std::pair{"--steps", &a.steps}, std::pair{"--seed", &a.seed},
                                    std::pair{"--tokens", &a.tokens}, std::pair{"--stats-tokens", &a.stats_tokens}})
    if (!value->empty()) args.insert(args.end(), {flag, *value});
  if (a.quick) args.push_back("--quick");
  return exec_python_module("attn concentration", "attn.lab.experiments", args);
}

}  // namespace

Runner add_concentration(CLI::App& app) {
  auto a = std::make_shared<ConcentrationArgs>();
  CLI::App* c = app.add_subcommand(
      "concentration",
      "How concentrated attention can be: experiments writing a table (CSV, JSON) and a plot (PNG, SVG).\n"
      "  curves  the closed forms: S against gamma (softmax, relu^2, linear), S against n (decay)\n"
      "  needle  one far key aligned with the query among 64..65536: weight on it, S, entropy per mechanism\n"
      "  scale   the needle at half strength: default vs entropy-invariant scale\n"
      "  model   MiniLM and SmolLM2 (4096 tokens) per layer and head: S, entropy, attention-sink mass\n"
      "  train   a two-layer model trained on associative recall per mechanism (softmax, elu-linear,\n"
      "          retention, window+sinks, hybrid) through attn's backward: loss, accuracy, weight on the answer\n"
      "  titans-needle  a key-value needle D tokens back: a window alone, Titans' memory alone, both\n"
      "  gemma   Gemma 3 270M (5 sliding-window : 1 global layers): perplexity as trained, all local,\n"
      "          window + 4 sinks on the globals, all global, linear locals; S and entropy per layer kind\n"
      "Runs python -m attn.lab.experiments (ATTN_PYTHON, .venv/bin/python or python3, with attn installed).");
  c->add_option("experiment", a->experiment, "curves, needle, scale, model, train, titans-needle or gemma")
      ->required()
      ->check(CLI::IsMember({"curves", "needle", "scale", "model", "train", "titans-needle", "gemma"}));
  c->add_option("--out", a->out, "Directory for the table and the plot")->capture_default_str();
  c->add_option("--steps", a->steps, "train: optimiser steps per mechanism (default 600; --quick: 30)")->type_name("N");
  c->add_option("--seed", a->seed, "train: seed of the initial weights and of the data (default 0)")->type_name("N");
  c->add_option("--tokens", a->tokens, "gemma: the text lengths scored (default 2048,8192)")->type_name("N,N");
  c->add_option("--stats-tokens", a->stats_tokens, "gemma: tokens of the concentration pass (default 2048)")
      ->type_name("N");
  c->add_flag("--quick", a->quick, "train, gemma: tiny sizes for a run of seconds (tests)");
  return [a] { return run(*a); };
}

}  // namespace attn::cli
