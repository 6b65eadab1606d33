// attn generate --model FILE.gguf: a real language model continues a text prompt, streaming its
// text (text_model.hpp), with llama.cpp's option spellings (-p, -n, -c, -t, --temp, --top-k, ...).
// attn generate-random: a decoder (random weights, or a safetensors file with --weights) prefills
// a random prompt and decodes greedily; prints prefill and decode tokens/s and what the caches
// hold per token, KV-cache (softmax) layers against recurrent-state (lightning) layers. The two
// are separate commands so that no option means one thing in one mode and another in the other
// (--top-k was experts per token for random models, and silently so beside --model).
#include <fmt/core.h>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>

#include "attn/attn.hpp"
#include "attn/model.hpp"
#include "base/parallel.hpp"
#include "cache_summary.hpp"
#include "commands.hpp"
#include "interrupt.hpp"
#include "log_level.hpp"
#include "model_option.hpp"
#include "usage.hpp"
#include "text_model.hpp"

namespace attn::cli {
namespace {

// attn generate-random's options
struct GenerateArgs {
  std::string weights, save_weights, hybrid, mechanism = "softmax:causal", weights_dtype = "f32", arch = "llama";
  int64_t layers = 8, dim = 512, heads = 8, kv_heads = 2, head_dim = 64, hidden = 1408, vocab = 32000;
  int64_t experts = 8, top_k = 2, expert_hidden = 0;  // --arch minimax (expert_hidden 0: 1.5 x dim)
  bool no_compare = false;
  int64_t prompt_tokens = 512, new_tokens = 128;
  uint64_t seed = 1;
  int threads = 0;
  bool quiet = false;
};

// attn generate's options: a GGUF language model and a text prompt
struct TextArgs {
  TextModelOptions model;
  std::string prompt;
  bool chat = false;
  bool in_place = false;  // --no-repack
  bool quiet = false;
  int64_t max_tokens = 128;
  SamplingOptions sampling{0.0, 1.0, 1};
};

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// One progress line on stderr: rewritten in place on a terminal, a new line every 10 s otherwise.
class Progress {
 public:
  explicit Progress(bool quiet) : quiet_(quiet), tty_(isatty(STDERR_FILENO) != 0) { restart(); }
  void update(const char* what, int64_t done, int64_t total, Clock::time_point start) {
    if (quiet_) return;
    const double now = seconds_since(start);
    if (done < total && now - last_ < (tty_ ? 0.25 : 10.0)) return;
    last_ = now;
    const double rate = done / std::max(now, 1e-9);
    const std::string line = fmt::format("{} {}/{} tokens, {:.0f} tok/s, {:.0f} s left", what, done, total, rate,
                                         (total - done) / std::max(rate, 1e-9));
    if (tty_) fmt::print(stderr, "\r{:<70}{}", line, done == total ? "\n" : "");
    else if (done < total) fmt::print(stderr, "{}\n", line);
    std::fflush(stderr);
  }
  void restart() { last_ = tty_ ? -1e9 : 0.0; }  // logs: the first line after 10 s

 private:
  bool quiet_, tty_;
  double last_ = 0;
};

Decoder make_decoder(const GenerateArgs& a) {
  const int64_t max_seq = a.prompt_tokens + a.new_tokens;
  if (!a.weights.empty()) {
    Decoder d = Decoder::from_safetensors(a.weights, a.threads);
    if (d.config().max_seq_len < max_seq)
      throw Error("--prompt-tokens + --new-tokens (" + std::to_string(max_seq) + ") exceed the file's max_seq_len " +
                  std::to_string(d.config().max_seq_len));
    return d;
  }
  DecoderConfig c;
  c.vocab_size = a.vocab, c.dim = a.dim, c.hidden_dim = a.hidden, c.heads = a.heads, c.kv_heads = a.kv_heads;
  c.head_dim = a.head_dim, c.max_seq_len = max_seq;
  LayerLayout layout;
  layout.layers = a.layers, layout.softmax = parse_mechanism(a.mechanism);
  layout.experts = a.experts, layout.top_k = a.top_k, layout.expert_hidden = a.expert_hidden;
  if (!a.hybrid.empty()) {
    // L:S, each a count of layers: digits only, at most 4 (a layer count is at most 4096)
    const size_t colon = a.hybrid.find(':');
    auto count = [&](const std::string& digits) {
      if (digits.empty() || digits.size() > 4 || digits.find_first_not_of("0123456789") != std::string::npos)
        throw Error("--hybrid expects L:S (lightning:softmax layers per group, counts of layers up to "
                    "4096, e.g. 7:1), got '" + a.hybrid + "'");
      return static_cast<int64_t>(std::stoi(digits));
    };
    if (colon == std::string::npos) count("");
    layout.hybrid_linear = count(a.hybrid.substr(0, colon));
    layout.hybrid_softmax = count(a.hybrid.substr(colon + 1));
  }
  c.architecture = a.arch;
  try {
    c.lay_out(layout);
  } catch (const Error& e) {
    throw Error("--arch " + a.arch + ": " + e.what());
  }
  const DType dt = a.weights_dtype == "bf16" ? DType::bf16 : DType::f32;
  return Decoder::random(c, a.seed, dt, a.threads);
}

int run_text_model(const TextArgs& a) {
  if (a.prompt.empty()) fail("-p/--prompt", "must not be empty: the text the model continues");
  check_sampling_options(a.sampling);
  TextModelOptions options = a.model;
  options.repack = !a.in_place;
  TextModel m(options);
  const Tokenizer& tok = m.tokenizer();
  const std::string text = a.chat ? tok.chat_prompt({{"user", a.prompt}}, true) : a.prompt;
  const std::vector<int32_t> prompt = m.prompt_ids(text);
  if (!a.chat) fmt::print("{}", a.prompt);
  std::fflush(stdout);
  ReplyStats stats;
  catch_interrupts();
  m.reply(prompt, a.max_tokens, a.sampling, [](const std::string& piece) {
    fmt::print("{}", piece);
    std::fflush(stdout);
  }, stats);
  fmt::print("\n");
  std::fflush(stdout);
  if ((!a.quiet && logs(LogLevel::info)) || stats.interrupted)
    fmt::print(stderr, "[{}{}]\n", stats.interrupted ? "interrupted: " : "", m.stats_line(stats));
  return stats.interrupted ? kInterruptedExit : 0;
}

struct Timing {
  double prefill_s = 0, decode_s = 0;
  std::vector<int32_t> generated;
};

// Prefills a seeded random prompt and decodes greedily.
Timing measure(Decoder& d, const GenerateArgs& a) {
  const DecoderConfig& c = d.config();
  std::mt19937 rng(static_cast<uint32_t>(a.seed));
  std::uniform_int_distribution<int32_t> id(0, static_cast<int32_t>(c.vocab_size - 1));
  std::vector<int32_t> prompt(static_cast<size_t>(a.prompt_tokens));
  for (int32_t& t : prompt) t = id(rng);

  Progress progress(a.quiet || !logs(LogLevel::info));
  constexpr int64_t kPiece = 256;  // prefill in pieces, for the progress line
  auto t0 = Clock::now();
  std::vector<float> logits;
  for (int64_t i = 0; i < a.prompt_tokens; i += kPiece) {
    const int64_t n = std::min(kPiece, a.prompt_tokens - i);
    logits = d.forward({prompt.begin() + i, prompt.begin() + i + n}, i);
    progress.update("prefill", i + n, a.prompt_tokens, t0);
  }
  const double prefill_s = seconds_since(t0);
  progress.restart();
  t0 = Clock::now();
  std::vector<int32_t> generated;
  Sampler greedy({});  // NaN logits (NaN weights in --weights) are an error, not token 0
  for (int64_t i = 0; i < a.new_tokens; ++i) {
    const int32_t next = greedy.next(logits.data(), static_cast<int64_t>(logits.size()));
    generated.push_back(next);
    logits = d.forward({next}, d.position());
    progress.update("decode", i + 1, a.new_tokens, t0);
  }
  return {prefill_s, seconds_since(t0), generated};
}

std::string feed_forward_text(const DecoderConfig& c) {
  if (c.moe_experts > 0)
    return fmt::format("MoE {} experts top-{} x SwiGLU {}", c.moe_experts, c.moe_top_k, c.hidden_dim);
  return fmt::format("SwiGLU {}", c.hidden_dim);
}

// An architecture with a baseline (minimax: llama): the baseline model of the same width, heads and
// layers (its own layout, one dense SwiGLU of --hidden) on the same prompt, and the two side by side.
void compare_with_baseline(const Decoder& model, const Timing& mt, const std::string& baseline, const GenerateArgs& a) {
  GenerateArgs ba = a;
  ba.arch = baseline, ba.hybrid.clear();
  Decoder base = make_decoder(ba);
  fmt::print("compare  the {} model of this width ({} layers softmax, {}): running it on the same prompt\n", baseline,
             base.config().layers.size(), feed_forward_text(base.config()));
  const Timing bt = measure(base, ba);
  const int64_t ctx = a.prompt_tokens + a.new_tokens;
  auto row = [&](const std::string& name, const Decoder& d, const Timing& t) {
    const double decode = a.new_tokens > 0 ? static_cast<double>(a.new_tokens) / t.decode_s : 0.0;
    fmt::print("  {:<8} {:>8.1f}M {:>12.1f} {:>12.1f} {:>14} {:>12} {:>16}\n", name,
               static_cast<double>(d.parameter_count()) / 1e6, static_cast<double>(a.prompt_tokens) / t.prefill_s, decode,
               bytes_text(static_cast<double>(d.kv_bytes_per_token())),
               bytes_text(static_cast<double>(d.state_bytes() + d.bounded_cache_bytes())),
               bytes_text(static_cast<double>(cache_bytes_at(d, ctx)) / static_cast<double>(ctx)));
  };
  fmt::print("  {:<8} {:>9} {:>12} {:>12} {:>14} {:>12} {:>16}\n", "arch", "params", "prefill t/s", "decode t/s",
             "KV per token", "fixed state", fmt::format("per token @{}", ctx));
  row(a.arch, model, mt);
  row(baseline, base, bt);
}

std::string baseline_of(const std::string& arch) {
  for (const ArchitectureInfo& i : architectures())
    if (i.name == arch) return i.baseline;
  return "";
}

int run(const GenerateArgs& a) {
  Decoder d = make_decoder(a);
  const DecoderConfig& c = d.config();
  int64_t lightning = 0;
  for (const DecoderLayerSpec& l : c.layers) lightning += l.lightning;
  const int64_t cached_layers = static_cast<int64_t>(c.layers.size()) - lightning;
  fmt::print("attn generate-random: {} layers ({} with a KV cache, {} lightning), dim {}, heads {}/{} x {}, {}, vocab {},\n"
             "  {} architecture, {:.1f}M parameters; isa {}, {} threads\n",
             c.layers.size(), cached_layers, lightning, c.dim, c.heads, c.kv_heads, c.head_dim, feed_forward_text(c),
             c.vocab_size, c.architecture, static_cast<double>(d.parameter_count()) / 1e6, isa_name(active_isa()),
             resolve_threads(a.threads, int64_t{1} << 30));
  if (!a.save_weights.empty()) {
    d.save(a.save_weights);
    fmt::print("  weights written to {}\n", a.save_weights);
  }
  const Timing run = measure(d, a);
  const double prefill_s = run.prefill_s, decode_s = run.decode_s;
  const std::vector<int32_t>& generated = run.generated;

  fmt::print("prefill  {:>6} tokens in {:8.3f} s = {:9.1f} tok/s\n", a.prompt_tokens, prefill_s, a.prompt_tokens / prefill_s);
  if (a.new_tokens > 0)
    fmt::print("decode   {:>6} tokens in {:8.3f} s = {:9.1f} tok/s  (greedy; context {} -> {})\n", a.new_tokens, decode_s,
               a.new_tokens / decode_s, a.prompt_tokens, d.position());
  const int64_t per_layer = 2 * c.kv_heads * c.head_dim * static_cast<int64_t>(sizeof(float));
  const int64_t all_softmax = per_layer * static_cast<int64_t>(c.layers.size());
  fmt::print("cache    {}\n", cache_summary(d));
  const int64_t ctx = d.position(), held = cache_bytes_at(d, ctx);
  fmt::print("         at {} tokens: {} (an all-softmax stack of this shape: {}, {:.4f}x)\n", ctx,
             bytes_text(static_cast<double>(held)), bytes_text(static_cast<double>(all_softmax * ctx)),
             static_cast<double>(held) / static_cast<double>(all_softmax * ctx));
  if (!generated.empty()) {
    fmt::print("tokens   ");
    for (size_t i = 0; i < std::min<size_t>(generated.size(), 16); ++i) fmt::print("{} ", generated[i]);
    fmt::print("{}\n", generated.size() > 16 ? "..." : "");
  }
  if (const std::string baseline = baseline_of(a.arch); !baseline.empty() && !a.no_compare)
    compare_with_baseline(d, run, baseline, a);
  return 0;
}

// Options that do nothing in the mode the call is in are refused, naming the mode (a flag that is
// accepted and ignored is a surprise).
void refuse_options(const CLI::App& c, std::initializer_list<const char*> names, const std::string& mode) {
  for (const char* name : names)
    if (c.count(name) > 0) {
      std::string spelled;  // every long name: --experts-per-token/--top-k
      for (const std::string& l : c.get_option(name)->get_lnames()) spelled += (spelled.empty() ? "--" : "/--") + l;
      throw Error(spelled + " does not apply to " + mode);
    }
}

// Whether `arch` lays out a random model's feed-forward as a mixture of experts (the registry
// answers by laying out a one-layer model): --experts, --top-k and --expert-hidden mean nothing
// otherwise.
bool has_experts(const std::string& arch) {
  DecoderConfig c;
  c.architecture = arch;
  LayerLayout one;
  one.layers = 1, one.softmax = parse_mechanism("softmax:causal");
  c.lay_out(one);
  return c.moe_experts > 0;
}

// The architectures with a mixture of experts, for messages ("minimax").
std::string expert_architectures() {
  std::string names;
  for (const ArchitectureInfo& i : architectures())
    if (has_experts(i.name)) names += (names.empty() ? "" : ", ") + i.name;
  return names;
}

// What DecoderConfig::validate would refuse in a random model, said with the options the user
// typed (its field names, moe_top_k or kv_heads, are not on the command line).
void check_random_shape(const GenerateArgs& a) {
  if (a.heads % a.kv_heads != 0)
    fail("--kv-heads", "must divide --heads " + std::to_string(a.heads) + ", got " + std::to_string(a.kv_heads));
  if (a.head_dim % 2 != 0)
    fail("--head-dim", "must be even (RoPE rotates pairs of channels), got " + std::to_string(a.head_dim));
  if (!info(parse_mechanism(a.mechanism)).causal)
    fail("--mechanism", "must be causal (a decoder's token sees only the past: e.g. softmax:causal), got '" +
                            a.mechanism + "'");
  if (has_experts(a.arch) && a.top_k > a.experts)
    fail("--experts-per-token", "expected an integer in [1, --experts = " + std::to_string(a.experts) + "], got " +
                        std::to_string(a.top_k));
}

void check_modes(const CLI::App& c, const GenerateArgs& a) {
  if (!a.weights.empty()) {
    refuse_options(c, {"--layers", "--arch", "--experts", "--experts-per-token", "--expert-hidden", "--hybrid", "--dim",
                       "--heads", "--kv-heads", "--head-dim", "--hidden", "--vocab", "--weights-dtype", "--mechanism"},
                   "--weights (the file holds the model's shape and mechanisms)");
    return;
  }
  if (baseline_of(a.arch).empty())
    refuse_options(c, {"--no-compare"}, "this --arch (it has no baseline model to run beside it)");
  if (!has_experts(a.arch))
    refuse_options(c, {"--experts", "--experts-per-token", "--expert-hidden"},
                   "--arch " + a.arch + " (its layers have no mixture of experts; architectures with one: " +
                       expert_architectures() + ")");
  check_random_shape(a);
}

}  // namespace

Runner add_generate(CLI::App& app) {
  auto a = std::make_shared<TextArgs>();
  CLI::App* c = app.add_subcommand(
      "generate",
      "A GGUF language model continues a text prompt, streamed (llama.cpp's spellings: -p, -n, -c, -t, --temp, ...).\n"
      "  attn generate --model smollm2 -p \"What is attention?\" --chat   (a model package by name)\n"
      "  attn generate --model M.gguf -p \"Once upon a time\" -n 64 --temp 0.8 --top-k 40 --top-p 0.95 --seed 3\n"
      "  attn generate --model M.gguf -p \"...\" --repeat-penalty 1.1 --repeat-last-n 64\n"
      "  attn generate --model M.gguf -p \"...\" -m softmax:causal,window=255:0,sinks=4   (every layer windowed)\n"
      "Random or safetensors decoders (tokens/s, cache bytes): attn generate-random.");
  c->add_option("--model", a->model.path,
                "A GGUF file (an architecture attn reads), or a model's name (attn models: smollm2, ...)")
      ->required()
      ->transform(model_file());
  c->add_option("-p,--prompt", a->prompt, "Text to continue")->required();
  c->add_flag("--chat", a->chat, "Wrap --prompt in the model's chat template as one user turn");
  c->add_option("-n,--max-tokens,--n-predict", a->max_tokens, "Most tokens to generate")
      ->capture_default_str()->check(in_range(0, 1 << 20));
  add_sampling_options(c, a->sampling, "Seed of the draws (--temp > 0)");
  c->add_option("--dtype", a->model.dtype, "q4_1: matrices as stored in the file; f32: dequantized once at load")
      ->capture_default_str()->check(CLI::IsMember({"q4_1", "f32"}));
  c->add_option("--activations", a->model.activations,
                "Products with quantized matrices: q8 (inputs rounded to 8 bits per block of 32, integer dot "
                "products, as llama.cpp's decode; prompts too), q8-decode (q8 for decode steps, float panels for "
                "prompts), f32 (float inputs), auto = q8")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "q8", "q8-decode", "f32"}));
  c->add_option("--cache-type", a->model.cache_type,
                "KV cache storage: f32, f16 (half the bytes per token of context, llama.cpp's default), bf16, or "
                "int8 (each row of K and V rounded to 8 bits with a scale: about a quarter of f32's bytes)")
      ->capture_default_str()
      ->check(CLI::IsMember({"f32", "f16", "bf16", "int8"}));
  c->add_flag("--no-repack", a->in_place,
              "Read Q4_0/Q4_1/Q8_0 blocks in place in the mapped file instead of packing them in 16-row groups at "
              "load (decode is slower; for comparison)");
  c->add_option("-c,--ctx-size,--max-context", a->model.max_context, "Context the KV caches hold, in tokens")
      ->capture_default_str()->check(in_range(1, 1 << 22));
  c->add_option("-m,--mechanism", a->model.mechanism, "Attention of every layer (causal), e.g. softmax:causal,window=4095:0 "
                "(default: the file's)");
  c->add_option("--local-mechanism", a->model.local_mechanism,
                "Attention of the layers trained with a sliding window (Gemma 3's local layers)");
  c->add_option("--global-mechanism", a->model.global_mechanism, "Attention of the layers trained with every key");
  c->add_option("-t,--threads", a->model.threads, "Threads (0 = all cores)")->capture_default_str()->check(in_range(0, 256));
  c->add_flag("-q,--quiet", a->quiet, "No speed and cache figures after the text");
  return [a] { return run_text_model(*a); };
}

Runner add_generate_random(CLI::App& app) {
  auto a = std::make_shared<GenerateArgs>();
  CLI::App* c = app.add_subcommand(
      "generate-random",
      "A decoder of random weights (or a safetensors file) prefills a random prompt and decodes greedily: tokens/s and\n"
      "cache memory per token.\n"
      "  attn generate-random --layers 8 --hybrid 7:1 --prompt-tokens 512 --new-tokens 128\n"
      "  attn generate-random --arch minimax --layers 8   (MiniMax-01's block; also runs the llama-style model)\n"
      "  attn generate-random --weights model.safetensors --prompt-tokens 64   (a file Decoder.save() wrote)\n"
      "Text from a GGUF language model: attn generate --model.");
  c->add_option("--weights", a->weights, "A safetensors file with the decoder config in its metadata (default: random "
                "weights of the shape the options below give)")->check(CLI::ExistingFile);
  c->add_option("--save-weights", a->save_weights, "Write the model to this safetensors file");
  c->add_option("--layers", a->layers, "Layers")->capture_default_str()->check(in_range(1, 1024));
  std::string arch_help = "Random models' architecture:";
  std::vector<std::string> arch_names;
  for (const ArchitectureInfo& i : architectures()) {
    arch_help += " " + i.name + " (" + i.summary + ")" +
                 (i.baseline.empty() ? "" : ", then runs the " + i.baseline + " model of the same width beside it");
    arch_help += ";";
    arch_names.push_back(i.name);
  }
  arch_help.back() = '.';
  c->add_option("--arch", a->arch, arch_help + " Layers as --hybrid says where the architecture takes a hybrid.")
      ->capture_default_str()->check(CLI::IsMember(arch_names));
  c->add_option("--experts", a->experts, "Experts of each MoE feed-forward (architectures with one)")->capture_default_str()->check(in_range(1, 4096));
  c->add_option("--experts-per-token,--top-k", a->top_k, "Experts each token is routed to (architectures with a MoE feed-forward)")
      ->capture_default_str()->check(in_range(1, 4096));
  c->add_option("--expert-hidden", a->expert_hidden, "Each expert's SwiGLU width (architectures with a MoE feed-forward); 0: 1.5 x --dim, "
                "MiniMax-01's ratio (9216 / 6144)")->capture_default_str()->check(in_range(0, 1 << 18));
  c->add_flag("--no-compare", a->no_compare, "Do not run the architecture's baseline model beside it");
  c->add_option("--hybrid", a->hybrid,
                "L:S: groups of L lightning (linear, recurrent state) then S softmax layers; 7:1 is MiniMax-01's layout");
  c->add_option("-m,--mechanism", a->mechanism, "Attention of the KV-cache layers (causal), e.g. softmax:causal,window=4095:0")
      ->capture_default_str();
  c->add_option("--dim", a->dim, "Model width")->capture_default_str()->check(in_range(1, 1 << 16));
  c->add_option("--heads", a->heads, "Query heads")->capture_default_str()->check(in_range(1, 1024));
  c->add_option("--kv-heads", a->kv_heads, "Key/value heads of softmax layers (GQA)")->capture_default_str()->check(in_range(1, 1024));
  c->add_option("--head-dim", a->head_dim, "Head dimension")->capture_default_str()->check(in_range(2, 1024));
  c->add_option("--hidden", a->hidden, "SwiGLU width")->capture_default_str()->check(in_range(1, 1 << 18));
  c->add_option("--vocab", a->vocab, "Vocabulary size")->capture_default_str()->check(in_range(1, 1 << 20));
  c->add_option("--weights-dtype", a->weights_dtype, "Storage of random weight matrices")
      ->capture_default_str()->check(CLI::IsMember({"f32", "bf16"}));
  c->add_option("--prompt-tokens", a->prompt_tokens, "Prompt length (random token ids)")->capture_default_str()->check(in_range(1, 1 << 22));
  c->add_option("--new-tokens", a->new_tokens, "Tokens to generate (greedy)")->capture_default_str()->check(in_range(0, 1 << 22));
  add_seed_option(c, a->seed, "Seed of the random weights and prompt");
  c->add_option("-t,--threads", a->threads, "Threads (0 = all cores)")->capture_default_str()->check(in_range(0, 256));
  c->add_flag("-q,--quiet", a->quiet, "No progress line");
  return [a, c] {
    check_modes(*c, *a);
    return run(*a);
  };
}

}  // namespace attn::cli
