// The range of a float option of a mechanism's text (scale, decay, power, ...), declared once in
// the family's ranges(m) (core/facts.hpp), which its facts(m) lists: validation checks it on every
// call (check_option_ranges), attn::info and `attn list --json` list it, `attn run --help` prints
// it. A range is what the family can compute in float32 from ordinary inputs: past it the option
// itself overflows (polaformer:power=100 makes |x|^100 infinite for |x| = 3), so it is refused,
// naming the option, the range and the value.
#pragma once
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace attn::core {

struct OptionRange {
  // name and note are literals (views of static text: built per attend call, they allocate nothing)
  std::string_view name;         // as the text writes it: "scale"
  std::optional<double> value;   // this mechanism's; none when left at its default (or off)
  double lo = 0, hi = 0;
  bool lo_open = false, hi_open = false;
  std::string_view note;         // what else is accepted or why ("0 = off")
  std::string interval() const;  // "[1e-30, 1e+12]"
  std::string text() const;      // "scale in [1e-30, 1e+12]", and the note in parentheses
};

// The scale every family multiplies its scores (or features) by: the same range everywhere.
OptionRange scale_range(const std::optional<double>& value);

// Throws attn::Error "<kind> <name> must be in <interval>, got <value>" for the first option out
// of its range (NaN and infinities included); the message is made only then.
void check_option_ranges(const std::vector<OptionRange>& ranges, std::string_view kind);

}  // namespace attn::core
