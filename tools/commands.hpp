// Sub-commands of the attn tool; each registers its options on the CLI11 app and returns
// the function that runs it.
#pragma once
#include <CLI/CLI.hpp>
#include <functional>

namespace attn::cli {

using Runner = std::function<int()>;

Runner add_run(CLI::App& app);
Runner add_demo(CLI::App& app);
Runner add_bench(CLI::App& app);

}  // namespace attn::cli
