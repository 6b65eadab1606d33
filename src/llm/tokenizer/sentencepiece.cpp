#include "tokenizer/sentencepiece.hpp"

#include <queue>

#include "tokenizer/unicode_class.hpp"

namespace attn::tokenizer {

int SentencePiece::byte_of(std::string_view t) {
  if (t.size() != 6 || t.substr(0, 3) != "<0x" || t[5] != '>') return -1;
  const auto hex = [](char c) { return c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1; };
  const int hi = hex(t[3]), lo = hex(t[4]);
  return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
}

SentencePiece::SentencePiece(const std::vector<std::string>& tokens, std::vector<double> priority, int32_t unk)
    : priority_(std::move(priority)), unk_(unk) {
  size_t bytes = 0;
  for (const std::string& t : tokens) bytes += t.size();
  text_.reserve(bytes);  // never grows after this, so the views below stay valid
  for (const std::string& t : tokens) text_ += t;
  id_of_.reserve(tokens.size());
  size_t at = 0;
  for (size_t i = 0; i < tokens.size(); ++i) {
    id_of_.emplace(std::string_view(text_).substr(at, tokens[i].size()), static_cast<int32_t>(i));
    at += tokens[i].size();
  }
  static const char* const kHex = "0123456789ABCDEF";
  for (int b = 0; b < 256; ++b) {
    const char name[] = {'<', '0', 'x', kHex[b >> 4], kHex[b & 15], '>'};
    byte_token_[b] = find(std::string_view(name, sizeof name));
  }
}

void SentencePiece::encode(std::string_view text, bool prefix, std::vector<int32_t>& out) const {
  if (text.empty()) return;
  std::string s;  // the text with '▁' for every space
  s.reserve(text.size() + 8);
  if (prefix) s += kSpaceMark;
  for (const char c : text) c == ' ' ? s += kSpaceMark : s += c;

  // One symbol per character, linked; a merge keeps the left symbol and empties the right one.
  constexpr int32_t kFallback = -1;  // a character without a token: its bytes' tokens, never merged
  struct Symbol {
    size_t start;
    uint32_t bytes, chars;
    int32_t id;
    int64_t prev, next;
  };
  std::vector<Symbol> sym;
  sym.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    const uint32_t len = utf8_at(s, i).length;
    const int32_t id = find(std::string_view(s).substr(i, len));
    const int64_t k = static_cast<int64_t>(sym.size());
    sym.push_back({i, len, 1, id >= 0 ? id : kFallback, k - 1, k + 1});
    i += len;
  }
  sym.back().next = -1;

  struct Candidate {
    double priority;
    uint32_t left_chars, right_chars, left_bytes, right_bytes;
    int32_t id;
    int64_t pos;
    // a < b: b merges first
    bool operator<(const Candidate& o) const {
      if (priority != o.priority) return priority < o.priority;
      if (left_chars != o.left_chars) return left_chars < o.left_chars;
      if (right_chars != o.right_chars) return right_chars < o.right_chars;
      if (id != o.id) return id > o.id;
      return pos > o.pos;
    }
  };
  std::priority_queue<Candidate> queue;
  const auto consider = [&](int64_t left) {
    if (left < 0) return;
    const int64_t right = sym[left].next;
    if (right < 0 || sym[left].id == kFallback || sym[right].id == kFallback) return;
    const Symbol &l = sym[left], &r = sym[right];
    const int32_t id = find(std::string_view(s).substr(l.start, l.bytes + r.bytes));
    if (id >= 0) queue.push({priority_[id], l.chars, r.chars, l.bytes, r.bytes, id, left});
  };
  for (int64_t i = 0; i + 1 < static_cast<int64_t>(sym.size()); ++i) consider(i);
  while (!queue.empty()) {
    const Candidate c = queue.top();
    queue.pop();
    // Stale when a merge since has grown either side (a symbol only grows, and text fixes the id).
    Symbol& l = sym[c.pos];
    if (l.bytes != c.left_bytes || l.next < 0 || sym[l.next].bytes != c.right_bytes) continue;
    Symbol& r = sym[l.next];
    l.bytes += r.bytes, l.chars += r.chars, l.id = c.id;
    r.bytes = 0;
    l.next = r.next;
    if (r.next >= 0) sym[r.next].prev = c.pos;
    consider(l.prev);
    consider(c.pos);
  }

  bool last_unknown = false;
  for (int64_t i = 0; i >= 0; i = sym[i].next) {
    const Symbol& x = sym[i];
    if (x.id != kFallback) {
      out.push_back(x.id), last_unknown = false;
      continue;
    }
    bool all = true;
    for (uint32_t k = 0; k < x.bytes; ++k) all = all && byte_token_[static_cast<uint8_t>(s[x.start + k])] >= 0;
    if (all) {
      for (uint32_t k = 0; k < x.bytes; ++k) out.push_back(byte_token_[static_cast<uint8_t>(s[x.start + k])]);
      last_unknown = false;
    } else if (unk_ >= 0 && !last_unknown) {  // a run of unknown characters is one unknown token
      out.push_back(unk_), last_unknown = true;
    }
  }
}

}  // namespace attn::tokenizer
