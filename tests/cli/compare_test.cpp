// cemfrac compare: suite files and their one-line errors, the paired-t statistics against
// hand-computed values, the verdict rules, the SVG plots (parsed as XML, series read back), and a
// tiny end-to-end suite whose second invocation reuses every finished run instead of training it
// again.
#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <thread>

#include "cemfrac/io/plot.h"
#include "cemfrac/compare/progress.h"
#include "cemfrac/compare/stats.h"
#include "cemfrac/compare/suite.h"
#include "cemfrac/core/check.h"
#include "tests/test_util.h"

namespace cemfrac {
namespace {

namespace fs = std::filesystem;

// ---- a minimal XML well-formedness check (enough for the SVGs we write)
// ----------------------------

struct XmlElement {
  std::string name;
  std::map<std::string, std::string> attrs;
  std::vector<int> children;  // indices into the element list
  int parent = -1;
};

// Parses `text` into elements (index 0 is the root); fails the test on any malformation.
std::vector<XmlElement> parse_xml(const std::string& text) {
  std::vector<XmlElement> out;
  std::vector<int> stack;
  size_t i = 0;
  auto fail_at = [&](const std::string& why) {
    ADD_FAILURE() << "XML: " << why << " at offset " << i;
    out.clear();
    return out;
  };
  auto check_text = [&](const std::string& t) {  // character data: only known entities
    for (size_t k = 0; k < t.size(); ++k) {
      if (t[k] == '<') return false;
      if (t[k] == '&') {
        const size_t semi = t.find(';', k);
        if (semi == std::string::npos) return false;
        const std::string e = t.substr(k, semi - k + 1);
        if (e != "&amp;" && e != "&lt;" && e != "&gt;" && e != "&quot;" && e != "&apos;")
          return false;
      }
    }
    return true;
  };
  while (i < text.size()) {
    const size_t lt = text.find('<', i);
    if (lt == std::string::npos) {
      if (!check_text(text.substr(i))) return fail_at("bad character data");
      break;
    }
    if (!check_text(text.substr(i, lt - i))) return fail_at("bad character data");
    if (lt > i && stack.empty() &&
        text.substr(i, lt - i).find_first_not_of(" \n\r\t") != std::string::npos)
      return fail_at("text outside the root");
    i = lt;
    if (text.compare(i, 5, "<?xml") == 0) {
      const size_t end = text.find("?>", i);
      if (end == std::string::npos || !out.empty()) return fail_at("bad declaration");
      i = end + 2;
      continue;
    }
    const size_t gt = text.find('>', i);
    if (gt == std::string::npos) return fail_at("unclosed tag");
    std::string tag = text.substr(i + 1, gt - i - 1);
    i = gt + 1;
    if (!tag.empty() && tag[0] == '/') {
      const std::string name = tag.substr(1);
      if (stack.empty() || out[stack.back()].name != name)
        return fail_at("mismatched </" + name + ">");
      stack.pop_back();
      continue;
    }
    const bool self_closing = !tag.empty() && tag.back() == '/';
    if (self_closing) tag.pop_back();
    static const std::regex name_re(R"(^([A-Za-z_][\w.-]*))");
    std::smatch m;
    if (!std::regex_search(tag, m, name_re)) return fail_at("bad element name");
    XmlElement e;
    e.name = m[1];
    std::string rest = tag.substr(m[0].length());
    static const std::regex attr_re(R"(^\s+([A-Za-z_][\w.:-]*)=\"([^\"<]*)\")");
    while (std::regex_search(rest, m, attr_re)) {
      if (!check_text(m[2])) return fail_at("bad attribute value");
      if (!e.attrs.emplace(m[1], m[2]).second)
        return fail_at("duplicate attribute " + std::string(m[1]));
      rest = rest.substr(m[0].length());
    }
    if (rest.find_first_not_of(" \n\t") != std::string::npos)
      return fail_at("bad attributes: " + rest);
    if (stack.empty() && !out.empty()) return fail_at("second root element");
    e.parent = stack.empty() ? -1 : stack.back();
    out.push_back(e);
    const int idx = static_cast<int>(out.size()) - 1;
    if (e.parent >= 0) out[e.parent].children.push_back(idx);
    if (!self_closing) stack.push_back(idx);
  }
  if (!stack.empty()) return fail_at("unclosed <" + out[stack.back()].name + ">");
  if (out.empty() || out[0].name != "svg") ADD_FAILURE() << "XML: root is not <svg>";
  return out;
}

// series name -> number of points (<circle class="point">) in it.
std::map<std::string, int> svg_series(const std::string& svg) {
  std::map<std::string, int> series;
  const auto els = parse_xml(svg);
  for (const XmlElement& e : els) {
    if (e.name != "g" || e.attrs.count("class") == 0 || e.attrs.at("class") != "series") continue;
    int points = 0;
    for (int c : e.children)
      if (els[c].name == "circle" && els[c].attrs.count("class") &&
          els[c].attrs.at("class") == "point")
        ++points;
    series[e.attrs.at("data-name")] = points;
  }
  return series;
}

TEST(CompareXmlCheck, RejectsMalformedDocuments) {
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

// ---- statistics
// ------------------------------------------------------------------------------------

TEST(CompareStats, StudentTQuantileMatchesTables) {
  // Reference values: t_{0.975, df} to 9 digits (any statistics table / scipy.stats.t.ppf). The
  // bisection runs 200 halvings of [-1e4, 1e4] and the continued fraction to 1e-15 relative, so
  // 1e-7 is far above the method's error and far below a wrong df (t_{.975,2} - t_{.975,3} = 1.1).
  EXPECT_NEAR(student_t_quantile(0.975, 1), 12.706204736, 1e-7);
  EXPECT_NEAR(student_t_quantile(0.975, 2), 4.302652730, 1e-7);
  EXPECT_NEAR(student_t_quantile(0.975, 4), 2.776445105, 1e-7);
  EXPECT_NEAR(student_t_quantile(0.975, 9), 2.262157163, 1e-7);
  EXPECT_NEAR(student_t_quantile(0.025, 9), -2.262157163, 1e-7);
  EXPECT_NEAR(student_t_cdf(0, 3), 0.5, 1e-12);
}

TEST(CompareStats, PairedIntervalByHand) {
  // d = a - b = {-0.1, -0.05, -0.15}: mean -0.1, sd 0.05, half-width t_{.975,2} * 0.05 / sqrt(3).
  const PairedDiff d = paired_difference({1.0, 1.2, 0.9}, {1.1, 1.25, 1.05});
  EXPECT_EQ(d.diff.n, 3);
  EXPECT_NEAR(d.diff.mean, -0.1, 1e-12);
  EXPECT_NEAR(d.diff.sd, 0.05, 1e-12);
  const double half = 4.302652730 * 0.05 / std::sqrt(3.0);  // 0.12420686...
  EXPECT_NEAR(d.lo, -0.1 - half, 1e-8);
  EXPECT_NEAR(d.hi, -0.1 + half, 1e-8);
  EXPECT_TRUE(d.has_interval);
  // Pairing matters: the same values unpaired would give a far wider spread.
  const PairedDiff tight = paired_difference({2.0, 3.0, 4.0, 5.0}, {2.1, 3.1, 4.1, 5.1});
  EXPECT_NEAR(tight.diff.sd, 0, 1e-12);
  EXPECT_NEAR(tight.lo, -0.1, 1e-12);
  // One seed: no interval.
  const PairedDiff one = paired_difference({1.0}, {2.0});
  EXPECT_FALSE(one.has_interval);
  EXPECT_EQ(verdict(one, "better", 0), Verdict::kInconclusive);
  EXPECT_THROW(paired_difference({1.0, 2.0}, {1.0}), Error);
}

TEST(CompareStats, Verdicts) {
  auto diff = [](double lo, double hi) {
    PairedDiff d;
    d.lo = lo;
    d.hi = hi;
    d.diff.n = 3;
    d.has_interval = true;
    return d;
  };
  EXPECT_EQ(verdict(diff(-0.3, -0.1), "better", 0), Verdict::kSupported);
  EXPECT_EQ(verdict(diff(0.1, 0.3), "better", 0), Verdict::kContradicted);
  EXPECT_EQ(verdict(diff(-0.1, 0.1), "better", 0), Verdict::kInconclusive);
  // not_worse with margin 0.05: a may trail b by less than 0.05 nats.
  EXPECT_EQ(verdict(diff(0.01, 0.04), "not_worse", 0.05), Verdict::kSupported);
  EXPECT_EQ(verdict(diff(0.06, 0.09), "not_worse", 0.05), Verdict::kContradicted);
  EXPECT_EQ(verdict(diff(0.01, 0.09), "not_worse", 0.05), Verdict::kInconclusive);
  EXPECT_EQ(verdict(diff(0.01, 0.04), "better", 0), Verdict::kContradicted);
  using V = Verdict;
  EXPECT_EQ(combine({V::kSupported, V::kSupported}), V::kSupported);
  EXPECT_EQ(combine({V::kSupported, V::kInconclusive}), V::kInconclusive);
  EXPECT_EQ(combine({V::kSupported, V::kContradicted, V::kInconclusive}), V::kContradicted);
  EXPECT_EQ(combine({}), V::kInconclusive);
}

// ---- plots
// -----------------------------------------------------------------------------------------

// The progress line's time left: the plan's figure before anything is measured, the measured rate
// once a tenth of the phase (or ten minutes per job slot) is done, and between the two a blend
// that one coarse early report cannot blow up (a resumed gp suite once read 67h against 2h44m).
TEST(CompareProgress, EtaBlendsThePlanIntoTheMeasuredRate) {
  const double total = 20000;  // job-seconds, two jobs at a time: the plan says 10,000 s
  EXPECT_DOUBLE_EQ(phase_eta_seconds(total, 0, 0, 2), 10000);
  EXPECT_DOUBLE_EQ(phase_eta_seconds(total, 0, 60, 2), 10000);
  // 1,200 job-seconds (ten minutes per slot, below a tenth of 20,000) done in 900 s: trusted.
  EXPECT_DOUBLE_EQ(phase_eta_seconds(total, 1200, 900, 2), (total - 1200) * 900 / 1200);
  EXPECT_DOUBLE_EQ(phase_eta_seconds(total, 5000, 2000, 2), (total - 5000) * 2000 / 5000);
  // A minute in with 5 job-seconds reported, the measured rate alone would say
  // (20,000 - 5) * 60 / 5 s, about 66h; the blend stays within 10% of the plan.
  const double early = phase_eta_seconds(total, 5, 60, 2);
  EXPECT_GT(early, (total - 5) / 2);
  EXPECT_LT(early, 1.1 * 10000);
  // Halfway to trusted: the mean of the two figures.
  const double half = phase_eta_seconds(total, 600, 600, 2);
  EXPECT_DOUBLE_EQ(half, 0.5 * (total - 600) * 600 / 600 + 0.5 * (total - 600) / 2);
  // A small phase: a tenth of it is the threshold.
  EXPECT_DOUBLE_EQ(phase_eta_seconds(100, 10, 20, 1), 90.0 * 20 / 10);
  // Done (or past the estimate): nothing left; one job at a time when 0 is passed.
  EXPECT_DOUBLE_EQ(phase_eta_seconds(total, total, 500, 2), 0);
  EXPECT_DOUBLE_EQ(phase_eta_seconds(total, 2 * total, 500, 2), 0);
  EXPECT_DOUBLE_EQ(phase_eta_seconds(total, 0, 0, 0), total);
}

TEST(ComparePlot, SvgIsWellFormedWithItsSeries) {
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

// ---- suites
// ----------------------------------------------------------------------------------------

std::string tiny_suite(const std::string& data, const std::string& extra_head = "",
                       const std::string& tail = "") {
  const std::string llama = test::source_path("configs/tiny-llama.toml");
  const std::string cem = test::source_path("configs/tiny-cem-both.toml");
  return "[suite]\nname = \"tiny\"\ndescription = \"test suite\"\ndata = \"" + data +
         "\"\ntokens = 256\nseeds = [1, 2]\nlr = [3e-3]\nlr_search_tokens = 128\nval_points = 2\n"
         "set = [\"model.d_model=32\", \"model.n_layers=1\", \"model.n_heads=2\", "
         "\"model.n_kv_heads=2\", \"model.d_ff=64\", \"model.context=32\", "
         "\"train.micro_batch=2\", "
         "\"train.eval_tokens=128\"]\n" +
         extra_head + "\n[[run]]\nname = \"llama\"\nconfig = \"" + llama +
         "\"\nlr = [1e-3, 1e-2]\n\n[[run]]\nname = \"cem\"\nconfig = \"" + cem +
         "\"\nset = [\"model.n_kv_heads=0\"]\nlr_from = \"llama\"\ntest_time_steps = [1, 2]\n\n"
         "[[claim]]\nid = \"C1\"\ntext = \"CEM beats Llama\"\na = \"cem\"\nb = \"llama\"\n\n"
         "[[claim]]\nid = \"C2\"\ntext = \"two steps beat one\"\na = [\"cem@T=2\"]\nb = "
         "\"cem@T=1\"\n"
         "test = \"not_worse\"\nmargin = 0.01\n" +
         tail;
}

std::string write_suite(const std::string& dir, const std::string& text) {
  const std::string path = dir + "/suite.toml";
  test::write_file(path, text);
  return path;
}

TEST(CompareSuite, ParsesRunsVariantsAndClaims) {
  const std::string dir = test::temp_dir("compare-suite");
  const Suite s = load_suite(write_suite(dir, tiny_suite("data/x")));
  EXPECT_EQ(s.name, "tiny");
  ASSERT_EQ(s.runs.size(), 2u);
  EXPECT_EQ(s.runs[0].lr, (std::vector<double>{1e-3, 1e-2}));
  EXPECT_EQ(s.runs[1].lr, (std::vector<double>{3e-3}));  // the suite's, unused: lr_from
  EXPECT_EQ(s.runs[1].lr_from, "llama");
  EXPECT_EQ(s.runs[0].seeds, (std::vector<uint64_t>{1, 2}));
  EXPECT_EQ(s.runs[0].tokens, 256);
  EXPECT_EQ(s.runs[1].sets.back(), "model.n_kv_heads=0");  // the run's after the suite's
  ASSERT_EQ(s.runs[1].variants.size(), 2u);
  EXPECT_EQ(s.runs[1].variants[1].name, "T=2");
  EXPECT_EQ(s.runs[1].variants[1].sets, (std::vector<std::string>{"model.cem.steps=2"}));
  ASSERT_EQ(s.claims.size(), 2u);
  EXPECT_EQ(s.claims[1].a, (std::vector<std::string>{"cem@T=2"}));
  EXPECT_EQ(s.claims[1].test, "not_worse");
  EXPECT_DOUBLE_EQ(s.claims[1].margin, 0.01);
  EXPECT_EQ(split_row("cem@T=2"), (std::pair<std::string, std::string>{"cem", "T=2"}));
}

TEST(CompareSuite, BadSuitesAreOneLineErrors) {
  const std::string dir = test::temp_dir("compare-bad");
  auto expect_bad = [&](const std::string& text, const std::string& needle) {
    const std::string path = write_suite(dir, text);
    try {
      load_suite(path);
      ADD_FAILURE() << "accepted a suite that should fail with '" << needle << "'";
    } catch (const Error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find(needle), std::string::npos) << what;
      EXPECT_EQ(what.find('\n'), std::string::npos) << what;
    }
  };
  const std::string good = tiny_suite("data/x");
  expect_bad(good + "\nbogus = 1\n", "unknown key 'bogus'");
  expect_bad(tiny_suite("data/x", "colour = 1"), "unknown key 'colour' in [suite]");
  expect_bad(tiny_suite("data/x", "",
                        "\n[[run]]\nname = \"llama\"\nconfig = \"" +
                            test::source_path("configs/tiny-llama.toml") + "\"\n"),
             "two runs named 'llama'");
  expect_bad(tiny_suite("data/x", "", "\n[[run]]\nname = \"x\"\nconfig = \"no/such.toml\"\n"),
             "config 'no/such.toml' not found");
  expect_bad(tiny_suite("data/x", "",
                        "\n[[claim]]\nid = \"C3\"\ntext = \"t\"\na = \"gpt\"\nb = \"llama\"\n"),
             "'gpt' names no run");
  expect_bad(tiny_suite("data/x", "",
                        "\n[[claim]]\nid = \"C3\"\ntext = \"t\"\na = \"cem@T=9\"\nb = \"cem\"\n"),
             "no test-time variant 'T=9'");
  expect_bad(tiny_suite("data/x", "",
                        "\n[[run]]\nname = \"y\"\nconfig = \"" +
                            test::source_path("configs/tiny-llama.toml") +
                            "\"\nset = [\"model.d_mdl=3\"]\n"),
             "d_mdl");
  expect_bad(
      tiny_suite(
          "data/x", "",
          "\n[[claim]]\nid = \"C3\"\ntext = \"t\"\na = \"cem\"\nb = \"llama\"\ntest = \"maybe\"\n"),
      "test 'maybe'");
  expect_bad("[suite]\nname = \"x\"\n", "no [[run]] tables");
  expect_bad("[suite\n", "TOML syntax");
  std::string no_search = good;
  no_search.replace(no_search.find("lr_search_tokens = 128\n"), 23, "");
  expect_bad(no_search, "needs [suite].lr_search_tokens");
  // Through the CLI: one line on stderr, non-zero exit.
  test::expect_one_line_error(
      test::run_cemfrac({"compare", "--suite", write_suite(dir, good + "\nx = 1\n")}),
      "unknown key 'x'");
  test::expect_one_line_error(test::run_cemfrac({"compare", "--suite", dir + "/none.toml"}),
                              "cannot read suite");
}

// ---- GP suites (task = "gp")
// -----------------------------------------------------------------------------------

// Two CEM runs (T = 1 with a learning-rate grid and test-time T = 1, 2; T = 2 taking T = 1's rate)
// and the Llama baseline; claims on test RMSE. Small enough for seconds: 3 steps x 2 sequences.
std::string gp_suite(const std::string& extra_gp = "", const std::string& tail = "") {
  return "[suite]\nname = \"gp-tiny\"\ndescription = \"GP test suite\"\nseeds = [1, 2]\n"
         "lr = [3e-3]\n\n[gp]\nsteps = 3\nsearch_steps = 2\nbatch = 2\nlayers = 1\n"
         "val_seqs = 4\ntest_seqs = 4\neval_seed = 5\n" +
         extra_gp +
         "\n[[run]]\nname = \"fixed-t1\"\ntask = \"gp\"\nvariant = \"fixed\"\nT = 1\n"
         "lr = [1e-3, 1e-2]\ntest_time_steps = [1, 2]\n\n"
         "[[run]]\nname = \"fixed-t2\"\ntask = \"gp\"\nT = 2\nlr_from = \"fixed-t1\"\n\n"
         "[[run]]\nname = \"llama\"\ntask = \"gp\"\nmodel = \"llama\"\nsteps = 2\nseeds = [1]\n\n"
         "[[claim]]\nid = \"G1\"\ntext = \"T = 2 beats T = 1\"\na = \"fixed-t2\"\nb = "
         "\"fixed-t1\"\n\n"
         "[[claim]]\nid = \"G2\"\ntext = \"two test-time steps are no worse\"\n"
         "a = \"fixed-t1@T=2\"\nb = \"fixed-t1@T=1\"\ntest = \"not_worse\"\nmargin = 0.01\n" +
         tail;
}

TEST(CompareSuite, ParsesGpRuns) {
  const std::string dir = test::temp_dir("compare-gp-suite");
  const Suite s = load_suite(write_suite(dir, gp_suite()));
  EXPECT_EQ(s.gp.steps, 3);
  EXPECT_EQ(s.gp.search_steps, 2);
  EXPECT_EQ(s.gp.batch, 2);
  EXPECT_EQ(s.gp.eval_seed, 5u);
  EXPECT_EQ(s.gp.threads, 1);  // the default
  ASSERT_EQ(s.runs.size(), 3u);
  EXPECT_EQ(s.runs[0].task, "gp");
  EXPECT_EQ(s.runs[0].gp.model, "cem");
  EXPECT_EQ(s.runs[0].gp.T, 1);
  EXPECT_EQ(s.runs[0].gp.steps, 3);
  ASSERT_EQ(s.runs[0].variants.size(), 2u);
  EXPECT_EQ(s.runs[0].variants[1].name, "T=2");
  EXPECT_EQ(s.runs[0].variants[1].cem_steps, 2);
  EXPECT_EQ(s.runs[1].gp.variant, "fixed");  // the default reading
  EXPECT_EQ(s.runs[1].gp.T, 2);
  EXPECT_EQ(s.runs[2].gp.model, "llama");
  EXPECT_EQ(s.runs[2].gp.steps, 2);  // the run's own budget
  EXPECT_EQ(s.runs[2].seeds, (std::vector<uint64_t>{1}));
  EXPECT_TRUE(s.has_task("gp"));
  EXPECT_FALSE(s.has_task("lm"));
  ASSERT_EQ(s.claims.size(), 2u);
  EXPECT_EQ(s.claims[0].metric, "test_rmse");  // the default for GP rows
  EXPECT_EQ(s.claims[1].metric, "test_rmse");
}

// The 1-based line of the first occurrence of `needle` in `text`.
int line_of(const std::string& text, const std::string& needle) {
  const size_t at = text.find(needle);
  EXPECT_NE(at, std::string::npos) << needle;
  return 1 + static_cast<int>(std::count(text.begin(), text.begin() + at, '\n'));
}

TEST(CompareSuite, BadGpSuitesAreOneLineErrorsWithTheLine) {
  const std::string dir = test::temp_dir("compare-gp-bad");
  auto expect_bad = [&](const std::string& text, const std::string& needle) {
    const std::string path = write_suite(dir, text);
    try {
      load_suite(path);
      ADD_FAILURE() << "accepted a suite that should fail with '" << needle << "'";
    } catch (const Error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find(needle), std::string::npos) << what;
      EXPECT_EQ(what.find('\n'), std::string::npos) << what;
    }
  };
  const int extra = line_of(gp_suite("depth = 3\n"), "depth");  // where extra_gp lands
  expect_bad(gp_suite("depth = 3\n"),
             fmt::format("suite.toml:{}: unknown key 'depth' in [gp]", extra));
  expect_bad(gp_suite("threads = 0\n"),
             fmt::format("suite.toml:{}: [gp].threads: expected an integer >= 1", extra));
  expect_bad(gp_suite("positions = \"rope\"\nthreads = 2000\n"),
             fmt::format("suite.toml:{}: [gp].threads: at most 1024", extra + 1));
  expect_bad(gp_suite("positions = \"learned\"\n"), "[gp].positions 'learned'");
  expect_bad(gp_suite("", "\n[[run]]\nname = \"x\"\ntask = \"gp\"\nconfig = \"a.toml\"\n"),
             "key 'config' is for task = \"lm\" runs");
  expect_bad(gp_suite("", "\n[[run]]\nname = \"x\"\ntask = \"gp\"\nT = 65\n"), ".T = 65");
  expect_bad(gp_suite("", "\n[[run]]\nname = \"x\"\ntask = \"gp\"\nT = 0\n"),
             "T: expected an integer >= 1");
  expect_bad(gp_suite("", "\n[[run]]\nname = \"x\"\ntask = \"lmm\"\n"), "task 'lmm'");
  expect_bad(gp_suite("", "\n[[run]]\nname = \"x\"\ntask = \"gp\"\nmodel = \"gpt\"\n"),
             "model 'gpt'");
  expect_bad(gp_suite("", "\n[[run]]\nname = \"x\"\ntask = \"gp\"\nmodel = \"llama\"\nT = 2\n"),
             "key 'T' is for CEM models");
  expect_bad(gp_suite("",
                      "\n[[claim]]\nid = \"G3\"\ntext = \"t\"\na = \"fixed-t2\"\nb = "
                      "\"fixed-t1\"\nmetric = \"test_loss\"\n"),
             "metric 'test_loss' for GP runs");
  expect_bad(gp_suite("",
                      "\n[[claim]]\nid = \"G3\"\ntext = \"t\"\na = \"fixed-t1@T=2\"\nb = "
                      "\"fixed-t1\"\nmetric = \"val_rmse\"\n"),
             "a test-time variant has only test_rmse");
  expect_bad(gp_suite("",
                      "\n[[claim]]\nid = \"G3\"\ntext = \"t\"\na = \"fixed-t2@T=4\"\nb = "
                      "\"fixed-t1\"\n"),
             "no test-time variant 'T=4'");
  std::string no_search = gp_suite();
  no_search.replace(no_search.find("search_steps = 2\n"), 17, "");
  expect_bad(no_search, "needs [gp].search_steps");
  std::string no_steps = gp_suite();
  no_steps.replace(no_steps.find("steps = 3\n"), 10, "");
  expect_bad(no_steps, "run 'fixed-t1': no step budget");
  // An LM key in a GP run and a GP key in an LM run, each with its line.
  const std::string lm =
      tiny_suite("data/x", "",
                 "\n[[run]]\nname = \"y\"\nconfig = \"" +
                     test::source_path("configs/tiny-llama.toml") + "\"\nvariant = \"iterate\"\n");
  const std::string lm_path = write_suite(dir, lm);
  try {
    load_suite(lm_path);
    ADD_FAILURE() << "accepted a GP key in an LM run";
  } catch (const Error& e) {
    const std::string what = e.what();
    const int line = line_of(lm, "variant = \"iterate\"");
    EXPECT_NE(
        what.find(fmt::format("suite.toml:{}: run 'y': key 'variant' is for task = \"gp\"", line)),
        std::string::npos)
        << what;
  }
  // A claim across tasks: a GP run against an LM run.
  const std::string mixed =
      tiny_suite("data/x", "",
                 "\n[[run]]\nname = \"g\"\ntask = \"gp\"\nsteps = 3\n\n[[claim]]\nid = \"M\"\n"
                 "text = \"t\"\na = \"g\"\nb = \"llama\"\n");
  expect_bad(mixed, "a claim compares runs of one task");
  // An unknown reading of the recursion is refused by compare (the variant names live in the GP
  // task), with the variant's line, before anything trains.
  const std::string bad_variant = gp_suite("",
                                           "\n[[run]]\nname = \"x\"\ntask = \"gp\"\n"
                                           "variant = \"iterate+proxx\"\nT = 2\n");
  const int vline = line_of(bad_variant, "variant = \"iterate+proxx\"");
  const std::string out = dir + "/out-bad-variant";
  test::expect_one_line_error(
      test::run_cemfrac({"compare", "--suite", write_suite(dir, bad_variant), "--out", out}),
      fmt::format("suite.toml:{}: run 'x': GP variant \"iterate+proxx\": unknown part \"proxx\"",
                  vline));
  EXPECT_FALSE(fs::exists(out + "/plan")) << "nothing may run before the suite is checked";
}

// ---- end to end
// ------------------------------------------------------------------------------------

std::string prepare_tiny_data(const std::string& root) {
  const std::string src = root + "/text";
  fs::create_directories(src);
  const char* words[] = {"the", "cat", "sat", "on", "a", "mat", "and", "dog", "ran", "far"};
  for (int d = 0; d < 20; ++d) {
    std::string text;
    for (int i = 0; i < 300; ++i)
      text += std::string(words[(i * 7 + d * 3 + i / 5) % 10]) + (i % 9 == 8 ? ".\n" : " ");
    test::write_file(fmt::format("{}/doc{:02d}.txt", src, d), text);
  }
  const std::string data = root + "/data";
  auto r = test::run_cemfrac(
      {"prepare", "--text", src, "--tokenizer", "byte", "--out", data, "--split", "80,10,10"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  return data;
}

int count(const std::string& text, const std::string& needle) {
  int n = 0;
  for (size_t p = text.find(needle); p != std::string::npos; p = text.find(needle, p + 1)) ++n;
  return n;
}

TEST(CompareCli, TinySuiteEndToEndThenReused) {
  const std::string root = test::temp_dir("compare-e2e");
  const std::string data = prepare_tiny_data(root);
  const std::string text = root + "/extra.txt";
  test::write_file(text, "the dog sat on the mat and the cat ran far.\n");
  const std::string suite = write_suite(root, tiny_suite(data));
  const std::string out = root + "/out";
  auto r = test::run_cemfrac(
      {"--threads", "1", "compare", "--suite", suite, "--out", out, "--eval-text", text});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("estimated time"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("timed now"), std::string::npos) << r.out;

  // The report names the commit the binary was built from (cemfrac --version), not the cwd's HEAD.
  const auto version = test::run_cemfrac({"--version"});
  const size_t at = version.out.find("(commit ");
  ASSERT_NE(at, std::string::npos) << version.out;
  const std::string commit = version.out.substr(at + 8, version.out.find(')', at) - at - 8);
  EXPECT_FALSE(commit.empty());

  const auto j = nlohmann::json::parse(test::read_file(out + "/results.json"));
  ASSERT_EQ(j["runs"].size(), 2u);
  EXPECT_EQ(j["runs"][0]["lr_search"].size(), 2u);
  const double lr = j["runs"][0]["lr"];
  EXPECT_TRUE(lr == 1e-3 || lr == 1e-2);
  EXPECT_EQ(j["runs"][1]["lr"].get<double>(), lr);  // lr_from
  for (const auto& run : j["runs"]) {
    EXPECT_EQ(run["tokens"], 256);
    ASSERT_EQ(run["seeds"].size(), 2u);
    for (const auto& s : run["seeds"]) {
      EXPECT_TRUE(s["test_loss"].is_number()) << s.dump();
      EXPECT_TRUE(s["text_loss"].contains("extra")) << s.dump();
      EXPECT_EQ(s["val_curve"].size(), 2u) << s.dump();
    }
  }
  // The two seeds differ (init and data order).
  EXPECT_NE(j["runs"][0]["seeds"][0]["test_loss"], j["runs"][0]["seeds"][1]["test_loss"]);
  EXPECT_EQ(j["runs"][1]["seeds"][0]["variant_loss"].size(), 2u);
  ASSERT_EQ(j["claims"].size(), 2u);
  EXPECT_EQ(j["claims"][0]["pairs"][0]["n"], 2);
  EXPECT_TRUE(j["claims"][0]["pairs"][0]["lo"].is_number());
  const std::string md = test::read_file(out + "/results.md");
  EXPECT_NE(md.find("| C1 | cem | llama |"), std::string::npos) << md;

  // Every plot parses and has one series per run (the steps plot: the run with CEM variants).
  const std::map<std::string, std::map<std::string, int>> want = {
      {"val_loss.svg", {{"llama", 2}, {"cem", 2}}},
      {"perplexity.svg", {{"test perplexity", 2}}},
      {"params_vs_perplexity.svg", {{"llama", 1}, {"cem", 1}}},
      {"cem_test_time_steps.svg", {{"cem", 2}}}};
  for (const auto& [file, series] : want)
    EXPECT_EQ(svg_series(test::read_file(out + "/plots/" + file)), series) << file;

  // Second invocation: nothing trains or evaluates again.
  const std::string log = out + "/final/llama/seed-1/train.log";
  const std::string before = test::read_file(log);
  const auto mtime = fs::last_write_time(out + "/final/llama/seed-1/metrics.jsonl");
  const std::string eval_before = test::read_file(out + "/final/cem/seed-2/eval.log");
  r = test::run_cemfrac(
      {"--threads", "1", "compare", "--suite", suite, "--out", out, "--eval-text", text});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(test::read_file(log), before);
  EXPECT_EQ(count(before, "== cemfrac"), 1);
  EXPECT_EQ(fs::last_write_time(out + "/final/llama/seed-1/metrics.jsonl"), mtime);
  EXPECT_EQ(test::read_file(out + "/final/cem/seed-2/eval.log"), eval_before);
  EXPECT_EQ(nlohmann::json::parse(test::read_file(out + "/results.json"))["runs"], j["runs"]);
  // Its plan says that nothing is left, and that the timings are an earlier invocation's.
  EXPECT_NE(r.out.find("left: 0s (2 of 2 grid runs and 4 of 4 final runs finished"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("2 of 2 timed by an earlier invocation and reused"), std::string::npos)
      << r.out;
  EXPECT_EQ(r.out.find("timed now"), std::string::npos) << r.out;
  EXPECT_EQ(j["provenance"]["commit"], commit) << j.dump();

  // Timings are reused only on the machine that took them (plan/machine.txt): timings from another
  // machine, or from an unrecorded one, are taken again; the final runs are not touched.
  const std::string marker = out + "/plan/machine.txt";
  const std::string here = test::read_file(marker);
  EXPECT_NE(here.find("hardware threads, BLAS core"), std::string::npos) << here;
  for (const std::string& other :
       {std::string("GenuineIntel Other CPU (90 CPU flags)\n"), std::string()}) {
    if (other.empty())
      fs::remove(marker);
    else
      test::write_file(marker, other);
    r = test::run_cemfrac({"--threads", "1", "compare", "--suite", suite, "--out", out,
                           "--eval-text", text, "--plan"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.out.find(other.empty() ? "were taken on a machine not recorded"
                                       : "were taken on another machine (GenuineIntel Other CPU"),
              std::string::npos)
        << r.out;
    EXPECT_NE(r.out.find("timed now"), std::string::npos) << r.out;
    EXPECT_EQ(test::read_file(marker), here);
    EXPECT_EQ(test::read_file(log), before);
  }
  r = test::run_cemfrac(
      {"--threads", "1", "compare", "--suite", suite, "--out", out, "--eval-text", text, "--plan"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("2 of 2 timed by an earlier invocation and reused"), std::string::npos)
      << r.out;
  EXPECT_EQ(r.out.find("timing again"), std::string::npos) << r.out;
  // A grid widened below its first value changes what llama's timing run trains at: that timing is
  // taken again (not refused as a result folder with other settings would be), cem's is reused.
  {
    std::string widened = tiny_suite(data);
    widened.replace(widened.find("lr = [1e-3, 1e-2]"), 17, "lr = [5e-4, 1e-3, 1e-2]");
    const std::string wider = test::temp_dir("compare-e2e-wider") + "/suite.toml";
    test::write_file(wider, widened);
    r = test::run_cemfrac({"--threads", "1", "compare", "--suite", wider, "--out", out,
                           "--eval-text", text, "--plan"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.out.find("plan: timing llama again: the suite changed their settings"),
              std::string::npos)
        << r.out;
    EXPECT_NE(r.out.find("1 of 2 timed by an earlier invocation and reused (cem;"),
              std::string::npos)
        << r.out;
    EXPECT_NE(test::read_file(out + "/plan/llama-t1/compare-run.json").find("0.0005"),
              std::string::npos);
    EXPECT_EQ(test::read_file(log), before);
    // And back: the suite restored, llama is timed at its old first value again.
    r = test::run_cemfrac({"--threads", "1", "compare", "--suite", suite, "--out", out,
                           "--eval-text", text, "--plan"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.out.find("plan: timing llama again"), std::string::npos) << r.out;
    EXPECT_EQ(test::read_file(out + "/plan/llama-t1/compare-run.json").find("0.0005"),
              std::string::npos);
  }

  // Each final run was evaluated as soon as it was trained (with --jobs 1: the first run's
  // evaluation is older than the last run's training), so a run's folder is finished on its own.
  EXPECT_LE(fs::last_write_time(out + "/final/llama/seed-1/eval-test.json"),
            fs::last_write_time(out + "/final/cem/seed-2/metrics.jsonl"));
  // Seed-major order: every run's first seed is trained and evaluated before any run's second
  // (run-major order would train llama seed 2 before cem seed 1).
  EXPECT_LE(fs::last_write_time(out + "/final/cem/seed-1/eval-test.json"),
            fs::last_write_time(out + "/final/llama/seed-2/metrics.jsonl"));

  // The suite kept without any checkpoint (as committed to a repository) is reused as it is.
  const std::string kept = root + "/kept";
  fs::copy(out, kept, fs::copy_options::recursive);
  int removed = 0;
  for (auto it = fs::recursive_directory_iterator(kept); it != fs::recursive_directory_iterator();
       ++it) {
    if (it->is_directory() && it->path().filename() == "checkpoints") {
      fs::remove_all(it->path());
      it.disable_recursion_pending();
      ++removed;
    }
  }
  ASSERT_GE(removed, 4);  // 4 final runs at least (and the grid and timing runs)
  // ... except one final run stopped midway: its folder has a summary that says so, metrics and a
  // log, but no checkpoint, and no evaluation.
  const std::string cut = kept + "/final/cem/seed-2";
  test::write_file(cut + "/summary.json", "{\"status\": \"interrupted\"}\n");
  for (const auto& e : fs::directory_iterator(cut))
    if (e.path().filename().string().rfind("eval-", 0) == 0) fs::remove(e.path());
  // --report runs nothing and says what it holds.
  r = test::run_cemfrac({"--threads", "1", "compare", "--suite", suite, "--out", kept, "--report",
                         "--eval-text", text});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("Partial report:** 3 of 4 final runs"), std::string::npos) << r.out;
  // The runs table counts the seeds finished: cem has 1 of its 2, llama both.
  {
    const std::string md = test::read_file(kept + "/results.md");
    const size_t cem_row = md.find("\n| cem | ");
    ASSERT_NE(cem_row, std::string::npos) << md;
    EXPECT_NE(md.substr(cem_row, md.find('\n', cem_row + 1) - cem_row).find(" | 1 of 2 | "),
              std::string::npos)
        << md;
    const size_t llama_row = md.find("\n| llama | ");
    ASSERT_NE(llama_row, std::string::npos) << md;
    EXPECT_EQ(md.substr(llama_row, md.find('\n', llama_row + 1) - llama_row).find(" of 2"),
              std::string::npos)
        << md;
  }
  EXPECT_EQ(r.out.find("estimated time"), std::string::npos) << r.out;
  const auto partial = nlohmann::json::parse(test::read_file(kept + "/results.json"));
  EXPECT_EQ(partial["provenance"]["final_runs_finished"], 3);
  EXPECT_EQ(partial["runs"][0]["seeds"], j["runs"][0]["seeds"]);
  EXPECT_TRUE(partial["runs"][1]["seeds"][1]["test_loss"].is_null());
  EXPECT_FALSE(fs::exists(cut + "/checkpoints"));
  // Going on: the stopped run starts again from step 0 in a clean folder (one trainer start in its
  // log, its metrics from step 1) and, with the same seed, ends where it ended the first time;
  // nothing else runs again.
  const std::string kept_log = test::read_file(kept + "/final/llama/seed-1/train.log");
  r = test::run_cemfrac(
      {"--threads", "1", "compare", "--suite", suite, "--out", kept, "--eval-text", text});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("(2 of 2 grid runs and 3 of 4 final runs finished"), std::string::npos)
      << r.out;
  EXPECT_EQ(count(test::read_file(cut + "/train.log"), "== cemfrac"), 1);
  EXPECT_EQ(test::read_file(kept + "/final/llama/seed-1/train.log"), kept_log);
  const auto again = nlohmann::json::parse(test::read_file(kept + "/results.json"));
  ASSERT_EQ(again["runs"].size(), j["runs"].size());
  for (size_t i = 0; i < j["runs"].size(); ++i)
    for (size_t k = 0; k < j["runs"][i]["seeds"].size(); ++k)
      for (const char* key :
           {"val_loss", "test_loss", "val_curve", "variant_loss", "text_loss", "diverged"})
        EXPECT_EQ(again["runs"][i]["seeds"][k][key], j["runs"][i]["seeds"][k][key])
            << i << " " << k << " " << key;
  EXPECT_EQ(again["provenance"]["final_runs_finished"], 4);
  EXPECT_EQ(test::read_file(kept + "/results.md").find("Partial report"), std::string::npos);
  // A trained run whose evaluation is missing and whose checkpoint is gone is a clear refusal.
  fs::remove_all(cut + "/checkpoints");
  fs::remove(cut + "/eval-test.json");
  test::expect_one_line_error(test::run_cemfrac({"--threads", "1", "compare", "--suite", suite,
                                                 "--out", kept, "--eval-text", text}),
                              "no checkpoint left to evaluate");

  // A changed budget is refused, naming the directory, rather than mixing settings.
  std::string changed = tiny_suite(data);
  changed.replace(changed.find("tokens = 256"), 12, "tokens = 320");
  test::expect_one_line_error(test::run_cemfrac({"--threads", "1", "compare", "--suite",
                                                 write_suite(root, changed), "--out", out}),
                              "other settings");
}

// A GP suite end to end: the grid chosen on validation RMSE at its short budget (the test set is
// not even drawn there), final runs per seed with the test set at the trained T and at each
// test-time T, claims on paired test RMSE, the report and the RMSE-against-T plot; then a second
// invocation reuses every finished GP run, and a changed budget is refused.
TEST(CompareCli, TinyGpSuiteEndToEndThenReused) {
  const std::string root = test::temp_dir("compare-gp-e2e");
  const std::string suite = write_suite(root, gp_suite());
  const std::string out = root + "/out";
  auto r = test::run_cemfrac({"--threads", "2", "--flush-denormal", "compare", "--suite", suite,
                              "--out", out, "--jobs", "2"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("estimated time"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("GP run"), std::string::npos) << r.out;
  // --flush-denormal reaches every job (a child starts in the CPU's default mode) and the report.
  EXPECT_NE(test::read_file(out + "/final/fixed-t1/seed-1/gp.log")
                .find("== cemfrac --threads 1 --flush-denormal gp --one"),
            std::string::npos);
  EXPECT_NE(
      test::read_file(out + "/results.md").find("cemfrac --threads 2 --flush-denormal compare"),
      std::string::npos);

  // Grid runs: validation only.
  for (const char* lr : {"0.001", "0.01"}) {
    const auto g = nlohmann::json::parse(
        test::read_file(fmt::format("{}/lr/fixed-t1/lr-{}/gp-run.json", out, lr)));
    EXPECT_EQ(g["train_steps"], 2);
    EXPECT_TRUE(g["val"]["rmse_posterior"].is_number()) << g.dump();
    EXPECT_TRUE(g["test"].is_null()) << g.dump();
  }
  const auto j = nlohmann::json::parse(test::read_file(out + "/results.json"));
  ASSERT_EQ(j["runs"].size(), 3u);
  const auto& t1 = j["runs"][0];
  EXPECT_EQ(t1["task"], "gp");
  EXPECT_EQ(t1["T"], 1);
  ASSERT_EQ(t1["lr_search"].size(), 2u);
  // The lower validation RMSE of the grid won.
  const double v_small = t1["lr_search"]["0.001"], v_large = t1["lr_search"]["0.01"];
  EXPECT_EQ(t1["lr"].get<double>(), v_small <= v_large ? 1e-3 : 1e-2);
  EXPECT_EQ(j["runs"][1]["lr"], t1["lr"]);  // lr_from
  EXPECT_EQ(j["runs"][2]["model"], "llama");
  EXPECT_EQ(j["runs"][2]["steps"], 2);
  EXPECT_EQ(j["runs"][2]["seeds"].size(), 1u);
  for (int i = 0; i < 2; ++i) {
    ASSERT_EQ(j["runs"][i]["seeds"].size(), 2u);
    for (const auto& s : j["runs"][i]["seeds"]) {
      EXPECT_TRUE(s["test_rmse"].is_number()) << s.dump();
      EXPECT_TRUE(s["val_rmse"].is_number()) << s.dump();
      EXPECT_TRUE(s["test_rmse_targets"].is_number()) << s.dump();
    }
  }
  // Seeds differ (init and training batches); validation and test are different sets.
  const auto& s1 = t1["seeds"][0];
  EXPECT_NE(s1["test_rmse"], t1["seeds"][1]["test_rmse"]);
  EXPECT_NE(s1["test_rmse"], s1["val_rmse"]);
  // Test-time T: at the trained T it is the run's own test RMSE; another T differs.
  ASSERT_EQ(s1["variant_rmse"].size(), 2u);
  EXPECT_EQ(s1["variant_rmse"]["T=1"], s1["test_rmse"]);
  EXPECT_NE(s1["variant_rmse"]["T=2"], s1["test_rmse"]);
  const auto final_run =
      nlohmann::json::parse(test::read_file(out + "/final/fixed-t1/seed-1/gp-run.json"));
  EXPECT_EQ(final_run["train_steps"], 3);
  EXPECT_EQ(final_run["eval_seed"], 5);
  EXPECT_EQ(final_run["test_seqs"], 4);

  ASSERT_EQ(j["claims"].size(), 2u);
  EXPECT_EQ(j["claims"][0]["metric"], "test_rmse");
  const auto& pair = j["claims"][0]["pairs"][0];
  EXPECT_EQ(pair["n"], 2);
  EXPECT_TRUE(pair["lo"].is_number());
  EXPECT_NEAR(pair["mean_diff"].get<double>(),
              (j["runs"][1]["seeds"][0]["test_rmse"].get<double>() -
               t1["seeds"][0]["test_rmse"].get<double>() +
               j["runs"][1]["seeds"][1]["test_rmse"].get<double>() -
               t1["seeds"][1]["test_rmse"].get<double>()) /
                  2,
              1e-12);
  const std::string verdict = j["claims"][0]["verdict"];
  EXPECT_TRUE(verdict == "supported" || verdict == "contradicted" || verdict == "inconclusive");
  EXPECT_EQ(j["claims"][1]["pairs"][0]["a_values"][0], s1["variant_rmse"]["T=2"]);

  const std::string md = test::read_file(out + "/results.md");
  EXPECT_NE(md.find("## GP runs"), std::string::npos) << md;
  EXPECT_NE(md.find("## GP learning-rate search"), std::string::npos) << md;
  EXPECT_NE(md.find("| G1 | fixed-t2 | fixed-t1 | test_rmse |"), std::string::npos) << md;
  EXPECT_EQ(md.find("## Runs"), std::string::npos) << "no LM runs, no LM table\n" << md;
  // The test-time table: a row per run with test-time steps, a column per T, the trained T bold.
  {
    std::vector<double> at1, at2;
    for (const auto& s : t1["seeds"]) {
      at1.push_back(s["variant_rmse"]["T=1"].get<double>());
      at2.push_back(s["variant_rmse"]["T=2"].get<double>());
    }
    const MeanSd m1 = mean_sd(at1), m2 = mean_sd(at2);
    const std::string row =
        fmt::format("| fixed-t1 | 1 | **{:.4f} ± {:.4f}** | {:.4f} ± {:.4f} |\n", m1.mean, m1.sd,
                    m2.mean, m2.sd);
    EXPECT_NE(md.find("| run | trained T | T = 1 | T = 2 |\n|---|---:|---:|---:|\n" + row),
              std::string::npos)
        << md;
  }
  // The plot: the fixed reading at its trained T = 1, 2; the T = 1 run evaluated at T = 1, 2; the
  // baseline as a flat line. No LM plots.
  EXPECT_EQ(svg_series(test::read_file(out + "/plots/gp_rmse_vs_T.svg")),
            (std::map<std::string, int>{{"fixed trained at T", 2},
                                        {"fixed-t1 (trained at T=1) evaluated at T", 2},
                                        {"llama (llama baseline)", 2}}));
  EXPECT_FALSE(fs::exists(out + "/plots/val_loss.svg"));

  // Second invocation: every GP run is reused (its log gets no second command line).
  const std::string log = out + "/final/fixed-t2/seed-2/gp.log";
  const std::string before = test::read_file(log);
  EXPECT_EQ(count(before, "== cemfrac"), 1);
  // Each GP job ran resumable (gp --one --checkpoint-dir <its folder>, GpSingle.Resumed*), and its
  // checkpoints were removed once its gp-run.json was kept.
  EXPECT_NE(before.find("--checkpoint-dir " + out + "/final/fixed-t2/seed-2"), std::string::npos)
      << before;
  EXPECT_FALSE(fs::exists(out + "/final/fixed-t2/seed-2/checkpoints"));
  EXPECT_FALSE(fs::exists(out + "/lr/fixed-t1/lr-0.001/checkpoints"));
  const auto mtime = fs::last_write_time(out + "/final/fixed-t2/seed-2/gp-run.json");
  r = test::run_cemfrac(
      {"--threads", "2", "compare", "--suite", suite, "--out", out, "--jobs", "2"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(test::read_file(log), before);
  EXPECT_EQ(fs::last_write_time(out + "/final/fixed-t2/seed-2/gp-run.json"), mtime);
  EXPECT_EQ(nlohmann::json::parse(test::read_file(out + "/results.json"))["runs"], j["runs"]);
  EXPECT_NE(r.out.find("3 of 3 timed by an earlier invocation and reused"), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("left: 0s (2 of 2 grid runs and 5 of 5 final runs finished"),
            std::string::npos)
      << r.out;

  // A changed GP budget is refused, naming the directory.
  std::string changed = gp_suite();
  changed.replace(changed.find("steps = 3\n"), 10, "steps = 4\n");
  test::expect_one_line_error(
      test::run_cemfrac({"--threads", "2", "compare", "--suite", write_suite(root, changed),
                         "--out", out, "--jobs", "2"}),
      "other settings");
}

// Ctrl-C while a GP job trains: the runner's last progress line does not count the stopped job
// among the finished ones (it resumes next time), and the message says how to resume.
TEST(CompareCli, InterruptedJobIsNotCountedFinished) {
  const std::string root = test::temp_dir("compare-gp-interrupt");
  const std::string suite =
      write_suite(root,
                  "[suite]\nname = \"gp-int\"\nseeds = [1]\nlr = [3e-3]\n\n[gp]\nsteps = 100000\n"
                  "batch = 2\nlayers = 1\nval_seqs = 4\ntest_seqs = 4\n\n"
                  "[[run]]\nname = \"long\"\ntask = \"gp\"\nT = 1\n");
  const std::string out = root + "/out";
  const std::string log = out + "/final/long/seed-1/gp.log";
  test::Background run({"--threads", "1", "compare", "--suite", suite, "--out", out}, root);
  ASSERT_TRUE(run.wait_for([&] {
    std::error_code ec;
    return std::filesystem::exists(log, ec) &&
           test::read_file(log).find("== binary:") != std::string::npos;
  })) << run.err();
  std::this_thread::sleep_for(std::chrono::seconds(1));  // the job is training by now
  EXPECT_NE(run.stop(SIGINT), 0);
  const std::string err = run.err();
  EXPECT_NE(err.find("interrupted: run the same command again to resume"), std::string::npos)
      << err;
  const size_t last = err.rfind("[gp-int final]");
  ASSERT_NE(last, std::string::npos) << err;
  const std::string line = err.substr(last, err.find('\n', last) - last);
  EXPECT_NE(line.find("| 0/1 jobs"), std::string::npos) << line;
}

// The children of `compare` by their parent pid (from /proc/<pid>/stat: "pid (comm) state ppid").
std::vector<pid_t> children_of(pid_t parent) {
  std::vector<pid_t> out;
  for (const auto& e : fs::directory_iterator("/proc")) {
    const std::string name = e.path().filename().string();
    if (name.empty() || !std::all_of(name.begin(), name.end(), ::isdigit)) continue;
    std::ifstream in(e.path().string() + "/stat");  // it may be gone by now: then it reads ""
    const std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const size_t close = stat.rfind(')');
    if (close == std::string::npos) continue;
    std::istringstream rest(stat.substr(close + 1));
    char state = 0;
    long ppid = 0;
    if (rest >> state >> ppid && ppid == parent) out.push_back(std::stoi(name));
  }
  return out;
}

// Whether `pid` still runs (a zombie waiting for its new parent to reap it does not).
bool process_runs(pid_t pid) {
  std::ifstream in(fmt::format("/proc/{}/stat", pid));
  const std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t close = stat.rfind(')');
  return close != std::string::npos && close + 2 < stat.size() && stat[close + 2] != 'Z' &&
         stat[close + 2] != 'X';
}

// A GP suite whose one job trains far longer than any test waits.
std::string long_gp_suite(const std::string& root, const std::string& name) {
  return write_suite(root, "[suite]\nname = \"" + name +
                               "\"\nseeds = [1]\nlr = [3e-3]\n\n[gp]\nsteps = 100000\n"
                               "batch = 2\nlayers = 1\nval_seqs = 4\ntest_seqs = 4\n\n"
                               "[[run]]\nname = \"long\"\ntask = \"gp\"\nT = 1\n");
}

// Waits until the long suite's final job has started (its log names the binary).
bool long_job_started(test::Background& run, const std::string& out) {
  const std::string log = out + "/final/long/seed-1/gp.log";
  return run.wait_for([&] {
    std::error_code ec;
    return fs::exists(log, ec) && test::read_file(log).find("== binary:") != std::string::npos;
  });
}

// One writer per suite folder: a second `compare` on the same --out while the first runs is
// refused with one line naming the first one's pid, and trains nothing there.
TEST(CompareCli, SecondCompareOnOneOutIsRefused) {
  const std::string root = test::temp_dir("compare-two-writers");
  const std::string suite = long_gp_suite(root, "two");
  const std::string out = root + "/out";
  test::Background first({"--threads", "1", "compare", "--suite", suite, "--out", out}, root);
  ASSERT_TRUE(long_job_started(first, out)) << first.err();
  const std::string log = test::read_file(out + "/final/long/seed-1/gp.log");
  test::expect_one_line_error(
      test::run_cemfrac({"--threads", "1", "compare", "--suite", suite, "--out", out}),
      fmt::format("{} is being written by another cemfrac process (pid {}, compare)", out,
                  first.pid));
  EXPECT_EQ(test::read_file(out + "/final/long/seed-1/gp.log"), log);  // no second job started
  first.stop(SIGKILL);
}

// A `compare` killed with SIGKILL (no chance to forward anything) takes its running job with it:
// no training goes on under PID 1 beside the next `compare`.
TEST(CompareCli, KilledCompareLeavesNoChild) {
  const std::string root = test::temp_dir("compare-kill");
  const std::string out = root + "/out";
  test::Background run(
      {"--threads", "1", "compare", "--suite", long_gp_suite(root, "kill"), "--out", out}, root);
  ASSERT_TRUE(long_job_started(run, out)) << run.err();
  std::vector<pid_t> children;
  ASSERT_TRUE(run.wait_for([&] {
    children = children_of(run.pid);
    return !children.empty();
  }));
  ASSERT_EQ(children.size(), 1u);
  const pid_t child = children[0];
  ASSERT_TRUE(process_runs(child));
  EXPECT_EQ(run.stop(SIGKILL), 128 + SIGKILL);
  bool gone = false;
  for (int i = 0; i < 1000 && !gone; ++i) {  // up to 10 s; the kernel kills it at once
    gone = !process_runs(child);
    if (!gone) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (!gone) ::kill(child, SIGKILL);  // leave nothing behind on failure
  EXPECT_TRUE(gone) << "the job " << child << " outlived its compare";
}

}  // namespace
}  // namespace cemfrac
