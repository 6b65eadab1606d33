// The text form of mechanisms, parsed in one place for the CLI, benchmarks and Python.
//   <kind>[:<option>(,<option>)*]   options are flags ("causal") or key=value
#include <charconv>
#include <cmath>
#include <sstream>
#include <string>

#include "attn/error.hpp"
#include "attn/mechanism.hpp"

namespace attn {
namespace {

const char* kWhere = "mechanism";

std::string quoted(std::string_view s) { return "'" + std::string(s) + "'"; }

int64_t parse_int(std::string_view token, std::string_view value) {
  int64_t x = 0;
  auto [ptr, ec] = std::from_chars(value.data(), value.data() + value.size(), x);
  if (ec != std::errc() || ptr != value.data() + value.size() || value.empty())
    fail(kWhere, "in " + quoted(token) + ": expected an integer, got " + quoted(value));
  return x;
}

uint64_t parse_uint(std::string_view token, std::string_view value) {
  uint64_t x = 0;
  auto [ptr, ec] = std::from_chars(value.data(), value.data() + value.size(), x);
  if (ec != std::errc() || ptr != value.data() + value.size() || value.empty())
    fail(kWhere, "in " + quoted(token) + ": expected a non-negative integer, got " + quoted(value));
  return x;
}

double parse_double(std::string_view token, std::string_view value) {
  // strtod needs a terminated string; from_chars for double is not in every libstdc++.
  const std::string s(value);
  char* end = nullptr;
  const double x = s.empty() ? 0.0 : std::strtod(s.c_str(), &end);
  if (s.empty() || end != s.c_str() + s.size())
    fail(kWhere, "in " + quoted(token) + ": expected a number, got " + quoted(value));
  if (!std::isfinite(x)) fail(kWhere, "in " + quoted(token) + ": value must be finite, got " + quoted(value));
  return x;
}

Softmax parse_softmax(std::string_view opts) {
  Softmax m;
  size_t pos = 0;
  while (pos <= opts.size() && !opts.empty()) {
    size_t comma = opts.find(',', pos);
    if (comma == std::string_view::npos) comma = opts.size();
    const std::string_view token = opts.substr(pos, comma - pos);
    pos = comma + 1;
    if (token.empty()) fail(kWhere, "empty option in " + quoted(opts));
    const size_t eq = token.find('=');
    const std::string_view key = token.substr(0, eq);
    const std::string_view value = eq == std::string_view::npos ? std::string_view{} : token.substr(eq + 1);
    const bool has_value = eq != std::string_view::npos;
    auto need_value = [&] {
      if (!has_value) fail(kWhere, "option " + quoted(token) + " needs a value (" + std::string(key) + "=...)");
    };
    if (key == "causal") {
      if (has_value) fail(kWhere, "option " + quoted(token) + " is a flag and takes no value");
      m.causal = true;
    } else if (key == "scale") {
      need_value();
      m.scale = parse_double(token, value);
    } else if (key == "softcap") {
      need_value();
      m.softcap = parse_double(token, value);
    } else if (key == "dropout") {
      need_value();
      m.dropout = parse_double(token, value);
    } else if (key == "seed") {
      need_value();
      m.seed = parse_uint(token, value);
    } else if (key == "entropy_scale") {
      need_value();
      m.entropy_train_len = parse_int(token, value);
    } else if (key == "window") {
      need_value();
      const size_t colon = value.find(':');
      if (colon == std::string_view::npos)
        fail(kWhere, "in " + quoted(token) + ": expected window=LEFT:RIGHT (-1 = unbounded)");
      m.window_left = parse_int(token, value.substr(0, colon));
      m.window_right = parse_int(token, value.substr(colon + 1));
    } else if (key == "score") {
      need_value();
      if (value == "dot") m.score = ScoreKind::dot;
      else if (value == "cosine") m.score = ScoreKind::cosine;
      else if (value == "additive") m.score = ScoreKind::additive;
      else fail(kWhere, "in " + quoted(token) + ": score must be dot, cosine or additive");
    } else {
      fail(kWhere, "unknown softmax option " + quoted(token) +
                       " (known: causal, scale=, softcap=, window=L:R, score=, entropy_scale=, dropout=, seed=)");
    }
    if (comma == opts.size()) break;
  }
  return m;
}

std::string number(double x) {
  std::ostringstream s;
  s.precision(17);
  s << x;
  return s.str();
}

}  // namespace

std::string to_string(ScoreKind s) {
  switch (s) {
    case ScoreKind::dot: return "dot";
    case ScoreKind::cosine: return "cosine";
    case ScoreKind::additive: return "additive";
  }
  return "?";
}

Mechanism parse_mechanism(std::string_view text) {
  const size_t colon = text.find(':');
  const std::string_view kind = text.substr(0, colon);
  const std::string_view opts = colon == std::string_view::npos ? std::string_view{} : text.substr(colon + 1);
  if (kind == "softmax") {
    if (colon != std::string_view::npos && opts.empty())
      fail(kWhere, "nothing after ':' in " + quoted(text));
    return parse_softmax(opts);
  }
  fail(kWhere, "unknown mechanism " + quoted(kind) + " in " + quoted(text) + " (known: softmax)");
}

std::string to_string(const Mechanism& mech) {
  const Softmax& m = std::get<Softmax>(mech);
  std::string o;
  auto add = [&](const std::string& s) { o += (o.empty() ? "" : ",") + s; };
  if (m.causal) add("causal");
  if (m.score != ScoreKind::dot) add("score=" + to_string(m.score));
  if (m.scale) add("scale=" + number(*m.scale));
  if (m.entropy_train_len) add("entropy_scale=" + std::to_string(m.entropy_train_len));
  if (m.window_left != -1 || m.window_right != -1)
    add("window=" + std::to_string(m.window_left) + ":" + std::to_string(m.window_right));
  if (m.softcap != 0) add("softcap=" + number(m.softcap));
  if (m.dropout != 0) add("dropout=" + number(m.dropout));
  if (m.seed != 0) add("seed=" + std::to_string(m.seed));
  return o.empty() ? "softmax" : "softmax:" + o;
}

}  // namespace attn
