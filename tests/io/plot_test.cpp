// The one plotter's axes (cemfrac/io/plot.h): ticks at 1, 2 or 5 times a power of ten, log axes
// by decade, labels as people write them, and the panels and reference lines of a document.
#include "cemfrac/io/plot.h"

#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "tests/svg_check.h"

namespace cemfrac {
namespace {

TEST(Plot, RoundTicks) {
  // The GP chart's old range: its ticks were 0.4233, 0.5840, 0.7447.
  EXPECT_EQ(round_ticks(0.4233, 0.7447), (std::vector<double>{0.5, 0.6, 0.7}));
  // Steps of 1, 2 or 5 (never 2.5) times a power of ten, at most about six ticks.
  EXPECT_EQ(round_ticks(0, 10), (std::vector<double>{0, 2, 4, 6, 8, 10}));
  EXPECT_EQ(round_ticks(0, 25), (std::vector<double>{0, 5, 10, 15, 20, 25}));
  EXPECT_EQ(round_ticks(-1, 1), (std::vector<double>{-1, -0.5, 0, 0.5, 1}));
  EXPECT_EQ(round_ticks(0, 1e6), (std::vector<double>{0, 2e5, 4e5, 6e5, 8e5, 1e6}));
  // Each tick is the double nearest its decimal (multiples, not a running sum: 0.6, not
  // 0.6000000000000001).
  EXPECT_EQ(round_ticks(0.1, 0.35), (std::vector<double>{0.1, 0.15, 0.2, 0.25, 0.3, 0.35}));
  EXPECT_TRUE(round_ticks(1, 1).empty());
}

TEST(Plot, RoundLogTicks) {
  EXPECT_EQ(round_log_ticks(1, 16), (std::vector<double>{1, 2, 5, 10}));
  EXPECT_EQ(round_log_ticks(3e4, 2e6), (std::vector<double>{5e4, 1e5, 2e5, 5e5, 1e6, 2e6}));
  EXPECT_EQ(round_log_ticks(1, 1e6), (std::vector<double>{1, 10, 100, 1e3, 1e4, 1e5, 1e6}));
}

TEST(Plot, TickLabels) {
  EXPECT_EQ(tick_label(50000), "50k");
  EXPECT_EQ(tick_label(1e6), "1M");
  EXPECT_EQ(tick_label(1.2e6), "1.2M");
  EXPECT_EQ(tick_label(3e9), "3G");
  EXPECT_EQ(tick_label(2000), "2000");
  EXPECT_EQ(tick_label(0.25), "0.25");
  EXPECT_EQ(tick_label(0), "0");
  EXPECT_EQ(tick_label(-50000), "-50k");
  EXPECT_EQ(tick_label(5e-5), "5e-05");
}

TEST(Plot, PanelsReferencesAndNamedTicks) {
  Plot a;
  a.title = "left";
  a.log_x = true;
  a.x_ticks = {1, 2, 4, 8};
  PlotSeries s;
  s.name = "cem";
  s.x = {1, 2, 4, 8};
  s.y = {0.5, 0.45, 0.43, 0.42};
  s.dashed = true;
  a.series.push_back(s);
  a.references.push_back({"baseline", 0.44, ""});
  Plot b = a;
  b.title = "right";
  const std::string svg = to_svg({a, b}, "a caption");
  EXPECT_EQ(svg.rfind("<?xml", 0), 0u);
  EXPECT_NE(svg.find("width=\"1440\""), std::string::npos);
  EXPECT_NE(svg.find("<g class=\"panel\" data-title=\"left\">"), std::string::npos);
  EXPECT_NE(svg.find("<g class=\"panel\" data-title=\"right\">"), std::string::npos);
  EXPECT_NE(svg.find("<g class=\"reference\" data-name=\"baseline\" data-y=\"0.44\">"),
            std::string::npos);
  EXPECT_NE(svg.find("stroke-dasharray=\"6,4\""), std::string::npos);
  EXPECT_NE(svg.find(">a caption</text>"), std::string::npos);
  EXPECT_NE(svg.find("text-anchor=\"middle\">8</text>"), std::string::npos);  // a named tick
  EXPECT_EQ(svg.find("text-anchor=\"middle\">5</text>"), std::string::npos);  // no 1-2-5 x tick
}

using test::parse_xml;
using test::svg_series;

TEST(PlotSvgCheck, RejectsMalformedDocuments) {
  // The checker must catch what a broken writer would produce, or the SVG tests prove nothing.
  for (const char* bad : {"<svg><g></svg>", "<svg a=\"1\" a=\"2\"/>", "<svg>a & b</svg>",
                          "<svg x=1/>", "<svg></svg><svg/>", "<svg><g></g>"}) {
    ::testing::TestPartResultArray failures;
    {
      ::testing::ScopedFakeTestPartResultReporter reporter(
          ::testing::ScopedFakeTestPartResultReporter::INTERCEPT_ONLY_CURRENT_THREAD, &failures);
      parse_xml(bad);
    }
    EXPECT_GT(failures.size(), 0) << bad;
  }
}

TEST(PlotSvg, SvgIsWellFormedWithItsSeries) {
  Plot p;
  p.title = "loss <&> \"quotes\"";
  p.x_label = "tokens";
  p.y_label = "loss";
  p.series.push_back(
      {"a&b", {1, 2, 3}, {5, 4, 3.5}, {4.9, 3.9, 3.4}, {5.1, 4.1, 3.6}, true, true, false, ""});
  p.series.push_back({"<c>", {1, 2, 3}, {5, std::nan(""), 3}, {}, {}, true, true, false, ""});
  const auto s = svg_series(to_svg(p));
  ASSERT_EQ(s.size(), 2u);
  EXPECT_EQ(s.at("a&amp;b"), 3);
  EXPECT_EQ(s.at("&lt;c&gt;"), 2);  // the NaN point is left out
  Plot bars;
  bars.categories = {"x", "y"};
  bars.series.push_back(
      {"ppl", {0, 1}, {300, 250}, {290, 240}, {310, 260}, false, false, false, ""});
  const std::string svg = to_svg(bars);
  EXPECT_EQ(svg_series(svg).at("ppl"), 2);
  EXPECT_NE(svg.find("class=\"errorbar\""), std::string::npos);
  Plot logx;
  logx.log_x = true;
  logx.series.push_back({"T", {1, 2, 4, 8}, {3, 2, 2.5, 2.8}, {}, {}, true, true, false, ""});
  EXPECT_EQ(svg_series(to_svg(logx)).at("T"), 4);
}

}  // namespace
}  // namespace cemfrac
