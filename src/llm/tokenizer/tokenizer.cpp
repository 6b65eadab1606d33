// The tokenizer's tables (built and checked once) and encode/decode over them: special tokens,
// decoding and ids are shared; the text between special tokens goes to byte-level BPE (gpt2) or
// SentencePiece BPE (llama, tokenizer/sentencepiece.cpp).
#include "attn/tokenizer.hpp"

#include <algorithm>
#include <mutex>
#include <optional>
#include <unordered_map>

#include "attn/error.hpp"
#include "tokenizer/bpe.hpp"
#include "tokenizer/byte_level.hpp"
#include "tokenizer/chat_template.hpp"
#include "tokenizer/gemma_turns.hpp"
#include "tokenizer/pretokenize.hpp"
#include "tokenizer/sentencepiece.hpp"
#include "tokenizer/unicode_class.hpp"

namespace attn {
namespace {

constexpr int32_t kControl = 3, kUserDefined = 4;  // GGUF token types matched verbatim
constexpr int32_t kByte = 6;

// Words BPE has already merged (most words of a text repeat): bounded, shared by threads.
class WordCache {
 public:
  static constexpr size_t kMaxWordBytes = 64, kMaxWords = 1 << 18;
  bool find(std::string_view word, std::vector<int32_t>& out) {
    std::lock_guard lock(mutex_);
    const auto it = words_.find(std::string(word));
    if (it == words_.end()) return false;
    out.insert(out.end(), it->second.begin(), it->second.end());
    return true;
  }
  void add(std::string_view word, const int32_t* ids, size_t n) {
    std::lock_guard lock(mutex_);
    if (words_.size() < kMaxWords) words_.emplace(std::string(word), std::vector<int32_t>(ids, ids + n));
  }

 private:
  std::mutex mutex_;
  std::unordered_map<std::string, std::vector<int32_t>> words_;
};

std::string quoted(const std::string& s) { return "'" + s + "'"; }

}  // namespace

struct Tokenizer::State {
  std::string name;
  std::vector<std::string> tokens;
  std::vector<bool> special;
  std::vector<std::pair<std::string, int32_t>> specials[256];  // by first byte, longest first
  std::string decoded;                 // every token's bytes, one after another
  std::vector<size_t> decoded_at;      // token i: decoded[decoded_at[i], decoded_at[i + 1])
  int32_t byte_token[256] = {};      // -1: the vocabulary has no token for the byte
  tokenizer::BpeMerges merges;
  tokenizer::PreTokenizer pre = tokenizer::PreTokenizer::smollm;
  std::optional<tokenizer::SentencePiece> spm;  // model "llama"
  bool add_space_prefix = false;               // llama
  int32_t bos = -1, eos = -1;
  bool add_bos = false;
  std::optional<tokenizer::ChatTemplate> chat;
  bool gemma_turns = false;            // no template, Gemma's turn markers: tokenizer/gemma_turns.hpp
  std::string chat_error;              // why chat_prompt cannot run, when chat is empty and not gemma_turns
  mutable WordCache cache;

  void encode_piece(std::string_view piece, std::vector<int32_t>& out, std::vector<int32_t>& scratch) const;
  // `start`: the text starts the input (SentencePiece's space prefix).
  void encode_text(std::string_view text, bool start, std::vector<int32_t>& out) const;
};

Tokenizer::Tokenizer(const TokenizerVocab& v, const std::string& name) : s_(std::make_unique<State>()) {
  State& s = *s_;
  s.name = name;
  const size_t n = v.tokens.size();
  if (n == 0) fail(name, "tokens: the vocabulary is empty");
  if (n > static_cast<size_t>(INT32_MAX)) fail(name, "tokens: " + std::to_string(n) + " tokens, more than int32 ids hold");
  if (!v.types.empty() && v.types.size() != n)
    fail(name, "token_type has " + std::to_string(v.types.size()) + " entries, expected one per token (" + std::to_string(n) + ")");
  const bool spm = v.model == "llama";
  if (!spm && v.model != "gpt2") fail(name, "model " + quoted(v.model) + " is not one attn knows (gpt2, llama)");
  if (!spm) {
    if (v.pre == "smollm") s.pre = tokenizer::PreTokenizer::smollm;
    else if (v.pre == "gpt2") s.pre = tokenizer::PreTokenizer::gpt2;
    else fail(name, "pre-tokenizer " + quoted(v.pre) + " is not one attn knows (smollm, gpt2)");
  }
  for (const auto& [what, id] : {std::pair{"bos_token_id", v.bos_id}, std::pair{"eos_token_id", v.eos_id},
                                 std::pair{"unknown_token_id", v.unk_id}, std::pair{"padding_token_id", v.pad_id}})
    if (id < -1 || id >= static_cast<int64_t>(n))
      fail(name, std::string(what) + " " + std::to_string(id) + " is not a token id in [0, " + std::to_string(n) + ")");
  s.bos = v.bos_id, s.eos = v.eos_id, s.add_bos = v.add_bos;
  s.tokens = v.tokens;

  std::unordered_map<std::string_view, int32_t> id_of;
  id_of.reserve(n);
  for (size_t i = 0; i < n; ++i)
    if (const auto [it, added] = id_of.emplace(s.tokens[i], static_cast<int32_t>(i)); !added)
      fail(name, "tokens[" + std::to_string(i) + "] " + quoted(s.tokens[i]) + " repeats tokens[" + std::to_string(it->second) + "]");

  if (spm) {
    if (!v.merges.empty())
      fail(name, "merges: a SentencePiece ('llama') tokenizer takes none (it merges by token score), got " +
                     std::to_string(v.merges.size()));
    if (!(v.merge_by_id && v.scores.empty()) && v.scores.size() != n)
      fail(name, "scores has " + std::to_string(v.scores.size()) + " entries, expected one per token (" + std::to_string(n) + ")");
    std::vector<double> priority(n);
    for (size_t i = 0; i < n; ++i) {
      if (!v.merge_by_id && v.scores[i] != v.scores[i]) fail(name, "scores[" + std::to_string(i) + "] is NaN");
      priority[i] = v.merge_by_id ? -static_cast<double>(i) : v.scores[i];
      if (!v.types.empty() && v.types[i] == kByte && tokenizer::SentencePiece::byte_of(s.tokens[i]) < 0)
        fail(name, "tokens[" + std::to_string(i) + "] " + quoted(s.tokens[i]) + " has token_type 6 (byte) but is not spelled <0xHH>");
    }
    s.spm.emplace(s.tokens, std::move(priority), v.unk_id);
    s.add_space_prefix = v.add_space_prefix;
  }

  // Special tokens, and what every token decodes to.
  s.special.resize(n);
  s.decoded_at.reserve(n + 1);
  for (size_t i = 0; i < n; ++i) {
    const int32_t type = v.types.empty() ? 1 : v.types[i];
    s.special[i] = type == kControl || type == kUserDefined;
    s.decoded_at.push_back(s.decoded.size());
    const std::string& t = s.tokens[i];
    if (s.special[i]) {
      s.decoded += t;
      if (!t.empty()) s.specials[static_cast<uint8_t>(t[0])].emplace_back(t, static_cast<int32_t>(i));
    } else if (spm) {  // '▁' is the space; a byte token stands for its byte
      const int b = tokenizer::SentencePiece::byte_of(t);
      if (b >= 0 && s.spm->byte_token(static_cast<uint8_t>(b)) == static_cast<int32_t>(i)) {
        s.decoded += static_cast<char>(b);
        continue;
      }
      for (size_t k = 0; k < t.size();) {
        const bool mark = t.compare(k, tokenizer::kSpaceMark.size(), tokenizer::kSpaceMark) == 0;
        mark ? s.decoded += ' ' : s.decoded += t[k];
        k += mark ? tokenizer::kSpaceMark.size() : 1;
      }
    } else {
      for (size_t k = 0; k < t.size();) {  // a character outside the alphabet stands for its own UTF-8
        const tokenizer::Utf8Char c = tokenizer::utf8_at(t, k);
        const int b = c.code == tokenizer::kNotUtf8 ? -1 : tokenizer::char_to_byte(c.code);
        if (b >= 0) s.decoded += static_cast<char>(b);
        else s.decoded.append(t, k, c.length);
        k += c.length;
      }
    }
  }
  s.decoded_at.push_back(s.decoded.size());
  for (auto& bucket : s.specials)
    std::stable_sort(bucket.begin(), bucket.end(), [](const auto& a, const auto& b) { return a.first.size() > b.first.size(); });
  if (!spm) {
    for (int b = 0; b < 256; ++b) {  // a byte without a token is dropped (SmolLM2 has none for 21 bytes)
      const auto it = id_of.find(tokenizer::utf8_of(tokenizer::byte_to_char(static_cast<uint8_t>(b))));
      s.byte_token[b] = it == id_of.end() ? -1 : it->second;
    }
  }

  for (size_t r = 0; r < v.merges.size(); ++r) {
    const std::string& m = v.merges[r];
    const std::string where = "merges[" + std::to_string(r) + "] " + quoted(m);
    const size_t space = m.find(' ');
    if (space == std::string::npos || space == 0 || space + 1 == m.size() || m.find(' ', space + 1) != std::string::npos)
      fail(name, where + " is not two tokens separated by one space");
    const std::string_view left = std::string_view(m).substr(0, space), right = std::string_view(m).substr(space + 1);
    const auto l = id_of.find(left), rt = id_of.find(right);
    if (l == id_of.end()) fail(name, where + " names the token " + quoted(std::string(left)) + ", which is not in the vocabulary");
    if (rt == id_of.end()) fail(name, where + " names the token " + quoted(std::string(right)) + ", which is not in the vocabulary");
    const std::string joined = std::string(left) + std::string(right);
    const auto j = id_of.find(joined);
    if (j == id_of.end()) fail(name, where + " makes " + quoted(joined) + ", which is not in the vocabulary");
    if (const int32_t before = s.merges.add(l->second, rt->second, j->second); before >= 0)
      fail(name, where + " repeats merges[" + std::to_string(before) + "]");
  }

  if (v.chat_template.empty() && id_of.count("<start_of_turn>") && id_of.count("<end_of_turn>")) {
    s.gemma_turns = true;  // Gemma's base models: no template, its turn markers in the vocabulary
  } else if (v.chat_template.empty()) {
    s.chat_error = name + ": has no chat template (tokenizer.chat_template) and no turn markers of a chat format "
                          "attn knows (Gemma's <start_of_turn>)";
  } else {
    try {
      s.chat = tokenizer::ChatTemplate::parse(v.chat_template, name + ": tokenizer.chat_template");
    } catch (const Error& e) {
      s.chat_error = e.what();  // tokenizing still works; chat_prompt reports this
    }
  }
}

Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

void Tokenizer::State::encode_piece(std::string_view piece, std::vector<int32_t>& out, std::vector<int32_t>& scratch) const {
  const bool cached = piece.size() <= WordCache::kMaxWordBytes;
  if (cached && cache.find(piece, out)) return;
  scratch.clear();
  for (const char c : piece)
    if (const int32_t id = byte_token[static_cast<uint8_t>(c)]; id >= 0) scratch.push_back(id);
  merges.apply(scratch);
  out.insert(out.end(), scratch.begin(), scratch.end());
  if (cached) cache.add(piece, scratch.data(), scratch.size());
}

void Tokenizer::State::encode_text(std::string_view text, bool start, std::vector<int32_t>& out) const {
  if (spm) return spm->encode(text, start && add_space_prefix, out);
  std::vector<std::string_view> pieces;
  tokenizer::pretokenize(text, pre, pieces);
  std::vector<int32_t> scratch;
  for (const std::string_view p : pieces) encode_piece(p, out, scratch);
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool special) const {
  std::vector<int32_t> out;
  out.reserve(text.size() / 3);
  size_t plain = 0;  // start of the text not yet encoded
  if (special) {
    for (size_t i = 0; i < text.size(); ++i) {
      for (const auto& [t, id] : s_->specials[static_cast<uint8_t>(text[i])]) {  // the longest matching here
        if (text.compare(i, t.size(), t) != 0) continue;
        s_->encode_text(text.substr(plain, i - plain), plain == 0, out);
        out.push_back(id);
        plain = i + t.size();
        i = plain - 1;
        break;
      }
    }
  }
  s_->encode_text(text.substr(plain), plain == 0, out);
  return out;
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string out;
  for (size_t i = 0; i < ids.size(); ++i) {
    const int32_t id = ids[i];
    if (id < 0 || id >= vocab_size())
      fail("Tokenizer::decode", "ids[" + std::to_string(i) + "] = " + std::to_string(id) + " is not a token id in [0, " +
                                    std::to_string(vocab_size()) + ")");
    out.append(s_->decoded, s_->decoded_at[id], s_->decoded_at[id + 1] - s_->decoded_at[id]);
  }
  // the space SentencePiece's prefix put before the text (Hugging Face's Strip(left=1) decoder)
  if (s_->add_space_prefix && !ids.empty() && !s_->special[ids[0]] && !out.empty() && out[0] == ' ') out.erase(0, 1);
  return out;
}

const std::string& Tokenizer::token_text(int32_t id) const {
  if (id < 0 || id >= vocab_size())
    fail("Tokenizer::token_text", "id " + std::to_string(id) + " is not a token id in [0, " + std::to_string(vocab_size()) + ")");
  return s_->tokens[id];
}

bool Tokenizer::is_special(int32_t id) const {
  token_text(id);  // checks the id
  return s_->special[id];
}

int32_t Tokenizer::bos_id() const { return s_->bos; }
int32_t Tokenizer::eos_id() const { return s_->eos; }
bool Tokenizer::add_bos() const { return s_->add_bos; }
int32_t Tokenizer::vocab_size() const { return static_cast<int32_t>(s_->tokens.size()); }

std::string Tokenizer::chat_prompt(const std::vector<ChatMessage>& messages, bool add_generation_prompt) const {
  if (s_->gemma_turns) return tokenizer::gemma_turns(messages, add_generation_prompt, s_->name + ": chat turns");
  if (!s_->chat) throw Error(s_->chat_error);
  return s_->chat->render(messages, add_generation_prompt);
}

bool Tokenizer::has_chat_template() const { return s_->chat.has_value(); }

const char* Tokenizer::unicode_version() { return tokenizer::unicode_version(); }

}  // namespace attn
