#include "cemfrac/io/plot.h"

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

constexpr double kW = 720, kH = 440;  // one panel

// One panel's geometry (a kW x kH box at (ox, 0)) and the data range it shows.
struct Frame {
  static constexpr double T = 40, B = 60, R = 190;
  Frame(const Plot& p, double ox_) : plot(p), ox(ox_), L(ox_ + 80), cat(!p.categories.empty()) {}

  double fx(double x) const { return plot.log_x ? std::log10(x) : x; }
  bool ok(double x, double y) const {
    return std::isfinite(x) && std::isfinite(y) && (!plot.log_x || x > 0);
  }
  double px(double x) const { return L + (fx(x) - x0) / (x1 - x0) * pw; }
  double pxc(double v) const { return L + (v - x0) / (x1 - x0) * pw; }  // already transformed
  double py(double y) const { return T + (1 - (y - y0) / (y1 - y0)) * ph; }

  const Plot& plot;
  double ox, L;
  double pw = kW - 80 - R, ph = kH - T - B;
  bool cat;
  double x0 = 0, x1 = 1, y0 = 0, y1 = 1;
};

// The range of every finite point, band, reference line and x tick; padded, never empty.
void fit_range(Frame& f) {
  const Plot& plot = f.plot;
  double x0 = std::numeric_limits<double>::infinity(), x1 = -x0, y0 = x0, y1 = -x0;
  for (const PlotSeries& s : plot.series) {
    for (size_t i = 0; i < s.x.size() && i < s.y.size(); ++i) {
      if (!f.ok(s.x[i], s.y[i])) continue;
      x0 = std::min(x0, f.fx(s.x[i]));
      x1 = std::max(x1, f.fx(s.x[i]));
      double lo = s.y[i], hi = s.y[i];
      if (i < s.lo.size() && std::isfinite(s.lo[i])) lo = std::min(lo, s.lo[i]);
      if (i < s.hi.size() && std::isfinite(s.hi[i])) hi = std::max(hi, s.hi[i]);
      y0 = std::min(y0, lo);
      y1 = std::max(y1, hi);
    }
  }
  for (const PlotReference& r : plot.references) {
    if (!std::isfinite(r.y)) continue;
    y0 = std::min(y0, r.y);
    y1 = std::max(y1, r.y);
  }
  for (double t : plot.x_ticks) {
    if (!std::isfinite(t) || (plot.log_x && t <= 0)) continue;
    x0 = std::min(x0, f.fx(t));
    x1 = std::max(x1, f.fx(t));
  }
  if (f.cat) {
    x0 = -0.5;
    x1 = static_cast<double>(plot.categories.size()) - 0.5;
  }
  if (!(x0 <= x1)) x0 = 0, x1 = 1;
  if (!(y0 <= y1)) y0 = 0, y1 = 1;
  if (x1 - x0 < 1e-12) x0 -= 0.5, x1 += 0.5;
  if (y1 - y0 < 1e-12 * std::max(1.0, std::fabs(y0))) y0 -= 0.5, y1 += 0.5;
  const double pad = 0.05 * (y1 - y0);
  f.x0 = x0;
  f.x1 = x1;
  f.y0 = y0 - pad;
  f.y1 = y1 + pad;
}

// The title, frame, grid, ticks and axis labels.
std::string axes_svg(const Frame& f) {
  const Plot& plot = f.plot;
  const double L = f.L, T = Frame::T, pw = f.pw, ph = f.ph;
  std::string o;
  o += fmt::format("<text x=\"{}\" y=\"24\" text-anchor=\"middle\" font-size=\"15\">{}</text>\n",
                   L + pw / 2, xml_escape(plot.title));
  o += "<g class=\"axes\" stroke=\"#444\" fill=\"none\">\n";
  o += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\"/>\n", L, T, pw, ph);
  o += "</g>\n<g class=\"ticks\">\n";
  for (double v : round_ticks(f.y0, f.y1)) {
    o += fmt::format(
        "<line x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"#ddd\"/>", L,
        f.py(v), L + pw, f.py(v));
    o += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"end\">{}</text>\n", L - 6,
                     f.py(v) + 4, tick_label(v));
  }
  if (f.cat) {
    for (size_t i = 0; i < plot.categories.size(); ++i) {
      const double x = f.pxc(static_cast<double>(i));
      o += fmt::format(
          "<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"end\" transform=\"rotate(-25 {:.1f} "
          "{:.1f})\">{}</text>\n",
          x, T + ph + 16, x, T + ph + 16, xml_escape(plot.categories[i]));
    }
  } else {
    std::vector<double> xt = plot.x_ticks;
    if (xt.empty())
      xt = plot.log_x ? round_log_ticks(std::pow(10.0, f.x0), std::pow(10.0, f.x1))
                      : round_ticks(f.x0, f.x1);
    for (double v : xt) {
      if (!std::isfinite(v) || (plot.log_x && v <= 0)) continue;
      const double x = f.px(v);
      o += fmt::format(
          "<line x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"#ddd\"/>", x, T,
          x, T + ph);
      o += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\">{}</text>\n", x,
                       T + ph + 16, tick_label(v));
    }
  }
  o += "</g>\n";
  o += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n", L + pw / 2,
                   kH - 12, xml_escape(plot.x_label));
  o += fmt::format(
      "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\" transform=\"rotate(-90 {} {})\">{}</text>\n",
      f.ox + 16, T + ph / 2, f.ox + 16, T + ph / 2, xml_escape(plot.y_label));
  return o;
}

// Series k: its band or error bars, line and points, then its legend entry at height ly.
std::string series_svg(const Frame& f, size_t k, double ly) {
  const PlotSeries& s = f.plot.series[k];
  const double L = f.L, pw = f.pw;
  const std::string colour = s.colour.empty() ? kColours[k % 10] : s.colour;
  std::string o = fmt::format("<g class=\"series\" data-name=\"{}\" stroke=\"{}\" fill=\"{}\">\n",
                              xml_escape(s.name), colour, colour);
  std::vector<size_t> idx;
  for (size_t i = 0; i < s.x.size() && i < s.y.size(); ++i)
    if (f.ok(s.x[i], s.y[i])) idx.push_back(i);
  auto X = [&](size_t i) { return f.cat ? f.pxc(s.x[i]) : f.px(s.x[i]); };
  const bool bounds = s.lo.size() == s.x.size() && s.hi.size() == s.x.size();
  if (bounds && s.band && idx.size() >= 2) {
    std::string d;
    for (size_t j = 0; j < idx.size(); ++j)
      d += fmt::format("{}{:.1f},{:.1f} ", j == 0 ? "M" : "L", X(idx[j]), f.py(s.hi[idx[j]]));
    for (size_t j = idx.size(); j-- > 0;)
      d += fmt::format("L{:.1f},{:.1f} ", X(idx[j]), f.py(s.lo[idx[j]]));
    o += fmt::format("<path class=\"band\" d=\"{}Z\" fill-opacity=\"0.18\" stroke=\"none\"/>\n", d);
  }
  if (s.line && idx.size() >= 2) {
    std::string pts;
    for (size_t i : idx) pts += fmt::format("{:.1f},{:.1f} ", X(i), f.py(s.y[i]));
    o +=
        fmt::format("<polyline class=\"line\" points=\"{}\" fill=\"none\" stroke-width=\"2\"{}/>\n",
                    pts, s.dashed ? " stroke-dasharray=\"6,4\"" : "");
  }
  for (size_t i : idx) {
    if (bounds && !s.band)
      o += fmt::format(
          "<line class=\"errorbar\" x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" "
          "stroke-width=\"1.5\"/>\n",
          X(i), f.py(s.lo[i]), X(i), f.py(s.hi[i]));
    o += fmt::format(
        "<circle class=\"point\" cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"3.5\" data-x=\"{}\" "
        "data-y=\"{}\"/>\n",
        X(i), f.py(s.y[i]), s.x[i], s.y[i]);
  }
  o += "</g>\n";
  if (s.dashed) {
    o += fmt::format(
        "<g class=\"legend\"><line x1=\"{}\" y1=\"{:.1f}\" x2=\"{}\" y2=\"{:.1f}\" "
        "stroke=\"{}\" stroke-width=\"2\" stroke-dasharray=\"6,4\"/>"
        "<text x=\"{}\" y=\"{:.1f}\">{}</text></g>\n",
        L + pw + 8, ly + 6, L + pw + 26, ly + 6, colour, L + pw + 30, ly + 10, xml_escape(s.name));
  } else {
    o += fmt::format(
        "<g class=\"legend\"><rect x=\"{}\" y=\"{:.1f}\" width=\"12\" height=\"12\" "
        "fill=\"{}\"/><text x=\"{}\" y=\"{:.1f}\">{}</text></g>\n",
        L + pw + 12, ly, colour, L + pw + 30, ly + 10, xml_escape(s.name));
  }
  return o;
}

// Reference line k across the frame, and its legend entry at height ly.
std::string reference_svg(const Frame& f, size_t k, double ly) {
  const PlotReference& r = f.plot.references[k];
  const double L = f.L, pw = f.pw;
  const std::string colour =
      r.colour.empty() ? kColours[(f.plot.series.size() + k) % 10] : r.colour;
  std::string o = fmt::format(
      "<g class=\"reference\" data-name=\"{}\" data-y=\"{}\"><line class=\"reference\" "
      "x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"{}\" "
      "stroke-width=\"1.5\" stroke-dasharray=\"2,3\"/></g>\n",
      xml_escape(r.name), r.y, L, f.py(r.y), L + pw, f.py(r.y), colour);
  o += fmt::format(
      "<g class=\"legend\"><line x1=\"{}\" y1=\"{:.1f}\" x2=\"{}\" y2=\"{:.1f}\" stroke=\"{}\" "
      "stroke-width=\"2\" stroke-dasharray=\"2,3\"/><text x=\"{}\" y=\"{:.1f}\">{}</text></g>\n",
      L + pw + 8, ly + 6, L + pw + 26, ly + 6, colour, L + pw + 30, ly + 10, xml_escape(r.name));
  return o;
}

// One plot drawn into a kW x kH box at (ox, 0): its title, frame, ticks, series and legend.
std::string panel(const Plot& plot, double ox) {
  Frame f(plot, ox);
  fit_range(f);
  std::string o = axes_svg(f);
  size_t entry = 0;  // legend entries so far
  auto legend_y = [&] { return Frame::T + 10 + 18 * static_cast<double>(entry++); };
  for (size_t k = 0; k < plot.series.size(); ++k) o += series_svg(f, k, legend_y());
  for (size_t k = 0; k < plot.references.size(); ++k)
    if (std::isfinite(plot.references[k].y)) o += reference_svg(f, k, legend_y());
  return o;
}

std::string document(double W, double H, const std::string& title, const std::string& body) {
  std::string o = fmt::format(
      "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" viewBox=\"0 0 {} {}\" "
      "font-family=\"sans-serif\" font-size=\"12\">\n",
      W, H, W, H);
  o += fmt::format("<title>{}</title>\n", xml_escape(title));
  o += fmt::format("<rect x=\"0\" y=\"0\" width=\"{}\" height=\"{}\" fill=\"white\"/>\n", W, H);
  return o + body + "</svg>\n";
}

}  // namespace

std::vector<double> round_ticks(double lo, double hi, int target) {
  const double span = hi - lo;
  if (!(span > 0) || !std::isfinite(span)) return {};
  const int e = static_cast<int>(std::floor(std::log10(span / target)));
  const double mag = std::pow(10.0, e);
  double m = 1;
  for (double c : {1.0, 2.0, 5.0, 10.0}) {
    m = c;
    if (span / (m * mag) <= target) break;
  }
  // The k-th multiple of the step m 10^e as (k m) / 10^-e for e < 0: an integer divided by an
  // exact power of ten rounds once, so 6 x 0.1 is written 0.6, not 0.6000000000000001.
  auto value = [&](double k) { return e >= 0 ? k * m * mag : k * m / std::pow(10.0, -e); };
  const double step = m * mag;
  std::vector<double> out;
  for (double k = std::ceil(lo / step - 1e-9); value(k) <= hi + 1e-9 * span; k += 1)
    out.push_back(k == 0 ? 0.0 : value(k));
  return out;
}

std::vector<double> round_log_ticks(double lo, double hi) {
  if (!(lo > 0) || !(hi >= lo) || !std::isfinite(hi)) return {};
  const int d0 = static_cast<int>(std::floor(std::log10(lo) + 1e-9));
  const int d1 = static_cast<int>(std::ceil(std::log10(hi) - 1e-9));
  std::vector<double> out;
  for (int d = d0; d <= d1; ++d)
    for (double m : d1 - d0 <= 3 ? std::vector<double>{1, 2, 5} : std::vector<double>{1}) {
      const double v = m * std::pow(10.0, d);
      if (v >= lo * (1 - 1e-9) && v <= hi * (1 + 1e-9)) out.push_back(v);
    }
  return out;
}

std::string tick_label(double v) {
  const double a = std::fabs(v);
  if (a >= 1e9) return fmt::format("{:.3g}G", v / 1e9);
  if (a >= 1e6) return fmt::format("{:.3g}M", v / 1e6);
  if (a >= 1e4) return fmt::format("{:.3g}k", v / 1e3);
  if (v != 0 && a < 1e-3) return fmt::format("{:.3g}", v);
  return fmt::format("{:.6g}", v);
}

std::string to_svg(const Plot& plot) {
  return document(kW, kH, plot.title, panel(plot, 0));
}

std::string to_svg(const std::vector<Plot>& panels, const std::string& caption) {
  std::string body, title;
  for (size_t i = 0; i < panels.size(); ++i) {
    body += fmt::format("<g class=\"panel\" data-title=\"{}\">\n", xml_escape(panels[i].title));
    body += panel(panels[i], kW * static_cast<double>(i)) + "</g>\n";
    title += (i ? "; " : "") + panels[i].title;
  }
  const double W = kW * static_cast<double>(std::max<size_t>(1, panels.size()));
  const double H = caption.empty() ? kH : kH + 20;
  if (!caption.empty())
    body += fmt::format(
        "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\" font-size=\"11\" fill=\"#555\">{}</text>\n",
        W / 2, H - 6, xml_escape(caption));
  return document(W, H, title, body);
}

}  // namespace cemfrac
