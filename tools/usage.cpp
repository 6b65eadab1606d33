#include "usage.hpp"

#include <fmt/core.h>

#include <charconv>
#include <cmath>
#include <limits>
#include <string_view>
#include <vector>

namespace attn::cli {
namespace {

constexpr const char* kName = "attn-number";  // marks our validators (check_numbers skips those options)

std::string in_quotes(const std::string& s) { return "'" + (s.size() > 60 ? s.substr(0, 57) + "..." : s) + "'"; }

// Decimal integer, an optional sign; false on anything else or beyond int64/uint64.
template <class T>
bool parse_integer(const std::string& s, T& v) {
  std::string_view t = s;
  if (!t.empty() && t.front() == '+') t.remove_prefix(1);
  if (t.empty() || t.front() == '+') return false;
  const auto r = std::from_chars(t.data(), t.data() + t.size(), v, 10);
  return r.ec == std::errc() && r.ptr == t.data() + t.size();
}

std::string range_text(const std::string& lo, const std::string& hi) { return "[" + lo + ", " + hi + "]"; }

CLI::Validator integer_validator(long double lo, long double hi, bool is_unsigned, std::string desc) {
  const std::string range = range_text(bound_text(lo), bound_text(hi));
  CLI::Validator v(
      [lo, hi, is_unsigned, range](std::string& s) -> std::string {
        long double x = 0;
        bool ok = false;
        if (is_unsigned && !(s.size() > 0 && s[0] == '-')) {
          uint64_t u = 0;
          ok = parse_integer(s, u), x = static_cast<long double>(u);
        } else if (!is_unsigned) {
          int64_t i = 0;
          ok = parse_integer(s, i), x = static_cast<long double>(i);
        }
        if (!ok || x < lo || x > hi) return "expected an integer in " + range + ", got " + in_quotes(s);
        return {};
      },
      std::move(desc), kName);
  return v;
}

}  // namespace

std::string bound_text(long double v) {
  const long double a = std::fabs(v);
  if (a <= 4294967296.0L) return fmt::format("{}", static_cast<long long>(v));
  const std::string sign = v < 0 ? "-" : "";
  for (int k = 33; k <= 1024; ++k) {
    const long double p = std::ldexp(1.0L, k);
    if (a == p) return sign + "2^" + std::to_string(k);
    if (a == p - 1) return sign + "2^" + std::to_string(k) + " - 1";
    if (a < p) break;
  }
  return fmt::format("{:.3g}", static_cast<double>(v));
}

CLI::Validator in_range(int64_t lo, int64_t hi) {
  return integer_validator(lo, hi, false, "INT in " + range_text(bound_text(lo), bound_text(hi)));
}
CLI::Validator in_range(int lo, int hi) { return in_range(int64_t{lo}, int64_t{hi}); }

CLI::Validator in_range(double lo, double hi) {
  const std::string range = range_text(fmt::format("{}", lo), fmt::format("{}", hi));
  return CLI::Validator(
      [lo, hi, range](std::string& s) -> std::string {
        double x = 0;
        const auto r = std::from_chars(s.data(), s.data() + s.size(), x, std::chars_format::general);
        if (s.empty() || r.ec != std::errc() || r.ptr != s.data() + s.size() || !std::isfinite(x) || x < lo || x > hi)
          return "expected a number in " + range + ", got " + in_quotes(s);
        return {};
      },
      "FLOAT in " + range, kName);
}

void check_numbers(CLI::App& app) {
  for (CLI::Option* o : app.get_options()) {
    try {
      o->get_validator(kName);
      continue;  // has its own range
    } catch (const CLI::OptionNotFound&) {
    }
    const std::string type = o->get_type_name();
    constexpr long double i64 = 9223372036854775807.0L, u64 = 18446744073709551615.0L;
    if (type.rfind("UINT", 0) == 0) {
      o->check(integer_validator(0, u64, true, ""));
    } else if (type.rfind("INT", 0) == 0) {
      o->check(integer_validator(-i64 - 1, i64, false, ""));
    } else if (type.rfind("FLOAT", 0) == 0) {
      o->check(CLI::Validator(
          [](std::string& s) -> std::string {
            double x = 0;
            const auto r = std::from_chars(s.data(), s.data() + s.size(), x, std::chars_format::general);
            if (s.empty() || r.ec != std::errc() || r.ptr != s.data() + s.size() || !std::isfinite(x))
              return "expected a finite number, got " + in_quotes(s);
            return {};
          },
          "", kName));
    }
  }
  for (CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; })) check_numbers(*sub);
}

namespace {

bool looks_like_number(const std::string& s) {
  double x = 0;
  const char* b = s.data() + (!s.empty() && s[0] == '-' ? 1 : 0);
  const auto r = std::from_chars(b, s.data() + s.size(), x);
  return r.ec == std::errc() && r.ptr == s.data() + s.size();
}

// CLI11's message in the project's words where it has none of its own.
std::string explain(const CLI::ParseError& e) {
  std::string m = e.what();
  const std::string name = e.get_name();
  if (name == "RequiredError" && m == "A subcommand is required") return "a command is required (attn --help lists them)";
  if (name == "ConversionError" && m.rfind("Could not convert: ", 0) == 0) {
    const std::string rest = m.substr(19);
    const size_t eq = rest.find(" = ");
    if (eq != std::string::npos) return rest.substr(0, eq) + ": cannot read " + in_quotes(rest.substr(eq + 3)) + " as its type";
  }
  if (name == "ValidationError") {  // CLI::IsMember: "NAME: VALUE not in {A,B}"
    const size_t at = m.find(": "), in = m.rfind(" not in {");
    if (at != std::string::npos && in != std::string::npos && in > at && m.back() == '}')
      return m.substr(0, at) + ": expected one of " + m.substr(in + 8) + ", got " + in_quotes(m.substr(at + 2, in - at - 2));
  }
  if (name == "ArgumentMismatch") {  // "NAME: 1 required TYPE missing", "NAME: At least 2 required but received 1"
    const size_t at = m.find(": ");
    const std::string opt = m.substr(0, at), rest = at == std::string::npos ? "" : m.substr(at + 2);
    const size_t req = rest.find(" required "), got = rest.rfind("received ");
    if (req != std::string::npos && rest.size() >= 8 && rest.compare(rest.size() - 8, 8, " missing") == 0)
      return opt + ": needs a value";
    if (req != std::string::npos && got != std::string::npos) {
      const std::string n = rest.substr(rest.find_first_of("0123456789"), req - rest.find_first_of("0123456789"));
      const std::string count = rest.substr(got + 9);
      if (rest.rfind("At Most", 0) == 0) return opt + ": takes " + n + " value(s), got " + count + " (given more than once?)";
      return opt + ": expects " + n + " values, got " + count;
    }
  }
  return m;
}

// An option of several long names (--max-tokens, --n-predict) named as the command line spelled
// it (CLI11 names it by its first long name, as it does a short one, -n: the name that says what
// it is): "NAME: ..." with NAME the option's last long name in argv.
std::string as_typed(const std::string& what, const CLI::App* cmd, int argc, char** argv) {
  const size_t at = what.find(": ");
  if (!cmd || at == std::string::npos) return what;
  const CLI::Option* o = cmd->get_option_no_throw(what.substr(0, at));
  if (!o) return what;
  std::vector<std::string> names;
  for (const std::string& l : o->get_lnames()) names.push_back("--" + l);
  for (int i = argc - 1; i > 0; --i) {
    const std::string arg = argv[i];
    for (const std::string& n : names)
      if (arg == n || arg.rfind(n + "=", 0) == 0) return n + what.substr(at);
  }
  return what;
}

}  // namespace

int parse_command_line(CLI::App& app, int argc, char** argv) {
  try {
    app.parse(argc, argv);
    return -1;
  } catch (const CLI::Success& e) {  // --help
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    CLI::App* cmd = nullptr;
    for (CLI::App* sub : app.get_subcommands()) cmd = sub;
    const std::string where = cmd ? "attn " + cmd->get_name() : "attn";
    std::vector<std::string> extras = app.remaining();
    if (cmd)
      for (const std::string& s : cmd->remaining()) extras.push_back(s);
    std::string what;
    for (const std::string& s : extras)
      if (s.size() > 1 && s[0] == '-' && !looks_like_number(s)) {
        what = "unknown option " + in_quotes(s.substr(0, s.find('=')));
        break;
      }
    if (what.empty() && !extras.empty())
      what = cmd ? "unexpected argument " + in_quotes(extras.front()) : "unknown command " + in_quotes(extras.front());
    if (what.empty()) what = as_typed(explain(e), cmd, argc, argv);
    if (cmd && what.rfind(cmd->get_name() + ": ", 0) == 0) what = what.substr(cmd->get_name().size() + 2);
    fmt::print(stderr, "error: {}: {}\n({} --help lists {})\n", where, what, where, cmd ? "its options" : "the commands");
    return 2;
  }
}

}  // namespace attn::cli
