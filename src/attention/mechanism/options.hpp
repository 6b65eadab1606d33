// Reading and writing the options of a mechanism's text form ("causal,scale=0.1,window=128:0"),
// shared by every family so that all of them parse the same strict way:
//   - options are flags ("causal") or key=value, separated by single commas, no spaces;
//   - an option may appear once; a flag takes no value, a key needs one;
//   - numbers are plain decimal ("0.5", "-3", "1e-3"): no hex, no spaces, no "inf"/"nan";
//   - every option must be consumed by the family's parser; finish() names any left over
//     and lists the options the family knows.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace attn::mechanism {

class OptionReader {
 public:
  OptionReader(std::string_view kind, std::string_view options);

  bool flag(std::string_view name);
  std::optional<double> number(std::string_view name);
  std::optional<int64_t> integer(std::string_view name);
  std::optional<uint64_t> unsigned_integer(std::string_view name);
  // key=A:B, two integers (e.g. window=128:0); `shape` names them in messages ("LEFT:RIGHT").
  std::optional<std::pair<int64_t, int64_t>> integer_pair(std::string_view name, std::string_view shape = "A:B");
  // key=I;J;K, one or more integers separated by ';' (commas separate options).
  std::optional<std::vector<int64_t>> integer_list(std::string_view name, std::string_view shape = "I;J;K");
  // key=word, one of `allowed`.
  std::optional<std::string_view> word(std::string_view name, const std::vector<std::string_view>& allowed);
  // Throws naming the first option no reader consumed, with the list of known ones.
  void finish() const;
  // The options asked for so far, as the grammar writes them ("causal", "scale=X", ...).
  const std::vector<std::string>& known() const { return known_; }

 private:
  struct Option {
    std::string_view token, key, value;
    bool has_value = false;
    bool used = false;
  };
  Option* take(std::string_view name, bool wants_value, std::string_view shape);
  std::string kind_;
  std::vector<Option> options_;
  std::vector<std::string> known_;  // "causal", "scale=", ... in the order asked
};

// Builds the canonical text form: kind, then options in the order added.
class OptionWriter {
 public:
  explicit OptionWriter(std::string_view kind) : text_(kind) {}
  void flag(std::string_view name);
  void number(std::string_view name, double x);  // shortest text that reads back exactly
  void integer(std::string_view name, int64_t x);
  void unsigned_integer(std::string_view name, uint64_t x);
  void integer_pair(std::string_view name, int64_t a, int64_t b);
  void integer_list(std::string_view name, const std::vector<int64_t>& xs);
  void word(std::string_view name, std::string_view w);
  std::string str() const { return text_; }

 private:
  void add(std::string_view option);
  std::string text_;
  bool any_ = false;
};

// A piece of the caller's text in single quotes, for a message: control characters escaped (a NUL
// would end the message where C reads it), at most kQuotedChars shown, then how long it was.
inline constexpr size_t kQuotedChars = 80;
std::string quoted(std::string_view s);

}  // namespace attn::mechanism
