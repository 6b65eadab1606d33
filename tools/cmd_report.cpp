// attn report: the concentration experiments on one self-contained HTML page (figures inline,
// tables, a short write-up whose numbers are read from the experiments' tables). The page is
// built by the Python package (attn.lab.report, beside attn.lab.experiments, which draws the figures);
// this command runs it the way attn concentration does (ATTN_PYTHON, .venv/bin/python, python3).
#include <string>
#include <vector>

#include "commands.hpp"
#include "python_exec.hpp"

namespace attn::cli {
namespace {

struct ReportArgs {
  std::string out = "report.html", run;
  std::vector<std::string> from;
  bool quick = false;
};

int run(const ReportArgs& a) {
  std::vector<std::string> args = {"--out", a.out};
  for (const std::string& d : a.from) {
    args.push_back("--from");
    args.push_back(d);
  }
  if (!a.run.empty()) {
    args.push_back("--run");
    args.push_back(a.run);
  }
  if (a.quick) args.push_back("--quick");
  return exec_python_module("attn report", "attn.lab.report", args);
}

}  // namespace

Runner add_report(CLI::App& app) {
  auto a = std::make_shared<ReportArgs>();
  CLI::App* c = app.add_subcommand(
      "report",
      "One self-contained HTML page of the concentration experiments (docs/concentration.md): each\n"
      "experiment's figure inline, a compact table and findings computed from its numbers, and the\n"
      "SmolLM2 perplexity per mechanism (attn eval-ppl) beside the real-model statistics.\n"
      "  attn report --out report.html                       from docs/figures (the checked-in results)\n"
      "  attn report --from out/ --run needle,scale --quick  run those into out/ first (progress on stderr)\n"
      "Inputs: curves/needle/scale/model/train/titans_needle/gemma.json (attn concentration) and\n"
      "eval_ppl*.json (attn eval-ppl --out)\n"
      "in the --from directories; a missing one gets a section naming the command that makes it.\n"
      "Runs python -m attn.lab.report (ATTN_PYTHON, .venv/bin/python or python3, with attn installed).");
  c->add_option("--out", a->out, "The HTML page to write (replaced only once complete)")->capture_default_str();
  c->add_option("--from", a->from,
                "A directory (or a .json file) holding experiment outputs; repeatable, the first that has an\n"
                "input wins (default: docs/figures/concentration, docs/figures, docs/figures/titans and\n"
                "docs/figures/gemma3)");
  c->add_option("--run", a->run,
                "Comma-separated experiments to run first (curves, needle, scale, model, train, titans-needle,\n"
                "gemma; all; missing: those\n"
                "not found), writing into the first --from directory (without --from: OUT-data/ beside the page)");
  c->add_flag("--quick", a->quick, "With --run: smaller runs (fewer keys, a shorter SmolLM2 context) for a fast look");
  return [a] { return run(*a); };
}

}  // namespace attn::cli
