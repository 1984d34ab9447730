#include "cemfrac/compare/plot.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

namespace cemfrac {
namespace {

std::string xml_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&apos;"; break;
      default: out += c;
    }
  }
  return out;
}

const char* kColours[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd",
                          "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};

// "Nice" tick values covering [lo, hi].
std::vector<double> ticks(double lo, double hi, int target = 6) {
  const double span = hi - lo;
  const double raw = span / target;
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  double step = mag;
  for (double m : {1.0, 2.0, 2.5, 5.0, 10.0}) {
    step = m * mag;
    if (span / step <= target) break;
  }
  std::vector<double> out;
  for (double v = std::ceil(lo / step) * step; v <= hi + 1e-9 * span; v += step) out.push_back(v);
  return out;
}

std::string label(double v) {
  if (v != 0 && (std::fabs(v) >= 1e5 || std::fabs(v) < 1e-3)) return fmt::format("{:.3g}", v);
  return fmt::format("{:.6g}", v);
}

}  // namespace

std::string to_svg(const Plot& plot) {
  const double W = 720, H = 440, L = 80, R = 190, T = 40, B = 60;
  const double pw = W - L - R, ph = H - T - B;
  const bool cat = !plot.categories.empty();
  auto fx = [&](double x) { return plot.log_x ? std::log10(x) : x; };
  auto ok = [&](double x, double y) {
    return std::isfinite(x) && std::isfinite(y) && (!plot.log_x || x > 0);
  };

  double x0 = std::numeric_limits<double>::infinity(), x1 = -x0, y0 = x0, y1 = -x0;
  for (const PlotSeries& s : plot.series) {
    for (size_t i = 0; i < s.x.size() && i < s.y.size(); ++i) {
      if (!ok(s.x[i], s.y[i])) continue;
      x0 = std::min(x0, fx(s.x[i]));
      x1 = std::max(x1, fx(s.x[i]));
      double lo = s.y[i], hi = s.y[i];
      if (i < s.lo.size() && std::isfinite(s.lo[i])) lo = std::min(lo, s.lo[i]);
      if (i < s.hi.size() && std::isfinite(s.hi[i])) hi = std::max(hi, s.hi[i]);
      y0 = std::min(y0, lo);
      y1 = std::max(y1, hi);
    }
  }
  if (cat) {
    x0 = -0.5;
    x1 = static_cast<double>(plot.categories.size()) - 0.5;
  }
  if (!(x0 <= x1)) x0 = 0, x1 = 1;
  if (!(y0 <= y1)) y0 = 0, y1 = 1;
  if (x1 - x0 < 1e-12) x0 -= 0.5, x1 += 0.5;
  if (y1 - y0 < 1e-12 * std::max(1.0, std::fabs(y0))) y0 -= 0.5, y1 += 0.5;
  const double pad = 0.05 * (y1 - y0);
  y0 -= pad;
  y1 += pad;
  auto px = [&](double x) { return L + (fx(x) - x0) / (x1 - x0) * pw; };
  auto pxc = [&](double v) {
    return L + (v - x0) / (x1 - x0) * pw;
  };  // already transformed / index
  auto py = [&](double y) { return T + (1 - (y - y0) / (y1 - y0)) * ph; };

  std::string o;
  o += fmt::format(
      "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" viewBox=\"0 0 {} {}\" "
      "font-family=\"sans-serif\" font-size=\"12\">\n",
      W, H, W, H);
  o += fmt::format("<title>{}</title>\n", xml_escape(plot.title));
  o += fmt::format("<rect x=\"0\" y=\"0\" width=\"{}\" height=\"{}\" fill=\"white\"/>\n", W, H);
  o += fmt::format("<text x=\"{}\" y=\"24\" text-anchor=\"middle\" font-size=\"15\">{}</text>\n",
                   L + pw / 2, xml_escape(plot.title));
  // Axes, grid and ticks.
  o += "<g class=\"axes\" stroke=\"#444\" fill=\"none\">\n";
  o += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\"/>\n", L, T, pw, ph);
  o += "</g>\n<g class=\"ticks\">\n";
  for (double v : ticks(y0, y1)) {
    o += fmt::format(
        "<line x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"#ddd\"/>", L, py(v),
        L + pw, py(v));
    o += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"end\">{}</text>\n", L - 6,
                     py(v) + 4, label(v));
  }
  if (cat) {
    for (size_t i = 0; i < plot.categories.size(); ++i) {
      const double x = pxc(static_cast<double>(i));
      o += fmt::format(
          "<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"end\" transform=\"rotate(-25 {:.1f} "
          "{:.1f})\">{}</text>\n",
          x, T + ph + 16, x, T + ph + 16, xml_escape(plot.categories[i]));
    }
  } else {
    for (double v : ticks(x0, x1)) {
      const double x = pxc(v);
      o += fmt::format(
          "<line x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"#ddd\"/>", x, T,
          x, T + ph);
      o += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\">{}</text>\n", x,
                       T + ph + 16, label(plot.log_x ? std::pow(10.0, v) : v));
    }
  }
  o += "</g>\n";
  o += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n", L + pw / 2, H - 12,
                   xml_escape(plot.x_label));
  o += fmt::format(
      "<text x=\"16\" y=\"{}\" text-anchor=\"middle\" transform=\"rotate(-90 16 {})\">{}</text>\n",
      T + ph / 2, T + ph / 2, xml_escape(plot.y_label));

  // Series.
  for (size_t k = 0; k < plot.series.size(); ++k) {
    const PlotSeries& s = plot.series[k];
    const char* colour = kColours[k % 10];
    o += fmt::format("<g class=\"series\" data-name=\"{}\" stroke=\"{}\" fill=\"{}\">\n",
                     xml_escape(s.name), colour, colour);
    std::vector<size_t> idx;
    for (size_t i = 0; i < s.x.size() && i < s.y.size(); ++i)
      if (ok(s.x[i], s.y[i])) idx.push_back(i);
    auto X = [&](size_t i) { return cat ? pxc(s.x[i]) : px(s.x[i]); };
    const bool bounds = s.lo.size() == s.x.size() && s.hi.size() == s.x.size();
    if (bounds && s.band && idx.size() >= 2) {
      std::string d;
      for (size_t j = 0; j < idx.size(); ++j)
        d += fmt::format("{}{:.1f},{:.1f} ", j == 0 ? "M" : "L", X(idx[j]), py(s.hi[idx[j]]));
      for (size_t j = idx.size(); j-- > 0;)
        d += fmt::format("L{:.1f},{:.1f} ", X(idx[j]), py(s.lo[idx[j]]));
      o += fmt::format("<path class=\"band\" d=\"{}Z\" fill-opacity=\"0.18\" stroke=\"none\"/>\n",
                       d);
    }
    if (s.line && idx.size() >= 2) {
      std::string pts;
      for (size_t i : idx) pts += fmt::format("{:.1f},{:.1f} ", X(i), py(s.y[i]));
      o += fmt::format(
          "<polyline class=\"line\" points=\"{}\" fill=\"none\" stroke-width=\"2\"/>\n", pts);
    }
    for (size_t i : idx) {
      if (bounds && !s.band)
        o += fmt::format(
            "<line class=\"errorbar\" x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" "
            "stroke-width=\"1.5\"/>\n",
            X(i), py(s.lo[i]), X(i), py(s.hi[i]));
      o += fmt::format(
          "<circle class=\"point\" cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"3.5\" data-x=\"{}\" "
          "data-y=\"{}\"/>\n",
          X(i), py(s.y[i]), s.x[i], s.y[i]);
    }
    o += "</g>\n";
    // Legend entry.
    const double ly = T + 10 + 18 * static_cast<double>(k);
    o += fmt::format(
        "<g class=\"legend\"><rect x=\"{}\" y=\"{:.1f}\" width=\"12\" height=\"12\" fill=\"{}\"/>"
        "<text x=\"{}\" y=\"{:.1f}\">{}</text></g>\n",
        L + pw + 12, ly, colour, L + pw + 30, ly + 10, xml_escape(s.name));
  }
  o += "</svg>\n";
  return o;
}

}  // namespace cemfrac
