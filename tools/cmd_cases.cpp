// attn list / attn check: the mechanisms, and the one case list (harness/case_list.cpp), from the
// command line.
//   attn list                                 every mechanism family: its text, forms, cache
//   attn list --json [-m TEXT ...]            what attn::info says of each, as JSON
//   attn list --runs [--suite check|bench|decode|demo] [--backward] [filters]   what would run
//   attn check [--backward] [filters]        every check run (or backward run) against the float64 reference
#include <fmt/core.h>

#include <algorithm>
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
  bool json = false, backward = false, runs = false;
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

std::string joined(const std::vector<std::string>& xs) {
  std::string out;
  for (const std::string& x : xs) out += (out.empty() ? "" : ", ") + x;
  return out;
}

// The families a user writes as text: name, what the text may say, the forms and what a layer keeps.
int list_families() {
  const std::vector<MechanismInfo> infos = family_infos();
  fmt::print("attn list: {} mechanism families, written as text (attn run -m TEXT, attn.attend(q, k, v, TEXT))\n\n",
             infos.size());
  fmt::print("{:<11} {:<6} {:<36} {}\n", "family", "cache", "forms (tried in this order)", "text");
  for (const MechanismInfo& i : infos) {
    const char* cache = i.cache == CacheKind::kv ? "kv" : i.cache == CacheKind::state ? "state" : "none";
    fmt::print("{:<11} {:<6} {:<36} {}\n", i.family, cache, joined(i.forms), i.grammar);
  }
  fmt::print("\nalias: retention[:decay=X,chunk=N,scale=X] = linear:map=identity,causal,normalize=0 (RetNet)\n"
             "cache: what a decoding layer keeps: kv = K/V rows (a window: a bounded number), state = a fixed-size\n"
             "state, none = not causal (no decoding)\n"
             "attn list --json: every fact of each family; attn list --runs: the test runs (case x form x ISA)\n");
  return 0;
}

int list(const ListArgs& a) {
  if (a.json) {
    if (a.runs) fail("--json", "describes the mechanisms; --runs lists the test runs: give one of them");
    return list_json(a);
  }
  if (!a.mechanisms.empty() || a.context != 0) fail("--mechanism/--context", "only with --json");
  if (!a.runs) return list_families();
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
  const auto runs = selected_runs(
      [](const harness::Filter& g) { return harness::expand(harness::case_list(), harness::kCheck, g); }, f, "check runs");
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
  const auto runs = selected_runs([](const harness::Filter& g) { return harness::expand_backward(harness::case_list(), g); },
                                  f, "backward runs");
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

std::string one_of_text(const std::vector<std::string>& names) {
  std::string out;
  for (size_t i = 0; i < names.size(); ++i) out += (i == 0 ? "" : i + 1 == names.size() ? " or " : ", ") + names[i];
  return out;
}

// Every family's name (attn::info), and every form any family has: what --op and --form take.
std::vector<std::string> family_names() {
  std::vector<std::string> out;
  for (const MechanismInfo& i : family_infos()) out.push_back(i.family);
  return out;
}
std::vector<std::string> form_names() {
  std::vector<std::string> out;
  for (const MechanismInfo& i : family_infos())
    for (const std::string& f : i.forms)
      if (std::find(out.begin(), out.end(), f) == out.end()) out.push_back(f);
  // and the backward's forms (--backward --form scores): those its runs use
  for (const harness::Run& r : harness::expand_backward(harness::case_list(), {}))
    if (std::find(out.begin(), out.end(), r.form) == out.end()) out.push_back(r.form);
  return out;
}

// A value that must be one of names() (asked when the option is given, not at start-up).
CLI::Validator one_of(std::vector<std::string> (*names)()) {
  return CLI::Validator(
      [names](std::string& s) -> std::string {
        const std::vector<std::string> known = names();
        if (std::find(known.begin(), known.end(), s) != known.end()) return {};
        return "expected " + one_of_text(known) + ", got '" + s + "'";
      },
      "");
}

// An ISA name as attn::parse_isa reads it (ATTN_ISA and Python agree).
CLI::Validator isa_name_check() {
  return CLI::Validator(
      [](std::string& s) -> std::string {
        try {
          parse_isa(s, "--isa");
          return {};
        } catch (const Error& e) {
          const std::string m = e.what();
          return m.rfind("--isa: ", 0) == 0 ? m.substr(7) : m;
        }
      },
      "");
}

// The filters as typed ("--op lsh --isa avx2").
std::string filter_text(const harness::Filter& f) {
  std::string out;
  for (const auto& [name, value] : {std::pair{"--op", &f.op}, {"--form", &f.form}, {"--isa", &f.isa}, {"--case", &f.case_substring}})
    if (!value->empty()) out += (out.empty() ? "" : " ") + std::string(name) + " " + *value;
  return out;
}

// The distinct values `value` takes over the runs, in their order ("softmax, linear").
std::string values_of(const std::vector<harness::Run>& runs, std::string (*value)(const harness::Run&)) {
  std::vector<std::string> seen;
  for (const harness::Run& r : runs)
    if (const std::string v = value(r); std::find(seen.begin(), seen.end(), v) == seen.end()) seen.push_back(v);
  return one_of_text(seen);
}

// Why run `r` cannot start ("" if it can): its mechanism must parse and explain() accept its
// shapes, extras and forced form, as attend() will (on inputs of its shapes, nothing computed).
std::string refusal_of(const harness::Run& r) {
  try {
    harness::Inputs in;
    harness::make_inputs(*r.c, in, /*shapes_only=*/true);
    in.options.form = r.form;
    for (const FormVerdict& v : explain(in.q.view, in.k.view, in.v.view, in.mechanism, in.options).forms)
      if (v.form == r.form && !v.reasons.empty()) return "form '" + r.form + "' refuses it: " + v.reasons.front();
    return {};
  } catch (const Error& e) {
    return e.what();
  }
}

}  // namespace

void add_filter_options(CLI::App* c, harness::Filter& f) {
  c->add_option("--op", f.op, "Only this mechanism family (e.g. softmax)")->check(one_of(family_names));
  c->add_option("--form", f.form, "Only this form (e.g. tiled, rows, reference)")->check(one_of(form_names));
  c->add_option("--isa", f.isa, "Only this ISA (portable, avx2, avx512)")->check(isa_name_check());
  c->add_option("--case", f.case_substring, "Only cases whose name, mechanism or label contains this text");
}

std::vector<harness::Run> selected_runs(const ExpandRuns& expand, const harness::Filter& f, const std::string& runs_of) {
  if (std::vector<harness::Run> runs = expand(f); !runs.empty()) return runs;
  const std::vector<harness::Run> all = expand(harness::Filter{});
  struct Option {
    const char* name;
    std::string harness::Filter::*field;
    std::string (*value)(const harness::Run&);
  };
  const Option options[] = {
      {"--op", &harness::Filter::op, [](const harness::Run& r) { return r.c->op(); }},
      {"--form", &harness::Filter::form, [](const harness::Run& r) { return r.form.empty() ? std::string("auto") : r.form; }},
      {"--isa", &harness::Filter::isa, [](const harness::Run& r) { return isa_name(r.isa); }}};
  for (const Option& o : options) {  // the first option that selects nothing on its own
    harness::Filter alone;
    alone.*o.field = f.*o.field;
    if (!(f.*o.field).empty() && expand(alone).empty())
      fail(o.name, "expected " + values_of(all, o.value) + " (the " + runs_of + " on this CPU), got '" + f.*o.field + "'");
  }
  harness::Filter alone;
  alone.case_substring = f.case_substring;
  if (!f.case_substring.empty() && expand(alone).empty())
    fail("--case", "no case of the " + runs_of + " has '" + f.case_substring + "' in its name, mechanism or label");
  fail(filter_text(f), "select no " + runs_of + " together (each alone selects some; attn list shows which)");
}

void check_runs_start(const std::vector<harness::Run>& runs, const std::string& options) {
  for (const harness::Run& r : runs)
    if (const std::string why = refusal_of(r); !why.empty()) {
      const harness::Case& c = *r.c;
      fail(options, fmt::format("{} at N {}, M {}, d {}, {}/{} heads, {} cannot run: {}", c.mechanism, c.N, c.M, c.D,
                                c.H, c.Hkv, dtype_name(c.dtype), why));
    }
}

Runner add_list(CLI::App& app) {
  auto args = std::make_shared<ListArgs>();
  CLI::App* c = app.add_subcommand(
      "list", "The mechanism families (their text, forms, cache); --runs: the test runs (case x form x ISA)");
  c->add_flag("--runs", args->runs,
              "The runs of the case list instead (case x form x ISA, with tolerance and FLOPs); --suite, --backward "
              "and the filters imply it");
  c->add_option("--suite", args->suite, "Which suite's runs")->check(CLI::IsMember({"check", "bench", "decode", "demo"}))
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
  c->footer("Examples:\n  attn list\n  attn list --runs --form rows --isa avx2 --case causal\n  attn list --json\n"
            "  attn list --json -m softmax:causal,window=255:0,sinks=4 --context 32768   # cache_rows 260");
  return [args, c] {
    for (const char* o : {"--suite", "--backward", "--op", "--form", "--isa", "--case"}) args->runs |= c->count(o) > 0;
    return list(*args);
  };
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
