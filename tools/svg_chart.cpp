#include "svg_chart.hpp"

#include <fmt/core.h>

#include <algorithm>
#include <cmath>

namespace attn::cli {
namespace {

constexpr double kW = 460, kH = 360, kLeft = 64, kRight = 16, kTop = 36, kBottom = 52;
constexpr double kCharWidth = 6.8, kLine = 11;  // a point label's character (10 px type) and line

// Characters of UTF-8 text (its code points).
int64_t code_points(const std::string& t) {
  int64_t n = 0;
  for (unsigned char c : t) n += (c & 0xC0) != 0x80;
  return n;
}

// The first characters of t and an ellipsis, at most `fit` characters in all (t if it fits).
std::string shortened(const std::string& t, int64_t fit) {
  if (code_points(t) <= fit) return t;
  std::string out;
  int64_t n = 0;
  for (size_t i = 0; i < t.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(t[i]);
    if ((c & 0xC0) != 0x80 && ++n > fit - 1) break;
    out += t[i];
  }
  return fit >= 1 ? out + "\u2026" : std::string();
}

std::string escaped(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '<') out += "&lt;";
    else if (c == '>') out += "&gt;";
    else if (c == '&') out += "&amp;";
    else if (c == '"') out += "&quot;";
    else out += c;
  }
  return out;
}

struct Axis {
  double lo, hi;
  bool log;
  double to_unit(double v) const {
    const double a = log ? std::log10(lo) : lo, b = log ? std::log10(hi) : hi, x = log ? std::log10(v) : v;
    return b > a ? (x - a) / (b - a) : 0.5;
  }
  std::vector<double> ticks() const {
    std::vector<double> t;
    if (log) {
      for (double p = std::floor(std::log10(lo)); p <= std::ceil(std::log10(hi)); ++p)
        for (double m : {1.0, 2.0, 5.0})
          if (const double v = m * std::pow(10.0, p); v >= lo * 0.999 && v <= hi * 1.001) t.push_back(v);
    } else {
      const double span = hi - lo, step0 = std::pow(10.0, std::floor(std::log10(span / 5)));
      const double step = span / step0 > 25 ? 5 * step0 : span / step0 > 10 ? 2 * step0 : step0;
      for (double v = std::ceil(lo / step) * step; v <= hi + 1e-9 * span; v += step) t.push_back(v);
    }
    return t;
  }
};

Axis axis_of(const std::vector<double>& values, bool log) {
  double lo = *std::min_element(values.begin(), values.end()), hi = *std::max_element(values.begin(), values.end());
  if (log) {
    lo = std::max(lo, 1e-300);
    lo /= 1.25, hi *= 1.25;
  } else {
    const double pad = hi > lo ? 0.08 * (hi - lo) : std::max(1.0, std::abs(hi) * 0.1);
    lo -= pad, hi += pad;
  }
  return {lo, hi, log};
}

std::string tick_text(double v) {
  if (v != 0 && (std::abs(v) >= 1e5 || std::abs(v) < 1e-2)) return fmt::format("{:.0e}", v);
  return fmt::format("{:g}", v);
}

std::string panel_svg(const ChartPanel& p, double ox) {
  std::string s = fmt::format("<g transform=\"translate({},0)\">\n", ox);
  s += fmt::format("<text x=\"{}\" y=\"20\" font-size=\"14\" text-anchor=\"middle\" font-weight=\"bold\">{}</text>\n",
                   kW / 2, escaped(p.title));
  const double pw = kW - kLeft - kRight, ph = kH - kTop - kBottom;
  s += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"none\" stroke=\"#444\"/>\n", kLeft, kTop, pw, ph);
  if (p.points.empty()) return s + "</g>\n";
  std::vector<double> xs, ys;
  for (const ChartPoint& q : p.points) xs.push_back(q.x), ys.push_back(q.y);
  const Axis ax = axis_of(xs, p.log_x), ay = axis_of(ys, p.log_y);
  for (double t : ax.ticks()) {
    const double x = kLeft + ax.to_unit(t) * pw;
    s += fmt::format("<line x1=\"{0}\" y1=\"{1}\" x2=\"{0}\" y2=\"{2}\" stroke=\"#ddd\"/>"
                     "<text x=\"{0}\" y=\"{3}\" font-size=\"11\" text-anchor=\"middle\">{4}</text>\n",
                     x, kTop, kTop + ph, kTop + ph + 15, tick_text(t));
  }
  for (double t : ay.ticks()) {
    const double y = kTop + (1 - ay.to_unit(t)) * ph;
    s += fmt::format("<line x1=\"{0}\" y1=\"{1}\" x2=\"{2}\" y2=\"{1}\" stroke=\"#ddd\"/>"
                     "<text x=\"{3}\" y=\"{4}\" font-size=\"11\" text-anchor=\"end\">{5}</text>\n",
                     kLeft, y, kLeft + pw, kLeft - 5, y + 4, tick_text(t));
  }
  s += fmt::format("<text x=\"{}\" y=\"{}\" font-size=\"12\" text-anchor=\"middle\">{}</text>\n", kLeft + pw / 2, kH - 12,
                   escaped(p.x_label));
  s += fmt::format("<text transform=\"translate(14,{}) rotate(-90)\" font-size=\"12\" text-anchor=\"middle\">{}</text>\n",
                   kTop + ph / 2, escaped(p.y_label));
  // Labels in 10 px type, their boxes estimated (kCharWidth a character, wide enough for DejaVu
  // Sans, the usual sans-serif) and kept inside the plot: right of the point, or left of it where
  // there is more room, cut with an ellipsis when neither side holds it (the point's <title> keeps
  // the whole name), then moved by a line at a time, down or up, off the labels placed before.
  struct Box {
    double x0, x1, y0, y1;  // y: the baseline's line, 9 px above it to 2 px below
  };
  std::vector<Box> placed;
  const double right_edge = kLeft + pw, top = kTop + 10, bottom = kTop + ph - 3;
  auto width_of = [](const std::string& t) { return kCharWidth * static_cast<double>(code_points(t)); };
  for (const ChartPoint& q : p.points) {
    const double x = kLeft + ax.to_unit(q.x) * pw, y = kTop + (1 - ay.to_unit(q.y)) * ph;
    const double room_right = right_edge - (x + 6), room_left = (x - 6) - kLeft;
    std::string label = q.label;
    const bool right = width_of(label) <= room_right || room_right >= room_left;
    const double room = right ? room_right : room_left;
    if (width_of(label) > room) label = shortened(label, static_cast<int64_t>(room / kCharWidth));
    const double w = width_of(label), x0 = right ? x + 6 : x - 6 - w;
    auto free_at = [&](double ly) {
      for (const Box& b : placed)
        if (x0 < b.x1 && b.x0 < x0 + w && ly - 9 < b.y1 && b.y0 < ly + 2) return false;
      return true;
    };
    double ly = std::clamp(y - 5, top, bottom);
    for (int k = 1; !free_at(ly) && k < 64; ++k) {  // y - 5 + 11, - 11, + 22, - 22, ... inside the plot
      const double step = kLine * ((k + 1) / 2) * (k % 2 ? 1 : -1), at = std::clamp(y - 5, top, bottom) + step;
      if (at >= top && at <= bottom && free_at(at)) ly = at;
    }
    placed.push_back({x0, x0 + w, ly - 9, ly + 2});
    const char* colour = q.highlight ? "#d62728" : "#1f77b4";
    s += fmt::format("<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"4\" fill=\"{}\"><title>{}: ({:g}, {:g})</title></circle>"
                     "<text x=\"{:.1f}\" y=\"{:.1f}\" font-size=\"10\" fill=\"{}\">{}</text>\n",
                     x, y, colour, escaped(q.label), q.x, q.y, x0, ly, colour, escaped(label));
  }
  return s + "</g>\n";
}

}  // namespace

std::string svg_scatter(const std::vector<ChartPanel>& panels, const std::string& caption) {
  const double width = kW * static_cast<double>(panels.size()), height = kH + 24;
  std::string s = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{0}\" height=\"{1}\" viewBox=\"0 0 {0} {1}\" "
      "font-family=\"sans-serif\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n",
      width, height);
  for (size_t i = 0; i < panels.size(); ++i) s += panel_svg(panels[i], kW * static_cast<double>(i));
  s += fmt::format("<text x=\"8\" y=\"{}\" font-size=\"11\" fill=\"#555\">{}</text>\n</svg>\n", height - 6, escaped(caption));
  return s;
}

}  // namespace attn::cli
