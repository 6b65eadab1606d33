// attn tokenize: a GGUF file's tokenizer on a text (ids, and with -v each token's text), on the
// chat prompt of a text (--chat), or ids back to text (--decode).
#include <fmt/core.h>

#include <chrono>
#include <sstream>

#include "attn/error.hpp"
#include "attn/tokenizer.hpp"
#include "commands.hpp"
#include "io/input_file.hpp"

namespace attn::cli {
namespace {

struct TokenizeArgs {
  std::string path, text, file, decode;
  bool chat = false, no_special = false, verbose = false;
};

// "1,2, 3" -> {1, 2, 3}
std::vector<int32_t> parse_ids(const std::string& list) {
  std::vector<int32_t> ids;
  std::string item;
  std::istringstream in(list);
  while (std::getline(in, item, ',')) {
    const size_t a = item.find_first_not_of(" \t"), b = item.find_last_not_of(" \t");
    const std::string s = a == std::string::npos ? "" : item.substr(a, b - a + 1);
    size_t used = 0;
    long long v = 0;
    try {
      v = std::stoll(s, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (s.empty() || used != s.size() || v < INT32_MIN || v > INT32_MAX)
      throw Error("--decode: expected token ids separated by commas, got '" + s + "' in '" + list + "'");
    ids.push_back(static_cast<int32_t>(v));
  }
  return ids;
}

int run(const TokenizeArgs& a) {
  const Tokenizer t = Tokenizer::from_gguf(a.path);
  if (!a.decode.empty()) {
    fmt::print("{}\n", t.decode(parse_ids(a.decode)));
    return 0;
  }
  std::string text = a.file.empty() ? a.text : io::read_text_file(a.file);
  if (a.chat) {
    text = t.chat_prompt({{"user", text}}, true);
    if (a.verbose) fmt::print("chat prompt:\n{}\n", text);
  }
  const auto start = std::chrono::steady_clock::now();
  const std::vector<int32_t> ids = t.encode(text, !a.no_special);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  fmt::print("{} tokens from {} bytes in {:.1f} ms ({:.1f} MB/s)\n", ids.size(), text.size(), seconds * 1e3,
             static_cast<double>(text.size()) / 1e6 / std::max(seconds, 1e-9));
  std::string list;
  for (size_t i = 0; i < ids.size(); ++i) list += (i ? "," : "") + std::to_string(ids[i]);
  fmt::print("{}\n", list);
  if (a.verbose)
    for (const int32_t id : ids) fmt::print("{:>8}  {}\n", id, t.token_text(id));
  return 0;
}

}  // namespace

Runner add_tokenize(CLI::App& app) {
  auto a = std::make_shared<TokenizeArgs>();
  CLI::App* c = app.add_subcommand("tokenize", "A GGUF file's tokenizer (byte-level or SentencePiece BPE): text -> ids, or ids -> text");
  c->add_option("file", a->path, "A .gguf file with tokenizer.ggml.* metadata (model gpt2 or llama)")->required()->check(CLI::ExistingFile);
  auto* text = c->add_option("--text", a->text, "The text to encode");
  auto* file = c->add_option("--file", a->file, "Encode this file's bytes (a regular file of at most 64 MiB)")->check(CLI::ExistingFile);
  auto* decode = c->add_option("--decode", a->decode, "Decode these ids (\"1,2,3\") and print the text");
  text->excludes(file);
  decode->excludes(text)->excludes(file);
  c->add_flag("--chat", a->chat, "Encode the chat prompt of the text as one user message (the file's chat template, or Gemma's turns)")
      ->excludes(decode);
  c->add_flag("--no-special", a->no_special, "Treat special-token texts (<|im_start|>) as plain text");
  c->add_flag("-v,--verbose", a->verbose, "Also print each token's id and text (and the chat prompt)");
  c->callback([text, file, decode] {
    if (!*text && !*file && !*decode) throw CLI::ValidationError("tokenize", "give --text, --file or --decode");
  });
  return [a] { return run(*a); };
}

}  // namespace attn::cli
