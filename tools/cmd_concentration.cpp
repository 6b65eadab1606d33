// attn concentration: the concentration experiments (docs/concentration.md). They draw with
// matplotlib, so they live in the Python package (attn.lab.experiments); this command runs them with
// the Python that has attn installed (ATTN_PYTHON, else .venv/bin/python beside the working
// directory, else python3), passing its arguments through.
#include <string>

#include "commands.hpp"
#include "python_exec.hpp"

namespace attn::cli {
namespace {

struct ConcentrationArgs {
  std::string experiment, out = "concentration";
};

int run(const ConcentrationArgs& a) {
  return exec_python_module("attn concentration", "attn.lab.experiments", {a.experiment, "--out", a.out});
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
      "Runs python -m attn.lab.experiments (ATTN_PYTHON, .venv/bin/python or python3, with attn installed).");
  c->add_option("experiment", a->experiment, "curves, needle, scale, model or train")
      ->required()->check(CLI::IsMember({"curves", "needle", "scale", "model", "train"}));
  c->add_option("--out", a->out, "Directory for the table and the plot")->capture_default_str();
  return [a] { return run(*a); };
}

}  // namespace attn::cli
