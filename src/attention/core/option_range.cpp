#include "core/option_range.hpp"

#include <cmath>
#include <cstdio>

#include "attn/error.hpp"

namespace attn::core {
namespace {

std::string number(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6g", x);
  return buf;
}

}  // namespace

std::string OptionRange::interval() const {
  return (lo_open ? "(" : "[") + number(lo) + ", " + number(hi) + (hi_open ? ")" : "]");
}

std::string OptionRange::text() const {
  return std::string(name) + " in " + interval() + (note.empty() ? "" : " (" + std::string(note) + ")");
}

OptionRange scale_range(const std::optional<double>& value) {
  // 1e12: scale^2 |q|^2 |k|^2 (GAU's squared ReLU, relu2 features) stays finite in float32 for
  // entries up to 1e3 and head dims up to 1e4; 1e-30 keeps it a normal float32 well above 0.
  return {"scale", value, 1e-30, 1e12, false, false, "default 1/sqrt(D) or 1"};
}

void check_option_ranges(const std::vector<OptionRange>& ranges, std::string_view kind) {
  for (const OptionRange& r : ranges) {
    if (!r.value) continue;
    const double x = *r.value;
    const bool above_lo = r.lo_open ? x > r.lo : x >= r.lo;
    const bool below_hi = r.hi_open ? x < r.hi : x <= r.hi;
    if (!(above_lo && below_hi))  // NaN fails both
      fail("attend", std::string(kind) + " " + std::string(r.name) + " must be in " + r.interval() + ", got " +
                         number(x) + (r.note.empty() ? "" : " (" + std::string(r.note) + ")"));
  }
}

}  // namespace attn::core
