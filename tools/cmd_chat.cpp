// attn chat: turns with a GGUF language model in its chat template, the context kept between
// turns (only the new turn is prefilled). Lines from stdin; an empty line or EOF ends.
#include <fmt/core.h>

#include <cstdio>
#include <iostream>
#include <string>

#include <unistd.h>

#include "attn/error.hpp"
#include "commands.hpp"
#include "interrupt.hpp"
#include "log_level.hpp"
#include "model_option.hpp"
#include "usage.hpp"
#include "text_model.hpp"

namespace attn::cli {
namespace {

// One turn from stdin, at most kMaxTurnBytes (a line past it, /dev/zero as stdin, is an error, not
// a read until memory runs out); false at EOF.
constexpr size_t kMaxTurnBytes = size_t{1} << 20;

bool read_turn(std::string& line) {
  line.clear();
  for (int c; (c = std::cin.get()) != EOF;) {
    if (c == '\n') return true;
    if (line.size() == kMaxTurnBytes)
      fail("attn chat", "a line of stdin holds more than " + std::to_string(kMaxTurnBytes) +
                            " bytes (1 MiB), the most one turn may have");
    line.push_back(static_cast<char>(c));
  }
  return !line.empty();
}

struct ChatArgs {
  // prompts on float panels, replies on 8-bit decode products: SmolLM2-135M's first token of "What
  // is the capital of France?" is "The" from the float panels, "L" (L'Étoile...) from 8-bit ones
  TextModelOptions model{.activations = "q8-decode"};
  std::string system;
  int64_t max_tokens = 256;
  // greedy with a mild repetition penalty (llama.cpp's default before it became 1.0): SmolLM2-135M
  // with 8-bit activations loops on "la femme, la femme, ..." without it
  SamplingOptions sampling{0.0, 1.0, 1, 0, 0.0, 1.1};
  bool quiet = false;
  bool in_place = false;  // --no-repack
};

// Turn t draws with seed + t (modulo 2^64).
SamplingOptions sampling_of_turn(SamplingOptions s, uint64_t turn) {
  s.seed += turn;
  return s;
}

int run(const ChatArgs& a) {
  check_sampling_options(a.sampling);
  TextModelOptions options = a.model;
  options.repack = !a.in_place;
  TextModel m(options);
  std::vector<ChatMessage> messages;
  if (!a.system.empty()) messages.push_back({"system", a.system});
  const bool tty = isatty(fileno(stdin)) != 0;
  std::string line;
  for (uint64_t turn = 0;; ++turn) {
    if (tty) fmt::print("> "), std::fflush(stdout);
    if (!read_turn(line) || line.empty()) break;
    messages.push_back({"user", line});
    const std::vector<int32_t> prompt = m.prompt_ids(m.tokenizer().chat_prompt(messages, true));
    ReplyStats stats;
    catch_interrupts();
    const std::vector<int32_t> ids = m.reply(prompt, a.max_tokens, sampling_of_turn(a.sampling, turn),
                                             [](const std::string& piece) {
                                               fmt::print("{}", piece);
                                               std::fflush(stdout);
                                             },
                                             stats);
    fmt::print("\n");
    std::fflush(stdout);
    if ((!a.quiet && logs(LogLevel::info)) || stats.interrupted)
      fmt::print(stderr, "[{}{}]\n", stats.interrupted ? "interrupted: " : "", m.stats_line(stats));
    if (stats.interrupted) return kInterruptedExit;
    messages.push_back({"assistant", m.tokenizer().decode(ids)});
  }
  return 0;
}

}  // namespace

Runner add_chat(CLI::App& app) {
  auto a = std::make_shared<ChatArgs>();
  CLI::App* c = app.add_subcommand(
      "chat",
      "Turns with a GGUF language model (its chat template); one user turn per line of stdin, an empty line ends.\n"
      "Greedy with --repeat-penalty 1.1 by default (--repeat-penalty 1: plain greedy).\n"
      "  attn chat --model SmolLM2-135M-Instruct.Q4_1.gguf\n"
      "  echo \"What is a transformer?\" | attn chat --model M.gguf -m softmax:causal,window=255:0\n"
      "  attn chat --model smollm2 --temp 0.7 --top-k 40 --top-p 0.95 --min-p 0.05 --seed 3   (llama.cpp's spellings)");
  c->add_option("--model", a->model.path, "A GGUF file with a chat template, or a model's name (attn models)")
      ->required()
      ->transform(model_file());
  c->add_option("--system", a->system, "A system message (default: the template's own, if any)");
  c->add_option("-n,--max-tokens,--n-predict", a->max_tokens, "Most tokens per reply")->capture_default_str()->check(in_range(1, 1 << 20));
  add_sampling_options(c, a->sampling, "Seed of the draws (turn t uses seed + t, modulo 2^64)");
  c->add_option("-m,--mechanism", a->model.mechanism, "Attention of every layer (causal), e.g. softmax:causal,window=255:0");
  c->add_option("--local-mechanism", a->model.local_mechanism,
                "Attention of the layers trained with a sliding window (Gemma 3's local layers)");
  c->add_option("--global-mechanism", a->model.global_mechanism, "Attention of the layers trained with every key");
  c->add_option("--dtype", a->model.dtype, "q4_1: as stored; f32: dequantized once")->capture_default_str()->check(CLI::IsMember({"q4_1", "f32"}));
  c->add_option("--activations", a->model.activations,
                "Products with quantized matrices: q8-decode (float panels for each turn's prompt, so the reply's "
                "first token too; integer dot products on 8-bit inputs for the rest of the reply), q8 (8-bit "
                "prompts too: faster, and SmolLM2 then answers the capital of France with \"L'Étoile: Paris...\"), "
                "f32, auto = q8")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "q8", "q8-decode", "f32"}));
  c->add_option("--cache-type", a->model.cache_type, "KV cache storage: f32, f16 (half the bytes), bf16 or int8 (8-bit rows with a scale each)")
      ->capture_default_str()
      ->check(CLI::IsMember({"f32", "f16", "bf16", "int8"}));
  c->add_flag("--no-repack", a->in_place,
              "Read quantized blocks in place instead of packing them in 16-row groups at load (slower decode)");
  c->add_option("-c,--ctx-size,--max-context", a->model.max_context, "Context the KV caches hold, in tokens")->capture_default_str()->check(in_range(1, 1 << 22));
  c->add_option("-t,--threads", a->model.threads, "Threads (0 = all cores)")->capture_default_str()->check(in_range(0, 256));
  c->add_flag("-q,--quiet", a->quiet, "No figures after each reply");
  return [a] { return run(*a); };
}

}  // namespace attn::cli
