// Sub-commands of the attn tool; each registers its options on the CLI11 app and returns
// the function that runs it.
#pragma once
#include <CLI/CLI.hpp>
#include <cstdint>
#include <functional>
#include <string>

#include "harness/check.hpp"

namespace attn::cli {

using Runner = std::function<int()>;

Runner add_run(CLI::App& app);
Runner add_demo(CLI::App& app);
Runner add_bench(CLI::App& app);
Runner add_list(CLI::App& app);
Runner add_check(CLI::App& app);
Runner add_mask(CLI::App& app);
Runner add_generate(CLI::App& app);
Runner add_generate_random(CLI::App& app);
Runner add_gguf(CLI::App& app);
Runner add_tokenize(CLI::App& app);
Runner add_chat(CLI::App& app);
Runner add_serve(CLI::App& app);
Runner add_eval_ppl(CLI::App& app);
Runner add_concentration(CLI::App& app);
Runner add_report(CLI::App& app);
Runner add_models(CLI::App& app);

// --seed (generate, chat): an integer in [0, 2^64 - 1], refused otherwise rather than wrapped;
// seed_error says why a text is not one ("" if it is).
CLI::Option* add_seed_option(CLI::App* c, uint64_t& seed, const std::string& description);
std::string seed_error(const std::string& text);

// --op, --form, --isa, --case: the filters every mode of the case list takes. --op, --form and
// --isa must name a family, a form and an ISA attn knows (usage errors otherwise).
void add_filter_options(CLI::App* c, harness::Filter& f);

// A mode's runs for a filter (check: harness::expand of the check suite, bench: of its grid, ...).
using ExpandRuns = std::function<std::vector<harness::Run>(const harness::Filter&)>;

// The runs `f` selects. Selecting none is an error (not an empty table, nor "0 of 0 runs
// passed"): it names the first option that selects nothing alone, with the values the mode's
// `runs_of` ("check runs") have on this CPU, or else the filters that exclude each other.
std::vector<harness::Run> selected_runs(const ExpandRuns& expand, const harness::Filter& f, const std::string& runs_of);

// Every run can start (its mechanism parses; explain() accepts its shapes, extras and forced
// form): modes that measure or print tables check this before any work. An Error names
// `options`, what gave the runs ("-n 8 -d 3 --heads 1"), the run, and why not.
void check_runs_start(const std::vector<harness::Run>& runs, const std::string& options);

}  // namespace attn::cli
