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
Runner add_gguf(CLI::App& app);
Runner add_tokenize(CLI::App& app);
Runner add_chat(CLI::App& app);
Runner add_eval_ppl(CLI::App& app);
Runner add_concentration(CLI::App& app);
Runner add_report(CLI::App& app);

// --seed (generate, chat): an integer in [0, 2^64 - 1], refused otherwise rather than wrapped;
// seed_error says why a text is not one ("" if it is).
CLI::Option* add_seed_option(CLI::App* c, uint64_t& seed, const std::string& description);
std::string seed_error(const std::string& text);

// --op, --form, --isa, --case: the filters every mode of the case list takes.
void add_filter_options(CLI::App* c, harness::Filter& f);

}  // namespace attn::cli
