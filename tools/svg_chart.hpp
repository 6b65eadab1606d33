// A small self-contained SVG scatter chart (labelled points, linear or log axes), so commands can
// draw what they measure without a plotting dependency.
#pragma once
#include <string>
#include <vector>

namespace attn::cli {

struct ChartPoint {
  double x, y;
  std::string label;
  bool highlight = false;  // drawn in the accent colour (e.g. the exact baseline)
};

struct ChartPanel {
  std::string title, x_label, y_label;
  bool log_x = false, log_y = false;
  std::vector<ChartPoint> points;
};

// Panels side by side in one SVG document.
std::string svg_scatter(const std::vector<ChartPanel>& panels, const std::string& caption);

}  // namespace attn::cli
