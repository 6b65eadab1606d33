// A language model from a GGUF file with its tokenizer, for `attn generate --model` and
// `attn chat`: prompts in, streamed text out, with the speed and cache figures of each reply.
#pragma once
#include <CLI/CLI.hpp>
#include <cstdint>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "attn/gguf.hpp"
#include "attn/model.hpp"
#include "attn/sampler.hpp"
#include "attn/tokenizer.hpp"

namespace attn::cli {

struct TextModelOptions {
  std::string path;
  std::string dtype = "q4_1";  // as stored; or f32
  std::string mechanism;       // every layer's; empty: the file's (exact softmax; Gemma 3's local layers a window)
  int threads = 0;
  int64_t max_context = 4096;
  std::string activations = "auto";  // f32, q8, q8-decode or auto (Decoder::set_activations)
  std::string cache_type = "f32";    // the KV caches: f32, f16 or bf16
  bool repack = true;                // quantized matrices packed at load (GgufLoadOptions::repack)
  // the layers of one kind (DecoderLayerSpec::local: trained with a sliding window, or not); empty: as above
  std::string local_mechanism, global_mechanism;
};

struct ReplyStats {
  int64_t prompt_tokens = 0;  // tokens prefilled for this reply (the new part of the context)
  int64_t new_tokens = 0;
  double prefill_s = 0, decode_s = 0;
  bool stopped = false;      // an end-of-sequence token ended the reply
  bool interrupted = false;  // Ctrl-C ended it (interrupt.hpp)
};

// The sampling options of `attn generate` and `attn chat`, with llama.cpp's spellings:
// --temp (--temperature), --top-k, --top-p, --min-p, --repeat-penalty, --repeat-last-n, --seed.
// The defaults shown are those in `s`; `seed_help` says what the seed draws.
void add_sampling_options(CLI::App* c, SamplingOptions& s, const std::string& seed_help);
// What the validators cannot say, naming the option: --top-p 0 and --repeat-penalty 0.
void check_sampling_options(const SamplingOptions& s);

// "45.0 KiB": a byte count for people.
std::string bytes_text(double bytes);

// What a TextModel is made of, for callers that run the decoder themselves (attn serve hands it to
// an Engine): the tokenizer, the decoder (its mechanisms set as the options say, its context
// options.max_context) and the tokens that end a reply (EOS, and the end-of-turn tokens the
// vocabulary has: <|im_end|>, <|endoftext|>, <end_of_turn>).
struct TextModelParts {
  Tokenizer tokenizer;
  Decoder decoder;
  std::set<int32_t> stop_tokens;
};
TextModelParts load_text_model(const TextModelOptions& options);
// The token ids of a prompt's text, BOS first when the file asks for it (Gemma). Inline: attn
// serve's request parsing (and its fuzzer) use it without the rest of this file.
inline std::vector<int32_t> text_prompt_ids(const Tokenizer& tokenizer, const std::string& text) {
  std::vector<int32_t> ids = tokenizer.encode(text, true);
  const int32_t bos = tokenizer.bos_id();
  if (tokenizer.add_bos() && bos >= 0 && (ids.empty() || ids.front() != bos)) ids.insert(ids.begin(), bos);
  return ids;
}

class TextModel {
 public:
  explicit TextModel(const TextModelOptions& options);
  const Tokenizer& tokenizer() const { return tokenizer_; }
  const Decoder& decoder() const { return decoder_; }
  // The token ids of a prompt's text, BOS first when the file asks for it (Gemma).
  std::vector<int32_t> prompt_ids(const std::string& text) const;
  // Continues the context with `prompt` tokens (reusing the cached context when it is a prefix of
  // them, else starting over) and generates up to max_tokens, calling `piece` with each new
  // piece of text as soon as it is complete UTF-8. The reply's ids are appended to the context.
  // Ctrl-C (interrupt.hpp) ends it after the current token (stats.interrupted).
  std::vector<int32_t> reply(const std::vector<int32_t>& prompt, int64_t max_tokens, const SamplingOptions& sampling,
                             const std::function<void(const std::string&)>& piece, ReplyStats& stats);
  // One line: prefill and decode tokens/s, KV-cache bytes per token and in all.
  std::string stats_line(const ReplyStats& s) const;

 private:
  explicit TextModel(TextModelParts parts);
  Tokenizer tokenizer_;
  Decoder decoder_;
  std::set<int32_t> stop_;
  std::vector<int32_t> context_;  // the tokens in the decoder's caches
};

}  // namespace attn::cli
