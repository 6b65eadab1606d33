// attn: exact attention (and, later, every mechanism) from the command line.
#include <fmt/core.h>

#include <CLI/CLI.hpp>

#include "attn/error.hpp"
#include "commands.hpp"

int main(int argc, char** argv) {
  CLI::App app{
      "attn: attention mechanisms on the CPU behind one API.\n"
      "  attn demo     built-in data, the mechanisms side by side (error vs reference, speed)\n"
      "  attn run      attention on .npy files\n"
      "  attn bench    throughput as a ratio to this machine's sgemm roofline\n"
      "Mechanisms are written as text, e.g. softmax:causal,window=128:0,softcap=30.\n"
      "ATTN_ISA=portable|avx2|avx512 forces a kernel set; OMP_NUM_THREADS sets the default threads."};
  app.require_subcommand(1);
  std::vector<std::pair<CLI::App*, attn::cli::Runner>> commands;
  auto add = [&](attn::cli::Runner (*f)(CLI::App&), const char* name) {
    auto runner = f(app);
    commands.emplace_back(app.get_subcommand(name), runner);
  };
  add(attn::cli::add_demo, "demo");
  add(attn::cli::add_run, "run");
  add(attn::cli::add_bench, "bench");
  CLI11_PARSE(app, argc, argv);
  try {
    for (auto& [cmd, run] : commands)
      if (cmd->parsed()) return run();
  } catch (const attn::Error& e) {
    fmt::print(stderr, "error: {}\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    fmt::print(stderr, "error: {}\n", e.what());
    return 1;
  }
  return 0;
}
