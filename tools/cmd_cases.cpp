// attn list / attn check: the one case list (harness/case_list.cpp) from the command line.
//   attn list  [--suite check|bench|decode|demo] [--backward] [filters]   what would run, with tolerance and FLOPs
//   attn check [--backward] [filters]        every check run (or backward run) against the float64 reference
#include <fmt/core.h>

#include <map>

#include "attn/attn.hpp"
#include "commands.hpp"
#include "harness/backward_check.hpp"
#include "usage.hpp"

namespace attn::cli {
namespace {

const std::map<std::string, harness::Suite> kSuites = {
    {"check", harness::kCheck}, {"bench", harness::kBench}, {"decode", harness::kDecode}, {"demo", harness::kDemo}};

struct ListArgs {
  std::string suite = "check";
  harness::Filter filter;
  bool json = false, backward = false;
  std::vector<std::string> mechanisms;
  int64_t context = 0;
};

// What each family (or each given mechanism) is, as attn::info says: a JSON array of objects.
int list_json(const ListArgs& a) {
  std::vector<MechanismInfo> infos;
  if (a.mechanisms.empty())
    for (const MechanismInfo& i : family_infos()) infos.push_back(info(parse_mechanism(i.text), a.context));
  for (const std::string& m : a.mechanisms) infos.push_back(info(parse_mechanism(m), a.context));
  fmt::print("[\n");
  for (size_t i = 0; i < infos.size(); ++i) fmt::print("{}{}\n", infos[i].to_json(), i + 1 < infos.size() ? "," : "");
  fmt::print("]\n");
  return 0;
}

// The backward mode's runs; MFLOP: the backward's count, 2.5 x the forward's.
int list_backward(const harness::Filter& f) {
  const auto runs = harness::expand_backward(harness::case_list(), f);
  fmt::print("{:<4} {:<90} {:<8} {:<9} {:<8} {:>10}  {}\n", "#", "run (case__form__isa)", "op", "form", "isa",
             "MFLOP", "tolerance");
  size_t i = 0;
  for (const auto& r : runs)
    fmt::print("{:<4} {:<90} {:<8} {:<9} {:<8} {:>10.3f}  {}\n", ++i, r.name(), r.c->op(), r.form, isa_name(r.isa),
               2.5 * r.c->flops() / 1e6, "3x plain + floor (gradients)");
  fmt::print("{} backward runs of suite 'check'\n", runs.size());
  return 0;
}

int list(const ListArgs& a) {
  if (a.json) return list_json(a);
  if (!a.mechanisms.empty() || a.context != 0) fail("--mechanism/--context", "only with --json");
  if (a.backward && a.suite != "check") fail("--backward", "lists the check suite's backward runs, not --suite " + a.suite);
  if (a.backward) return list_backward(a.filter);
  const auto runs = harness::expand(harness::case_list(), kSuites.at(a.suite), a.filter);
  fmt::print("{:<4} {:<90} {:<8} {:<9} {:<8} {:>10}  {}\n", "#", "run (case__form__isa)", "op", "form", "isa",
             "MFLOP", "tolerance");
  size_t i = 0;
  for (const auto& r : runs)
    fmt::print("{:<4} {:<90} {:<8} {:<9} {:<8} {:>10.3f}  {}\n", ++i, r.name(), r.c->op(),
               r.form.empty() ? "auto" : r.form, isa_name(r.isa), r.c->flops() / 1e6, r.c->tolerance.describe());
  fmt::print("{} runs in suite '{}'\n", runs.size(), a.suite);
  return 0;
}

int check(const harness::Filter& f) {
  const auto runs = harness::expand(harness::case_list(), harness::kCheck, f);
  size_t failed = 0, i = 0;
  const harness::Case* last = nullptr;
  std::unique_ptr<harness::Inputs> in;
  harness::References ref;
  for (const auto& r : runs) {
    if (r.c != last) {
      in = std::make_unique<harness::Inputs>();
      harness::make_inputs(*r.c, *in);
      ref = harness::references_for(*r.c, *in);
      last = r.c;
    }
    const harness::Outcome o = harness::check_run(r, *in, ref);
    ++i;
    if (!o.pass) ++failed;
    fmt::print("[{:>4}/{}] {} {}  err {:.2e} <= tol {:.2e}{}\n", i, runs.size(), o.pass ? "ok  " : "FAIL", r.name(),
               o.err, o.tol, o.pass ? "" : "\n        " + o.failure);
    std::fflush(stdout);
  }
  fmt::print("{} of {} runs passed\n", runs.size() - failed, runs.size());
  return failed ? 1 : 0;
}

// The backward mode: each run's dq, dk, dv against the family's float64 backward reference.
int check_backward(const harness::Filter& f) {
  const auto runs = harness::expand_backward(harness::case_list(), f);
  size_t failed = 0, i = 0;
  const harness::Case* last = nullptr;
  std::unique_ptr<harness::Inputs> in;
  harness::GradientReferences ref;
  for (const auto& r : runs) {
    if (r.c != last) {
      in = std::make_unique<harness::Inputs>();
      harness::make_inputs(*r.c, *in);
      ref = harness::gradient_references_for(*r.c, *in);
      last = r.c;
    }
    const harness::Outcome o = harness::check_backward_run(r, *in, ref);
    ++i;
    if (!o.pass) ++failed;
    fmt::print("[{:>4}/{}] {} {}  err {:.2e} <= tol {:.2e}{}\n", i, runs.size(), o.pass ? "ok  " : "FAIL", r.name(),
               o.err, o.tol, o.pass ? "" : "\n        " + o.failure);
    std::fflush(stdout);
  }
  fmt::print("{} of {} backward runs passed\n", runs.size() - failed, runs.size());
  return failed ? 1 : 0;
}

}  // namespace

void add_filter_options(CLI::App* c, harness::Filter& f) {
  c->add_option("--op", f.op, "Only this mechanism family (e.g. softmax)");
  c->add_option("--form", f.form, "Only this form (e.g. tiled, rows, reference)");
  c->add_option("--isa", f.isa, "Only this ISA (portable, avx2, avx512)");
  c->add_option("--case", f.case_substring, "Only cases whose name, mechanism or label contains this text");
}

Runner add_list(CLI::App& app) {
  auto args = std::make_shared<ListArgs>();
  CLI::App* c = app.add_subcommand("list", "List the runs of the case list (case x form x ISA) with tolerance and FLOPs");
  c->add_option("--suite", args->suite, "Which suite")->check(CLI::IsMember({"check", "bench", "decode", "demo"}))
      ->capture_default_str();
  add_filter_options(c, args->filter);
  c->add_flag("--json", args->json,
              "Instead of runs: what each mechanism family is (attn::info) as a JSON array, one object per family: "
              "family, causal, cache (kv/state/none), cache_rows, params (name, shape, dtype, generate), forms, "
              "grammar, limits, option_ranges (each float option's range: outside it is refused)");
  c->add_option("-m,--mechanism", args->mechanisms, "With --json: these mechanisms instead of every family's default")
      ->take_all();
  c->add_option("--context", args->context, "With --json: tokens of context for cache_rows (default 0)")
      ->check(in_range(int64_t{0}, int64_t{1} << 62));
  c->add_flag("--backward", args->backward,
              "The backward mode's runs instead: case x backward form x ISA for the check cases whose mechanism has a "
              "backward (MFLOP: 2.5 x the forward's)");
  c->footer("Examples:\n  attn list --form rows --isa avx2 --case causal\n  attn list --json\n"
            "  attn list --json -m softmax:causal,window=255:0,sinks=4 --context 32768   # cache_rows 260");
  return [args] { return list(*args); };
}

Runner add_check(CLI::App& app) {
  auto f = std::make_shared<harness::Filter>();
  auto backward = std::make_shared<bool>(false);
  CLI::App* c = app.add_subcommand("check", "Run the check suite: every form on every ISA against the float64 reference");
  add_filter_options(c, *f);
  c->add_flag("--backward", *backward,
              "Check gradients instead: for every check case whose mechanism has a backward, every backward form on "
              "every ISA, dq, dk, dv for a seeded dout against the float64 backward reference (within 3x the plain "
              "same-dtype backward's error + floors) and bitwise equal on 1 and 3 threads");
  c->footer("The same runs as the ctest suite (tests/harness/test_case_list.cpp; --backward: test_backward_cases.cpp).\n"
            "Exit status 1 if any fails.\n"
            "Examples: attn check --form tiled --isa portable\n"
            "          attn check --backward --case longformer");
  return [f, backward] { return *backward ? check_backward(*f) : check(*f); };
}

}  // namespace attn::cli
