// --seed for the commands that draw: decimal digits only, a value in [0, 2^64 - 1]. CLI11's
// own conversion reads "-1" as 2^64 - 1, "18446744073709551616" as 2^64 - 1 (strtoull's
// overflow value) and "010" as octal; the check runs on the text before that conversion.
#include <cstdint>
#include <string>

#include "commands.hpp"

namespace attn::cli {

std::string seed_error(const std::string& text) {
  const std::string max = std::to_string(UINT64_MAX);
  const std::string expected = "expected an integer in [0, 2^64 - 1] (decimal digits), got '" + text + "'";
  if (text.empty() || text.size() > max.size()) return expected;
  for (char ch : text)
    if (ch < '0' || ch > '9') return expected;
  if (text.size() > 1 && text[0] == '0') return expected;  // not octal, not padded
  if (text.size() == max.size() && text > max) return expected;
  return "";
}

CLI::Option* add_seed_option(CLI::App* c, uint64_t& seed, const std::string& description) {
  return c->add_option("--seed", seed, description)
      ->capture_default_str()
      ->check(CLI::Validator([](std::string& text) { return seed_error(text); }, "SEED", "seed"));
}

}  // namespace attn::cli
