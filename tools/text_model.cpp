#include "text_model.hpp"
#include "interrupt.hpp"

#include "cache_summary.hpp"
#include "commands.hpp"
#include "log_level.hpp"
#include "usage.hpp"

#include <fmt/core.h>

#include <algorithm>
#include <chrono>
#include <map>

#include "attn/error.hpp"
#include "attn/isa.hpp"
#include "attn/mechanism.hpp"
#include "base/parallel.hpp"

namespace attn::cli {
namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// Bytes of `text` that end with a complete UTF-8 character (a token may end mid-character).
size_t complete_utf8(const std::string& text) {
  size_t n = text.size(), back = 0;
  while (back < n && back < 4 && (static_cast<unsigned char>(text[n - 1 - back]) & 0xC0) == 0x80) ++back;
  if (back == n) return n;
  const unsigned char lead = static_cast<unsigned char>(text[n - 1 - back]);
  const size_t need = lead >= 0xF0 ? 4 : lead >= 0xE0 ? 3 : lead >= 0xC0 ? 2 : 1;
  return need > back + 1 ? n - 1 - back : n;
}

}  // namespace

void add_sampling_options(CLI::App* c, SamplingOptions& s, const std::string& seed_help) {
  c->add_option("--temp,--temperature", s.temperature, "Temperature: 0 greedy; > 0 sample from softmax(logits / temp)")
      ->capture_default_str()->check(in_range(0.0, 100.0));
  c->add_option("--top-k", s.top_k, "Sample only from the k most likely tokens (0 = off)")
      ->capture_default_str()->check(in_range(int64_t{0}, int64_t{1} << 30));
  c->add_option("--top-p", s.top_p, "Nucleus sampling: the fewest most likely tokens whose probability reaches p, in (0, 1] (1 = off)")
      ->capture_default_str()->check(in_range(0.0, 1.0));
  c->add_option("--min-p", s.min_p, "Sample only tokens of probability >= min-p x the most likely one's, in [0, 1] (0 = off)")
      ->capture_default_str()->check(in_range(0.0, 1.0));
  c->add_option("--repeat-penalty", s.repeat_penalty,
                "Penalise the tokens among the last --repeat-last-n of the context: a positive logit divided by it, a "
                "negative one multiplied (1 = off; greedy decoding too)")
      ->capture_default_str()->check(in_range(0.0, 100.0));
  c->add_option("--repeat-last-n", s.repeat_last_n, "Tokens of the context --repeat-penalty looks back on (0 = none, -1 = all)")
      ->capture_default_str()->check(in_range(int64_t{-1}, int64_t{1} << 22));
  add_seed_option(c, s.seed, seed_help);
}

void check_sampling_options(const SamplingOptions& s) {
  if (s.top_p <= 0.0) fail("--top-p", "expected a number in (0, 1] (1 = off), got 0");
  if (s.repeat_penalty <= 0.0) fail("--repeat-penalty", "expected a number > 0 (1 = off), got 0");
}

std::string bytes_text(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB"};
  int u = 0;
  while (b >= 1024 && u < 3) b /= 1024, ++u;
  return u == 0 ? fmt::format("{:.0f} B", b) : fmt::format("{:.1f} {}", b, units[u]);
}

namespace {

// Whether --dtype asks for float32 matrices (checked before the file is read).
bool dequantize(const std::string& dtype) {
  if (dtype != "f32" && dtype != "q4_1") fail("--dtype", "expected q4_1 (as stored) or f32, got '" + dtype + "'");
  return dtype == "f32";
}

DType cache_dtype(const std::string& name) {
  if (name == "f32") return DType::f32;
  if (name == "f16") return DType::f16;
  if (name == "bf16") return DType::bf16;
  if (name == "int8") return DType::i8;
  fail("--cache-type", "expected f32, f16, bf16 or int8, got '" + name + "'");
}

}  // namespace

TextModelParts load_text_model(const TextModelOptions& o) {
  TextModelParts p{Tokenizer::from_gguf(GgufFile::open(o.path)),
                   Decoder::from_gguf(o.path, {o.threads, dequantize(o.dtype), o.max_context, o.activations,
                                               cache_dtype(o.cache_type), o.repack}),
                   {}};
  if (!o.mechanism.empty()) p.decoder.set_mechanism(-1, parse_mechanism(o.mechanism));
  for (const auto& [local, text] : {std::pair{true, &o.local_mechanism}, std::pair{false, &o.global_mechanism}}) {
    if (text->empty()) continue;
    const Mechanism m = parse_mechanism(*text);
    for (size_t i = 0; i < p.decoder.config().layers.size(); ++i)
      if (p.decoder.config().layers[i].local == local) p.decoder.set_mechanism(static_cast<int64_t>(i), m);
  }
  if (logs(LogLevel::debug)) {
    std::map<std::string, int64_t> types;  // tensor type -> count
    int64_t bytes = 0;
    const GgufFile file = GgufFile::open(o.path);
    for (const GgufTensor& t : file.tensors()) {
      const GgmlTypeInfo* info = ggml_type_info(t.type);  // a type attn does not know was refused at load
      ++types[info ? info->name : "type " + std::to_string(t.type)], bytes += t.bytes;
    }
    std::string kinds;
    for (const auto& [name, n] : types) kinds += (kinds.empty() ? "" : ", ") + name + " x " + std::to_string(n);
    const DecoderConfig& c = p.decoder.config();
    fmt::print(stderr,
               "[debug] load {}: {} architecture, {} layers, dim {}, vocab {}; {} tensors ({}), {}\n"
               "[debug] dtype {}, activations {}, cache {}, repack {}, context {} tokens; {} threads, isa {}\n",
               o.path, c.architecture, c.layers.size(), c.dim, c.vocab_size, file.tensors().size(), kinds,
               bytes_text(static_cast<double>(bytes)), o.dtype, o.activations, o.cache_type, o.repack ? "yes" : "no",
               c.max_seq_len, resolve_threads(o.threads, int64_t{1} << 30), isa_name(active_isa()));
  }
  if (p.tokenizer.eos_id() >= 0) p.stop_tokens.insert(p.tokenizer.eos_id());
  for (const char* special : {"<|im_end|>", "<|endoftext|>", "<end_of_turn>"}) {
    const std::vector<int32_t> ids = p.tokenizer.encode(special, true);
    if (ids.size() == 1) p.stop_tokens.insert(ids[0]);
  }
  return p;
}

TextModel::TextModel(const TextModelOptions& o) : TextModel(load_text_model(o)) {}

TextModel::TextModel(TextModelParts parts)
    : tokenizer_(std::move(parts.tokenizer)), decoder_(std::move(parts.decoder)), stop_(std::move(parts.stop_tokens)) {}

std::vector<int32_t> TextModel::reply(const std::vector<int32_t>& prompt, int64_t max_tokens, const SamplingOptions& sampling,
                                      const std::function<void(const std::string&)>& piece, ReplyStats& stats) {
  if (prompt.empty()) fail("prompt", "must not be empty");
  check_generation_length("--max-tokens", static_cast<int64_t>(prompt.size()), max_tokens,
                          decoder_.config().max_seq_len);  // the context is --max-context
  // reuse the cached context when the prompt extends it
  const bool extends = context_.size() < prompt.size() && std::equal(context_.begin(), context_.end(), prompt.begin());
  if (!extends) decoder_.reset(), context_.clear();
  const std::vector<int32_t> fresh(prompt.begin() + static_cast<std::ptrdiff_t>(context_.size()), prompt.end());
  stats = {};
  stats.prompt_tokens = static_cast<int64_t>(fresh.size());
  Sampler sampler(sampling);
  auto t0 = Clock::now();
  std::vector<float> logits = decoder_.forward(fresh, decoder_.position());
  context_ = prompt;
  stats.prefill_s = seconds_since(t0);
  t0 = Clock::now();
  std::vector<int32_t> out;
  std::string text;
  size_t shown = 0;
  for (int64_t i = 0; i < max_tokens; ++i) {
    if (interrupted()) {
      stats.interrupted = true;
      break;
    }
    const int32_t next = sampler.next(logits.data(), static_cast<int64_t>(logits.size()), context_);
    if (stop_.count(next)) {
      stats.stopped = true;
      break;
    }
    out.push_back(next);
    text = tokenizer_.decode(out);
    const size_t ready = complete_utf8(text);
    if (ready > shown) piece(text.substr(shown, ready - shown)), shown = ready;
    if (i + 1 == max_tokens) break;
    logits = decoder_.forward({next}, decoder_.position());
    context_.push_back(next);
  }
  if (text.size() > shown) piece(text.substr(shown));
  stats.new_tokens = static_cast<int64_t>(out.size());
  stats.decode_s = seconds_since(t0);
  return out;
}

std::vector<int32_t> TextModel::prompt_ids(const std::string& text) const { return text_prompt_ids(tokenizer_, text); }

std::string TextModel::stats_line(const ReplyStats& s) const {
  return fmt::format("prefill {} tokens {:.1f} tok/s, decode {} tokens {:.1f} tok/s; cache {} at {} tokens ({})",
                     s.prompt_tokens, s.prompt_tokens / std::max(s.prefill_s, 1e-9), s.new_tokens,
                     s.new_tokens / std::max(s.decode_s, 1e-9),
                     bytes_text(static_cast<double>(cache_bytes_at(decoder_, decoder_.position()))), decoder_.position(),
                     cache_summary(decoder_));
}

}  // namespace attn::cli
