// Small self-contained SVG plots for `cemfrac compare`: lines with a band, points with error bars,
// categorical or numeric (optionally logarithmic) x. Each series is one
// <g class="series" data-name="..."> holding its band (<path class="band">), line
// (<polyline class="line">), points (<circle class="point">) and error bars (<line
// class="errorbar">), so tests and scripts can read the series back.
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
};

struct Plot {
  std::string title, x_label, y_label;
  std::vector<std::string> categories;  // non-empty: x values are indices into these labels
  bool log_x = false;
  std::vector<PlotSeries> series;
};

// The plot as a complete SVG document. Non-finite values are left out.
std::string to_svg(const Plot& plot);

}  // namespace cemfrac
