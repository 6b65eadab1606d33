// The template is cut into tags ({% ... %} statements and {{ ... }} expressions), each tag into
// lexemes (names, string literals with their escapes resolved, punctuation), and the tags are
// matched against the ChatML shape one by one.
#include "tokenizer/chat_template.hpp"

#include <cctype>

#include "attn/error.hpp"
#include "attn/tokenizer.hpp"

namespace attn::tokenizer {
namespace {

struct Lexeme {
  bool literal = false;  // a string literal (text is its value)
  std::string text;
  bool operator==(const Lexeme&) const = default;
};
Lexeme name(const char* s) { return {false, s}; }
Lexeme literal(const char* s) { return {true, s}; }

struct Tag {
  bool statement = false;  // {% %}; else {{ }}
  std::vector<Lexeme> lexemes;
  size_t at = 0;           // where it starts in the template
  std::string source;      // as written, for errors
};

// A term of a {{ }} sum: a literal, or the message's role or content.
struct Term {
  enum Kind { text, role, content } kind;
  std::string value;  // text
  bool operator==(const Term&) const = default;
};

class Reader {
 public:
  Reader(const std::string& source, const std::string& where) : src_(source), where_(where) {}

  std::vector<Tag> tags() {
    std::vector<Tag> out;
    for (size_t i = 0; i < src_.size();) {
      if (src_.compare(i, 2, "{%") != 0 && src_.compare(i, 2, "{{") != 0)
        bad(i, "has text outside {% %} and {{ }} tags; the ChatML template has none");
      Tag t;
      t.statement = src_[i + 1] == '%';
      t.at = i;
      const std::string close = t.statement ? "%}" : "}}";
      size_t end = i + 2;
      for (;;) {
        while (end < src_.size() && std::isspace(static_cast<unsigned char>(src_[end]))) ++end;
        if (end >= src_.size()) bad(i, "has a tag that is never closed");
        if (src_.compare(end, 2, close) == 0) break;
        t.lexemes.push_back(lexeme(end));
      }
      // Jinja's whitespace control ({%- -%}) only trims text, and there is none: drop the dashes.
      auto& l = t.lexemes;
      if (!l.empty() && l.front() == name("-")) l.erase(l.begin());
      if (!l.empty() && l.back() == name("-")) l.pop_back();
      t.source = src_.substr(i, end + 2 - i);
      out.push_back(std::move(t));
      i = end + 2;
    }
    return out;
  }

  [[noreturn]] void bad(size_t at, const std::string& what) const {
    fail(where_, what + " (at character " + std::to_string(at) + ": '" + src_.substr(at, 40) + "')");
  }

 private:
  Lexeme lexeme(size_t& i) {
    const auto word = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; };
    if (src_[i] == '\'' || src_[i] == '"') return string_literal(i);
    if (word(src_[i])) {
      const size_t start = i;
      while (i < src_.size() && word(src_[i])) ++i;
      return {false, src_.substr(start, i - start)};
    }
    for (const char* op : {"!=", "=="})
      if (src_.compare(i, 2, op) == 0) return i += 2, Lexeme{false, op};
    return {false, std::string(1, src_[i++])};
  }

  // A Jinja (Python-style) string literal; the escapes a template would use are resolved.
  Lexeme string_literal(size_t& i) {
    const size_t start = i;
    const char quote = src_[i++];
    std::string value;
    for (;;) {
      if (i >= src_.size()) bad(start, "has a string literal that is never closed");
      const char c = src_[i++];
      if (c == quote) return {true, value};
      if (c != '\\') {
        value += c;
        continue;
      }
      if (i >= src_.size()) bad(start, "has a string literal that is never closed");
      switch (const char e = src_[i++]) {
        case 'n': value += '\n'; break;
        case 't': value += '\t'; break;
        case 'r': value += '\r'; break;
        case '\\': case '\'': case '"': value += e; break;
        default: bad(i - 2, std::string("has the escape \\") + e + " in a string literal, which attn does not read");
      }
    }
  }

  const std::string& src_;
  const std::string& where_;
};

// message['role'], message["role"] or message.role at l[i] -> Term::role (content likewise),
// advancing i; false when the lexemes there are not one of those.
bool message_field(const std::vector<Lexeme>& l, size_t& i, Term& term) {
  if (i >= l.size() || l[i] != name("message")) return false;
  size_t next = i;
  std::string field;
  if (i + 2 < l.size() && l[i + 1] == name(".") && !l[i + 2].literal) field = l[i + 2].text, next = i + 3;
  else if (i + 3 < l.size() && l[i + 1] == name("[") && l[i + 2].literal && l[i + 3] == name("]"))
    field = l[i + 2].text, next = i + 4;
  if (field != "role" && field != "content") return false;
  term = {field == "role" ? Term::role : Term::content, ""};
  i = next;
  return true;
}

// The terms of a {{ a + b + ... }} tag, adjacent literals joined into one.
std::vector<Term> sum_of(const Tag& t, const Reader& r) {
  std::vector<Term> out;
  const auto& l = t.lexemes;
  for (size_t i = 0; i < l.size();) {
    Term term{Term::text, ""};
    if (l[i].literal) term.value = l[i++].text;
    else if (!message_field(l, i, term))
      r.bad(t.at, "has the expression " + t.source + "; the ChatML template joins literals, message['role'] and "
                  "message['content'] with +");
    if (!out.empty() && out.back().kind == Term::text && term.kind == Term::text) out.back().value += term.value;
    else out.push_back(term);
    if (i < l.size() && l[i++] != name("+")) r.bad(t.at, "has the expression " + t.source + ", which is not a sum");
  }
  return out;
}

std::string literal_of(const Tag& t, const Reader& r) {
  const std::vector<Term> terms = sum_of(t, r);
  if (terms.size() != 1 || terms[0].kind != Term::text)
    r.bad(t.at, "has " + t.source + " where the ChatML template writes a literal");
  return terms[0].value;
}

}  // namespace

ChatTemplate ChatTemplate::parse(const std::string& source, const std::string& where) {
  Reader r(source, where);
  const std::vector<Tag> tags = r.tags();
  size_t k = 0;
  const auto here = [&] { return k < tags.size() ? tags[k].at : source.size(); };
  const auto is_statement = [&](const std::vector<Lexeme>& want) {
    return k < tags.size() && tags[k].statement && tags[k].lexemes == want;
  };
  const auto statement = [&](const std::vector<Lexeme>& want, const char* as_written) {
    if (!is_statement(want)) r.bad(here(), std::string("is not the ChatML template attn replicates: expected {% ") + as_written + " %}");
    ++k;
  };
  const auto expression = [&]() -> const Tag& {
    if (k >= tags.size() || tags[k].statement) r.bad(here(), "is not the ChatML template attn replicates: expected {{ ... }}");
    return tags[k++];
  };

  ChatTemplate t;
  statement({name("for"), name("message"), name("in"), name("messages")}, "for message in messages");
  if (is_statement({name("if"), name("loop"), name("."), name("first"), name("and"), name("messages"), name("["),
                    name("0"), name("]"), name("["), literal("role"), name("]"), name("!="), literal("system")})) {
    ++k;
    const Tag& e = expression();
    t.default_system_ = literal_of(e, r);
    const std::string head = "<|im_start|>system\n", tail = "<|im_end|>\n";
    const std::string& s = t.default_system_;
    if (s.size() < head.size() + tail.size() || s.compare(0, head.size(), head) != 0 ||
        s.compare(s.size() - tail.size(), tail.size(), tail) != 0)
      r.bad(e.at, "has a default system turn that is not '<|im_start|>system\\n...<|im_end|>\\n' (ChatML)");
    statement({name("endif")}, "endif");
  }
  const Tag& turn = expression();
  const std::vector<Term> chatml = {{Term::text, "<|im_start|>"}, {Term::role, ""}, {Term::text, "\n"},
                                    {Term::content, ""}, {Term::text, "<|im_end|>\n"}};
  if (sum_of(turn, r) != chatml)
    r.bad(turn.at, "writes a message as " + turn.source + ", not as '<|im_start|>' + role + '\\n' + content + "
                   "'<|im_end|>\\n' (ChatML)");
  statement({name("endfor")}, "endfor");
  if (k < tags.size()) {
    statement({name("if"), name("add_generation_prompt")}, "if add_generation_prompt");
    const Tag& e = expression();
    t.generation_prompt_ = literal_of(e, r);
    if (t.generation_prompt_ != "<|im_start|>assistant\n")
      r.bad(e.at, "has the generation prompt " + e.source + ", not '<|im_start|>assistant\\n' (ChatML)");
    statement({name("endif")}, "endif");
  }
  if (k < tags.size()) r.bad(here(), "has more after the ChatML template ends");
  return t;
}

std::string ChatTemplate::render(const std::vector<ChatMessage>& messages, bool add_generation_prompt) const {
  std::string out;
  for (size_t i = 0; i < messages.size(); ++i) {
    if (i == 0 && messages[0].role != "system") out += default_system_;  // loop.first and not a system turn
    out += "<|im_start|>" + messages[i].role + "\n" + messages[i].content + "<|im_end|>\n";
  }
  if (add_generation_prompt) out += generation_prompt_;
  return out;
}

}  // namespace attn::tokenizer
