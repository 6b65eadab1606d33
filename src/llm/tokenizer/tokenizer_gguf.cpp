// Tokenizer::from_gguf: the tokenizer.ggml.* metadata of a GGUF file, checked for kind and size.
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
  if (model != "gpt2")
    fail(f.name(), "tokenizer.ggml.model is '" + model + "'; attn reads byte-level BPE tokenizers ('gpt2') only");
  TokenizerVocab v;
  v.tokens = array_of(f, "tokenizer.ggml.tokens", GgufType::string).strings;
  v.merges = array_of(f, "tokenizer.ggml.merges", GgufType::string).strings;
  if (f.has("tokenizer.ggml.token_type")) {
    const GgufValue& types = f.value("tokenizer.ggml.token_type");
    const GgufType e = types.element_type;
    if (types.type != GgufType::array || e == GgufType::string || e == GgufType::float32 || e == GgufType::float64)
      array_of(f, "tokenizer.ggml.token_type", GgufType::int32);  // its error
    for (const double t : types.numbers)  // integers; one outside int32 is no type attn knows (0: as normal)
      v.types.push_back(t >= INT32_MIN && t <= INT32_MAX ? static_cast<int32_t>(t) : 0);
  }
  v.pre = f.has("tokenizer.ggml.pre") ? f.text("tokenizer.ggml.pre") : "gpt2";
  v.bos_id = token_id(f, "tokenizer.ggml.bos_token_id");
  v.eos_id = token_id(f, "tokenizer.ggml.eos_token_id");
  if (f.has("tokenizer.chat_template")) v.chat_template = f.text("tokenizer.chat_template");
  return Tokenizer(v, f.name());
}

Tokenizer Tokenizer::from_gguf(const std::string& path) { return from_gguf(GgufFile::open(path)); }

}  // namespace attn
