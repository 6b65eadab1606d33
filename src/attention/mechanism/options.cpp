#include "mechanism/options.hpp"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <unordered_map>

#include "attn/error.hpp"

namespace attn::mechanism {
namespace {

const char* kWhere = "mechanism";

bool is_digit(char c) { return c >= '0' && c <= '9'; }

// [+-]? digits [. digits?] ([eE] [+-]? digits)?  or  [+-]? . digits (...)
bool plain_decimal(std::string_view s) {
  size_t i = 0;
  if (i < s.size() && (s[i] == '+' || s[i] == '-')) ++i;
  size_t digits = 0;
  while (i < s.size() && is_digit(s[i])) ++i, ++digits;
  if (i < s.size() && s[i] == '.') {
    ++i;
    while (i < s.size() && is_digit(s[i])) ++i, ++digits;
  }
  if (digits == 0) return false;
  if (i < s.size() && (s[i] == 'e' || s[i] == 'E')) {
    ++i;
    if (i < s.size() && (s[i] == '+' || s[i] == '-')) ++i;
    size_t exp_digits = 0;
    while (i < s.size() && is_digit(s[i])) ++i, ++exp_digits;
    if (exp_digits == 0) return false;
  }
  return i == s.size();
}

bool plain_integer(std::string_view s, bool allow_sign) {
  size_t i = 0;
  if (allow_sign && i < s.size() && (s[i] == '+' || s[i] == '-')) ++i;
  if (i == s.size()) return false;
  for (; i < s.size(); ++i)
    if (!is_digit(s[i])) return false;
  return true;
}

template <class T>
T to_integer(std::string_view token, std::string_view value, bool allow_sign) {
  if (!plain_integer(value, allow_sign))
    fail(kWhere, "in " + quoted(token) + ": expected " + (allow_sign ? "an integer" : "a non-negative integer") +
                     ", got " + quoted(value));
  std::string_view digits = value;
  if (!digits.empty() && digits.front() == '+') digits.remove_prefix(1);
  T x{};
  auto [ptr, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), x);
  if (ec != std::errc() || ptr != digits.data() + digits.size())
    fail(kWhere, "in " + quoted(token) + ": integer out of range, got " + quoted(value));
  return x;
}

}  // namespace

std::string quoted(std::string_view s) {
  std::string out = "'";
  for (const char ch : s.substr(0, kQuotedChars)) {
    const auto c = static_cast<unsigned char>(ch);
    if (c >= 0x20 && c != 0x7f) {
      out += ch;
      continue;
    }
    char escaped[8];
    std::snprintf(escaped, sizeof escaped, "\\x%02x", c);
    out += escaped;
  }
  out += "'";
  if (s.size() > kQuotedChars) out.append("... (").append(std::to_string(s.size())).append(" characters)");
  return out;
}

OptionReader::OptionReader(std::string_view kind, std::string_view options) : kind_(kind) {
  if (options.empty()) return;
  std::unordered_map<std::string_view, size_t> seen_at;  // key -> its option: linear in the options
  size_t pos = 0;
  while (true) {
    size_t comma = options.find(',', pos);
    if (comma == std::string_view::npos) comma = options.size();
    const std::string_view token = options.substr(pos, comma - pos);
    if (token.empty()) fail(kWhere, "empty option in " + quoted(options));
    Option o;
    o.token = token;
    const size_t eq = token.find('=');
    o.key = token.substr(0, eq);
    o.has_value = eq != std::string_view::npos;
    if (o.has_value) o.value = token.substr(eq + 1);
    if (o.key.empty()) fail(kWhere, "option " + quoted(token) + " has no name");
    if (const auto [it, fresh] = seen_at.emplace(o.key, options_.size()); !fresh)
      fail(kWhere, kind_ + " option " + quoted(o.key) + " is given twice (" + quoted(options_[it->second].token) +
                       " and " + quoted(token) + ")");
    options_.push_back(o);
    if (comma == options.size()) break;
    pos = comma + 1;
  }
}

OptionReader::Option* OptionReader::take(std::string_view name, bool wants_value, std::string_view shape) {
  known_.push_back(std::string(name) + std::string(shape));
  for (Option& o : options_) {
    if (o.key != name) continue;
    if (wants_value && !o.has_value)
      fail(kWhere, "option " + quoted(o.token) + " needs a value (" + std::string(name) + std::string(shape) + ")");
    if (!wants_value && o.has_value) fail(kWhere, "option " + quoted(o.token) + " is a flag and takes no value");
    if (wants_value && o.value.empty()) fail(kWhere, "option " + quoted(o.token) + " has an empty value");
    o.used = true;
    return &o;
  }
  return nullptr;
}

bool OptionReader::flag(std::string_view name) { return take(name, false, "") != nullptr; }

std::optional<double> OptionReader::number(std::string_view name) {
  const Option* o = take(name, true, "=X");
  if (!o) return std::nullopt;
  if (!plain_decimal(o->value))
    fail(kWhere, "in " + quoted(o->token) + ": expected a number (plain decimal), got " + quoted(o->value));
  const std::string s(o->value);
  const double x = std::strtod(s.c_str(), nullptr);
  if (!std::isfinite(x)) fail(kWhere, "in " + quoted(o->token) + ": value must be finite, got " + quoted(o->value));
  return x;
}

std::optional<int64_t> OptionReader::integer(std::string_view name) {
  const Option* o = take(name, true, "=N");
  if (!o) return std::nullopt;
  return to_integer<int64_t>(o->token, o->value, true);
}

std::optional<uint64_t> OptionReader::unsigned_integer(std::string_view name) {
  const Option* o = take(name, true, "=N");
  if (!o) return std::nullopt;
  return to_integer<uint64_t>(o->token, o->value, false);
}

std::optional<std::pair<int64_t, int64_t>> OptionReader::integer_pair(std::string_view name, std::string_view shape) {
  const Option* o = take(name, true, std::string("=").append(shape));
  if (!o) return std::nullopt;
  const size_t colon = o->value.find(':');
  if (colon == std::string_view::npos)
    fail(kWhere, "in " + quoted(o->token) + ": expected " + std::string(name) + "=" + std::string(shape));
  return std::pair{to_integer<int64_t>(o->token, o->value.substr(0, colon), true),
                   to_integer<int64_t>(o->token, o->value.substr(colon + 1), true)};
}

std::optional<std::vector<int64_t>> OptionReader::integer_list(std::string_view name, std::string_view shape) {
  const Option* o = take(name, true, std::string("=").append(shape));
  if (!o) return std::nullopt;
  std::vector<int64_t> xs;
  for (size_t pos = 0;;) {
    size_t semi = o->value.find(';', pos);
    if (semi == std::string_view::npos) semi = o->value.size();
    xs.push_back(to_integer<int64_t>(o->token, o->value.substr(pos, semi - pos), true));
    if (semi == o->value.size()) break;
    pos = semi + 1;
  }
  return xs;
}

std::optional<std::string_view> OptionReader::word(std::string_view name, const std::vector<std::string_view>& allowed) {
  std::string bars, words;
  for (size_t i = 0; i < allowed.size(); ++i) {
    bars.append(i ? "|" : "").append(allowed[i]);
    words.append(i == 0 ? "" : i + 1 == allowed.size() ? " or " : ", ").append(allowed[i]);
  }
  const Option* o = take(name, true, std::string("=").append(bars));
  if (!o) return std::nullopt;
  for (auto a : allowed)
    if (o->value == a) return a;
  fail(kWhere, "in " + quoted(o->token) + ": " + std::string(name) + " must be " + words + ", got " + quoted(o->value));
}

void OptionReader::finish() const {
  for (const Option& o : options_) {
    if (o.used) continue;
    std::string list;
    for (const auto& k : known_) list += (list.empty() ? "" : ", ") + k;
    fail(kWhere, "unknown " + kind_ + " option " + quoted(o.token) + " (known: " + list + ")");
  }
}

void OptionWriter::add(std::string_view option) {
  text_ += any_ ? "," : ":";
  text_ += option;
  any_ = true;
}

void OptionWriter::flag(std::string_view name) { add(name); }

void OptionWriter::number(std::string_view name, double x) {
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, x);  // shortest round-trip form
  add(std::string(name) + "=" + std::string(buf, end));
}

void OptionWriter::integer(std::string_view name, int64_t x) { add(std::string(name) + "=" + std::to_string(x)); }

void OptionWriter::unsigned_integer(std::string_view name, uint64_t x) {
  add(std::string(name) + "=" + std::to_string(x));
}

void OptionWriter::integer_pair(std::string_view name, int64_t a, int64_t b) {
  add(std::string(name) + "=" + std::to_string(a) + ":" + std::to_string(b));
}

void OptionWriter::integer_list(std::string_view name, const std::vector<int64_t>& xs) {
  std::string v;
  for (size_t i = 0; i < xs.size(); ++i) {
    if (i) v += ';';
    v += std::to_string(xs[i]);
  }
  add(std::string(name) + "=" + v);
}

void OptionWriter::word(std::string_view name, std::string_view w) { add(std::string(name) + "=" + std::string(w)); }

}  // namespace attn::mechanism
