// Tokenizer::from_gguf: the tokenizer.ggml.* metadata of a GGUF file, checked for kind (here) and
// size (the Tokenizer constructor).
#include <cstdint>

#include "attn/error.hpp"
#include "attn/gguf.hpp"
#include "attn/tokenizer.hpp"

namespace attn {
namespace {

const GgufValue& array_of(const GgufFile& f, const std::string& key, GgufType element) {
  const GgufValue& v = f.value(key);
  if (v.type != GgufType::array || v.element_type != element)
    fail(f.name(), "metadata '" + key + "' must be an array of " + gguf_type_name(element) + ", got " +
                       (v.type == GgufType::array ? "an array of " + gguf_type_name(v.element_type) : gguf_type_name(v.type)));
  return v;
}

bool flag(const GgufFile& f, const std::string& key, bool otherwise) {
  if (!f.has(key)) return otherwise;
  const GgufValue& v = f.value(key);
  if (v.type != GgufType::boolean) fail(f.name(), "metadata '" + key + "' must be a bool, got " + gguf_type_name(v.type));
  return v.integer != 0;
}

int32_t token_id(const GgufFile& f, const std::string& key) {
  if (!f.has(key)) return -1;
  const int64_t id = f.integer(key);
  if (id < 0 || id > INT32_MAX) fail(f.name(), "metadata '" + key + "' = " + std::to_string(id) + " is not a token id");
  return static_cast<int32_t>(id);
}

}  // namespace

Tokenizer Tokenizer::from_gguf(const GgufFile& f) {
  if (!f.has("tokenizer.ggml.model"))
    fail(f.name(), "has no tokenizer: the metadata 'tokenizer.ggml.model' is missing");
  const std::string& model = f.text("tokenizer.ggml.model");
  if (model != "gpt2" && model != "llama")
    fail(f.name(), "tokenizer.ggml.model is '" + model + "'; attn reads byte-level BPE ('gpt2') and SentencePiece BPE ('llama') tokenizers");
  const bool spm = model == "llama";
  TokenizerVocab v;
  v.model = model;
  v.tokens = array_of(f, "tokenizer.ggml.tokens", GgufType::string).strings;
  if (f.has("tokenizer.ggml.token_type")) {
    const GgufValue& types = f.value("tokenizer.ggml.token_type");
    const GgufType e = types.element_type;
    if (types.type != GgufType::array || e == GgufType::string || e == GgufType::float32 || e == GgufType::float64)
      array_of(f, "tokenizer.ggml.token_type", GgufType::int32);  // its error
    for (const double t : types.numbers)  // integers; one outside int32 is no type attn knows (0: as normal)
      v.types.push_back(t >= INT32_MIN && t <= INT32_MAX ? static_cast<int32_t>(t) : 0);
  }
  if (spm) {
    // The Tokenizer constructor checks the counts against the tokens.
    if (f.has("tokenizer.ggml.merges"))
      fail(f.name(), "metadata 'tokenizer.ggml.merges' is given, but a SentencePiece ('llama') tokenizer merges by token score and takes none");
    for (const double x : array_of(f, "tokenizer.ggml.scores", GgufType::float32).numbers) v.scores.push_back(static_cast<float>(x));
    if (f.has("tokenizer.ggml.pre")) f.text("tokenizer.ggml.pre");  // its kind; SentencePiece has no pre-tokenizer
    v.add_space_prefix = flag(f, "tokenizer.ggml.add_space_prefix", true);
    v.unk_id = token_id(f, "tokenizer.ggml.unknown_token_id");
    // Gemma as Hugging Face's GGUF conversion reads it (transformers' gemma_tokenizer): tokens of
    // spaces only are stored with real spaces but stand for runs of '▁', so they merge like normal
    // tokens; and merges rank by the tokens' order in the file, which Gemma's scores do not follow.
    const std::string arch = f.has("general.architecture") ? f.text("general.architecture") : "";
    if (arch == "gemma" || arch == "gemma2" || arch == "gemma3") {
      v.merge_by_id = true;
      for (size_t i = 0; i < v.tokens.size(); ++i) {
        std::string& t = v.tokens[i];
        if (t.empty() || t.find_first_not_of(' ') != std::string::npos) continue;
        std::string marks;
        for (size_t k = 0; k < t.size(); ++k) marks += "\xE2\x96\x81";  // '▁'
        t = std::move(marks);
        if (i < v.types.size()) v.types[i] = 1;
      }
    }
  } else {
    v.merges = array_of(f, "tokenizer.ggml.merges", GgufType::string).strings;
    v.pre = f.has("tokenizer.ggml.pre") ? f.text("tokenizer.ggml.pre") : "gpt2";
  }
  v.bos_id = token_id(f, "tokenizer.ggml.bos_token_id");
  v.eos_id = token_id(f, "tokenizer.ggml.eos_token_id");
  v.pad_id = token_id(f, "tokenizer.ggml.padding_token_id");
  // llama.cpp and Hugging Face add BOS to a SentencePiece vocabulary that does not say otherwise
  v.add_bos = flag(f, "tokenizer.ggml.add_bos_token", spm);
  if (f.has("tokenizer.chat_template")) v.chat_template = f.text("tokenizer.chat_template");
  return Tokenizer(v, f.name());
}

Tokenizer Tokenizer::from_gguf(const std::string& path) { return from_gguf(GgufFile::open(path)); }

}  // namespace attn
