// The one SVG plotter (suite reports, the GP task's chart): lines with a band, points with error
// bars, dashed lines, horizontal reference lines, categorical or numeric (optionally logarithmic)
// x, one or several panels side by side. Axis ticks sit at round values (1, 2 or 5 times a power
// of ten, or the x values a plot names) and read as people write them: 50k, 1.2M, 0.25.
// Each series is one <g class="series" data-name="..."> holding its band (<path class="band">),
// line (<polyline class="line">), points (<circle class="point">) and error bars (<line
// class="errorbar">); a reference line is one <g class="reference" data-name="..."> holding
// <line class="reference">. Tests and scripts can read both back.
#pragma once
#include <string>
#include <vector>

namespace cemfrac {

struct PlotSeries {
  std::string name;
  std::vector<double> x, y;
  std::vector<double> lo, hi;  // empty, or one band / error-bar bound per point
  bool line = true;            // join the points
  bool band = true;            // lo/hi as a shaded band (false: error bars)
  bool dashed = false;         // a dashed line
  std::string colour;          // "" = the palette's, by the series' place
};

// A horizontal line across the plot at `y` (a baseline, a floor), dotted, with a legend entry.
struct PlotReference {
  std::string name;
  double y = 0;
  std::string colour;  // "" = the palette's, after the series'
};

struct Plot {
  std::string title, x_label, y_label;
  std::vector<std::string> categories;  // non-empty: x values are indices into these labels
  bool log_x = false;
  std::vector<double> x_ticks;  // non-empty: the x axis' ticks (e.g. every T evaluated)
  std::vector<PlotSeries> series;
  std::vector<PlotReference> references;
};

// The plot as a complete SVG document. Non-finite values are left out.
std::string to_svg(const Plot& plot);
// Several plots side by side in one SVG document, with an optional caption line under them.
std::string to_svg(const std::vector<Plot>& panels, const std::string& caption);

// Round tick values covering [lo, hi]: multiples of 1, 2 or 5 times a power of ten, at most
// about `target` of them.
std::vector<double> round_ticks(double lo, double hi, int target = 6);
// Round ticks of a logarithmic axis over [lo, hi] (lo > 0): 1, 2, 5 per decade over a few
// decades, the powers of ten over more.
std::vector<double> round_log_ticks(double lo, double hi);
// A tick's text: 50000 -> "50k", 1200000 -> "1.2M", 3e9 -> "3G", 0.25 -> "0.25", 1e-4 -> "0.0001".
std::string tick_label(double v);

}  // namespace cemfrac
