// attn: exact attention (and, later, every mechanism) from the command line.
#include <fmt/core.h>

#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdlib>
#include <string>

#include "attn/error.hpp"
#include "attn/isa.hpp"
#include "commands.hpp"
#include "log_level.hpp"
#include "usage.hpp"

// OpenBLAS 0.3.21 (Debian 12) does not know recent CPUs and falls back to its Haswell (AVX2)
// sgemm, and some environments pin OPENBLAS_CORETYPE=Haswell; either would make a weak
// roofline. `attn bench` re-runs itself once with the strongest core type this CPU executes
// (SkylakeX on AVX-512), unless ATTN_BLAS_CORETYPE names another one ("keep" keeps the env).
static void strengthen_blas_roofline(int argc, char** argv) {
  if (argc < 2 || std::string(argv[1]) != "bench" || std::getenv("ATTN_BENCH_REEXEC")) return;
  const char* want_env = std::getenv("ATTN_BLAS_CORETYPE");
  std::string want = want_env ? want_env : (attn::best_supported_isa() == attn::Isa::avx512 ? "SkylakeX" : "Haswell");
  if (want == "keep") return;
  const char* have = std::getenv("OPENBLAS_CORETYPE");
  if (have && want == have) return;
  setenv("OPENBLAS_CORETYPE", want.c_str(), 1);
  setenv("ATTN_BENCH_REEXEC", "1", 1);
  execv("/proc/self/exe", argv);  // only returns on failure: then keep the default
}

// A command's error in the usage errors' format (usage.hpp): "error: attn CMD: <what>", the
// command named once even when the message already starts with it.
static void print_error(const std::string& command, std::string what) {
  for (const std::string& prefix : {"attn " + command + ": ", command + ": "})
    if (what.rfind(prefix, 0) == 0) what.erase(0, prefix.size());
  fmt::print(stderr, "error: attn {}: {}\n", command, what);
}

// Runs a parsed command: exit status 2 for bad input (attn::Error, as usage errors), 1 for any
// other failure.
static int run_command(const std::string& command, const attn::cli::Runner& run) {
  try {
    return run();
  } catch (const attn::Error& e) {
    print_error(command, e.what());
    return 2;
  } catch (const std::exception& e) {
    print_error(command, e.what());
    return 1;
  }
}

int main(int argc, char** argv) {
  strengthen_blas_roofline(argc, argv);
  CLI::App app{
      "attn: attention mechanisms on the CPU behind one API.\n"
      "  attn demo     built-in data, the mechanisms side by side (error vs reference, speed)\n"
      "  attn run      attention on .npy files\n"
      "  attn bench    throughput as a ratio to this machine's sgemm roofline\n"
      "  attn list     the mechanism families (their text, forms, cache); --runs: the test runs\n"
      "  attn check    every form on every ISA against the float64 reference\n"
      "  attn mask     the key pattern a mechanism implies, as .npy and a picture\n"
      "  attn generate text from a GGUF model (--model, -p, -n, --temp, --top-k, ...: llama.cpp's spellings)\n"
      "  attn generate-random  a random llama-style decoder (MiniMax hybrids): tokens/s, cache bytes per token\n"
      "  attn gguf     what a GGUF model file holds (metadata, tensors), checked\n"
      "  attn tokenize a GGUF file's tokenizer: text -> ids (--chat: its chat prompt), --decode ids -> text\n"
      "  attn chat     turns with a GGUF language model (e.g. SmolLM2-135M), any attention mechanism\n"
      "  attn serve    an OpenAI-compatible HTTP server (completions, chat, streaming, metrics, a chat page)\n"
      "  attn eval-ppl what each mechanism costs a real model: perplexity, time, KV cache (table + chart)\n"
      "  attn concentration curves|needle|scale|model|train   can attention concentrate? tables and plots\n"
      "  attn report   those experiments on one self-contained HTML page (figures, tables, findings)\n"
      "  attn models   the models attn knows by name (--model smollm2): installed?, path, how to install\n"
      "Mechanisms are written as text, e.g. softmax:causal,window=128:0,softcap=30.\n"
      "ATTN_ISA=portable|avx2|avx512 forces a kernel set; OMP_NUM_THREADS sets the default threads."};
  app.require_subcommand(1);
  // --log-level before or after the command (attn --log-level debug chat ..., attn chat ... --log-level error)
  std::string log_level = "info";
  app.add_option("--log-level", log_level,
                 "What commands say on stderr beside results and errors: error (nothing else: no progress lines, no "
                 "speed and cache figures), warn (and warnings), info (and progress and figures), debug (and what a "
                 "model load did: file, tensor types, threads, ISA)")
      ->capture_default_str()
      ->check(CLI::IsMember({"error", "warn", "info", "debug"}));
  app.fallthrough();
  std::vector<std::pair<CLI::App*, attn::cli::Runner>> commands;
  auto add = [&](attn::cli::Runner (*f)(CLI::App&), const char* name) {
    auto runner = f(app);
    commands.emplace_back(app.get_subcommand(name), runner);
  };
  add(attn::cli::add_demo, "demo");
  add(attn::cli::add_run, "run");
  add(attn::cli::add_bench, "bench");
  add(attn::cli::add_list, "list");
  add(attn::cli::add_check, "check");
  add(attn::cli::add_mask, "mask");
  add(attn::cli::add_generate, "generate");
  add(attn::cli::add_generate_random, "generate-random");
  add(attn::cli::add_gguf, "gguf");
  add(attn::cli::add_tokenize, "tokenize");
  add(attn::cli::add_chat, "chat");
  add(attn::cli::add_serve, "serve");
  add(attn::cli::add_eval_ppl, "eval-ppl");
  add(attn::cli::add_concentration, "concentration");
  add(attn::cli::add_report, "report");
  add(attn::cli::add_models, "models");
  // --version on attn and on every command (attn generate --version answers, as llama.cpp's do)
  std::vector<CLI::App*> apps{&app};
  for (size_t i = 0; i < apps.size(); ++i)
    for (CLI::App* sub : apps[i]->get_subcommands([](CLI::App*) { return true; })) apps.push_back(sub);
  for (CLI::App* a : apps) a->set_version_flag("--version", "attn " ATTN_VERSION, "Print attn's version and exit");
  attn::cli::check_numbers(app);
  if (const int code = attn::cli::parse_command_line(app, argc, argv); code >= 0) return code;
  using attn::cli::LogLevel;
  attn::cli::g_log_level = log_level == "error" ? LogLevel::error
                           : log_level == "warn" ? LogLevel::warn
                           : log_level == "debug" ? LogLevel::debug
                                                  : LogLevel::info;
  for (auto& [cmd, run] : commands)
    if (cmd->parsed()) return run_command(cmd->get_name(), run);
  return 0;
}
