// The suite's results and report, called directly: seeds read back from run folders (LM and GP),
// their statistics in the runs table, a claim's paired interval and verdict computed by hand, and
// a partial report.
#include "cemfrac/compare/report.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "cemfrac/compare/results.h"
#include "cemfrac/compare/run_files.h"
#include "tests/test_util.h"

namespace cemfrac {
namespace {

using nlohmann::json;

// Writes `content` to `path`, creating its folders (as a child process would find them).
void put(const std::string& path, const std::string& content) {
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  test::write_file(path, content);
}

// Runs "a" and "b" (LM, 3 seeds, one learning rate each) and the GP runs "g" (CEM, T = 2, tested
// at T = 1 and 2) and "base" (Llama); claims a better than b, g not worse than base.
std::string report_suite(const std::string& dir) {
  const std::string llama = test::source_path("configs/tiny-llama.toml");
  return "[suite]\nname = \"r\"\ndescription = \"a report\"\ndata = \"" + dir +
         "/data\"\ntokens = 256\nseeds = [1, 2, 3]\nlr = [3e-3]\nlr_search_tokens = 128\n"
         "set = [\"model.d_model=32\", \"model.n_layers=1\", \"model.n_heads=2\", "
         "\"model.n_kv_heads=2\", \"model.d_ff=64\", \"model.context=32\", "
         "\"train.micro_batch=2\"]\n\n[gp]\nsteps = 10\n\n[[run]]\nname = \"a\"\nconfig = \"" +
         llama + "\"\n\n[[run]]\nname = \"b\"\nconfig = \"" + llama +
         "\"\n\n[[run]]\nname = \"g\"\ntask = \"gp\"\nT = 2\ntest_time_steps = [1, 2]\n\n"
         "[[run]]\nname = \"base\"\ntask = \"gp\"\nmodel = \"llama\"\n\n"
         "[[claim]]\nid = \"C1\"\ntext = \"a beats b\"\na = \"a\"\nb = \"b\"\n\n"
         "[[claim]]\nid = \"C2\"\ntext = \"g is as good\"\na = \"g\"\nb = \"base\"\n"
         "test = \"not_worse\"\nmargin = 0.01\n";
}

void lm_seed(const std::string& dir, double val, double test) {
  put(
      dir + "/summary.json",
      json{{"status", "completed"}, {"last_val_loss", val}, {"best_val_loss", val}}.dump());
  put(
      dir + "/metrics.jsonl",
      R"({"step": 1, "tokens": 64, "tokens_per_s": 100, "elapsed_s": 1})"
      "\n"
      R"({"step": 2, "tokens": 128, "tokens_per_s": 300, "elapsed_s": 2, "val_loss": )" +
          std::to_string(val) + "}\n");
  put(eval_path(dir, "test", ""),
                   json{{"mean_loss", test}, {"perplexity", std::exp(test)}}.dump());
}

void gp_seed(const std::string& dir, double test, const json& at_T = json::object()) {
  put(gp_result_path(dir), json{{"status", "completed"},
                                             {"train_s", 2.0},
                                             {"steps_done", 10},
                                             {"val", {{"rmse_posterior", test + 0.01}}},
                                             {"test", {{"rmse_posterior", test}}},
                                             {"test_at_T", at_T}}
                                            .dump());
}

struct Fixture {
  std::string out;
  Suite suite;
  std::vector<RunPlan> plans;
};

Fixture make(const std::string& tag, const std::string& edit_from = "",
             const std::string& edit_to = "") {
  Fixture f;
  f.out = test::temp_dir(tag);
  std::string text = report_suite(f.out);
  if (!edit_from.empty()) text.replace(text.find(edit_from), edit_from.size(), edit_to);
  put(f.out + "/suite.toml", text);
  f.suite = load_suite(f.out + "/suite.toml");
  for (const SuiteRun& r : f.suite.runs) {
    RunPlan p;
    p.run = &r;
    p.gp = r.task == SuiteTask::kGp;
    p.per_step = 64;
    p.params = 1234567;
    p.lr = 3e-3;
    f.plans.push_back(p);
  }
  return f;
}

const json provenance = {{"command", "c"}, {"final_runs", 12}, {"final_runs_finished", 12}};

TEST(CompareResults, SeedsReadBackFromTheirFolders) {
  Fixture f = make("results-read");
  const SuiteRun &a = f.suite.runs[0], &g = f.suite.runs[2];
  lm_seed(final_dir(f.out, a, 1), 3.5, 3.25);
  gp_seed(final_dir(f.out, g, 1), 0.4,
          {{"1", {{"rmse_posterior", 0.5}}}, {"2", {{"rmse_posterior", 0.4}}}});
  const SuiteResults r = collect_results(f.suite, f.plans, f.out);
  ASSERT_EQ(r.at("a").size(), 3u);
  const SeedResult& s = r.at("a")[0];
  EXPECT_EQ(s.seed, 1u);
  EXPECT_EQ(s.val_loss, 3.5);
  EXPECT_EQ(s.test_loss, 3.25);
  EXPECT_EQ(s.tokens_per_s, 200);  // the median of 100 and 300
  EXPECT_EQ(s.val_curve, (std::vector<std::pair<double, double>>{{128, 3.5}}));
  EXPECT_FALSE(r.at("a")[1].test_loss.has_value());  // not trained yet
  const SeedResult& gs = r.at("g")[0];
  EXPECT_EQ(gs.test_rmse, 0.4);
  EXPECT_EQ(gs.tokens_per_s, 5);  // steps per second
  EXPECT_EQ(gs.variant_loss.at("T=1"), 0.5);
  EXPECT_EQ(metric_of(gs, "test_rmse", "T=1"), 0.5);
  EXPECT_DOUBLE_EQ(*metric_of(gs, "val_rmse", ""), 0.41);
  EXPECT_EQ(metric_of(s, "test_loss", ""), 3.25);
}

TEST(CompareReport, SeedStatisticsIntoTablesAndClaims) {
  Fixture f = make("report-claims");
  const SuiteRun &a = f.suite.runs[0], &b = f.suite.runs[1], &g = f.suite.runs[2],
                 &base = f.suite.runs[3];
  const double ta[] = {3.0, 3.1, 3.2}, tb[] = {3.5, 3.5, 3.7};
  for (int i = 0; i < 3; ++i) {
    lm_seed(final_dir(f.out, a, i + 1), 3.4, ta[i]);
    lm_seed(final_dir(f.out, b, i + 1), 3.6, tb[i]);
    gp_seed(final_dir(f.out, g, i + 1), 0.40 + 0.01 * i,
            {{"1", {{"rmse_posterior", 0.5}}}, {"2", {{"rmse_posterior", 0.40 + 0.01 * i}}}});
    gp_seed(final_dir(f.out, base, i + 1), 0.45);
  }
  const Report rep =
      make_report(f.suite, f.plans, collect_results(f.suite, f.plans, f.out), 1000, provenance);
  const std::string& md = rep.markdown;
  // a's test loss: mean 3.1, sample sd 0.1.
  EXPECT_NE(md.find("| a | 1,234,567 | 256 (0.26) | 3 | 0.003 | 3.400 ± 0.000 | 3.100 ± 0.100 |"),
            std::string::npos)
      << md;
  // C1: d = (-0.5, -0.4, -0.5): mean -0.46667, sd 0.057735; t(0.975, 2) = 4.302653, so the
  // half-width is 4.302653 * 0.057735 / sqrt(3) = 0.143422: [-0.61009, -0.32324], below 0.
  EXPECT_NE(md.find("| C1 | a | b | test_loss | better | -0.4667 | [-0.6101, -0.3232] | 3 | "
                    "supported |"),
            std::string::npos)
      << md;
  const json& c1 = rep.results["claims"][0];
  EXPECT_EQ(c1["verdict"], "supported");
  EXPECT_EQ(c1["pairs"][0]["seeds"], json({1, 2, 3}));
  EXPECT_NEAR(c1["pairs"][0]["lo"].get<double>(), -0.466667 - 0.143422, 1e-5);
  EXPECT_NEAR(c1["pairs"][0]["hi"].get<double>(), -0.466667 + 0.143422, 1e-5);
  // C2 on GP test RMSE: d = (-0.05, -0.04, -0.03), the interval lies below +0.01.
  EXPECT_EQ(rep.results["claims"][1]["verdict"], "supported");
  EXPECT_EQ(rep.results["claims"][1]["metric"], "test_rmse");
  // GP tables: the run's test RMSE and, bold, the trained T's column of the test-time table.
  EXPECT_NE(md.find("| g | cem | fixed | 2 | 1,234,567 | 10 | 3 | 0.003 | 0.4200 ± 0.0100 | "
                    "0.4100 ± 0.0100 |"),
            std::string::npos)
      << md;
  EXPECT_NE(md.find("| g | 2 | 0.5000 ± 0.0000 | **0.4100 ± 0.0100** |"), std::string::npos) << md;
  EXPECT_EQ(md.find("Partial report"), std::string::npos);
  // One depth, the models' own FFNs: said once, no per-run keys.
  EXPECT_NE(md.find("sequences per step, L = 2, positions none;"), std::string::npos) << md;
  EXPECT_FALSE(rep.results["runs"][2].contains("layers"));
  EXPECT_FALSE(rep.results["runs"][2].contains("ffn"));
  for (const char* plot :
       {"gp_rmse_vs_T.svg", "val_loss.svg", "perplexity.svg", "params_vs_perplexity.svg"})
    EXPECT_EQ(rep.plots.count(plot), 1u) << plot;
}

TEST(CompareReport, PartialReportSaysWhatItHolds) {
  Fixture f = make("report-partial");
  const SuiteRun &a = f.suite.runs[0], &b = f.suite.runs[1];
  lm_seed(final_dir(f.out, a, 1), 3.4, 3.0);
  lm_seed(final_dir(f.out, b, 1), 3.4, 3.5);
  const json part = {{"command", "c"}, {"final_runs", 12}, {"final_runs_finished", 2}};
  const Report rep =
      make_report(f.suite, f.plans, collect_results(f.suite, f.plans, f.out), 1000, part);
  EXPECT_NE(rep.markdown.find("**Partial report:** 2 of 12 final runs"), std::string::npos);
  EXPECT_EQ(rep.markdown.find("**Died:**"), std::string::npos);
  json died = part;
  died["runs_died"] = {"final/a/seed-2", "lr/b/lr-0.003"};
  const Report rep_died =
      make_report(f.suite, f.plans, collect_results(f.suite, f.plans, f.out), 1000, died);
  EXPECT_NE(rep_died.markdown.find("**Died:** `final/a/seed-2`, `lr/b/lr-0.003` (summary.json "
                                   "says running, but no process holds the run"),
            std::string::npos)
      << rep_died.markdown;
  EXPECT_NE(rep.markdown.find("| a | 1,234,567 | 256 (0.26) | 1 of 3 |"), std::string::npos)
      << rep.markdown;
  // One seed in common: no interval, inconclusive.
  const json& c1 = rep.results["claims"][0];
  EXPECT_EQ(c1["verdict"], "inconclusive");
  EXPECT_EQ(c1["pairs"][0]["n"], 1);
  EXPECT_TRUE(c1["pairs"][0]["lo"].is_null());
}

// GP runs of several depths, attention-only: the text says so and results.json gives each run's.
TEST(CompareReport, GpDepthAndFfnByRun) {
  Fixture f = make("report-gp-depth", "[gp]\nsteps = 10\n", "[gp]\nsteps = 10\nffn = \"none\"\n");
  Fixture g =
      make("report-gp-depth2", "T = 2\ntest_time_steps", "T = 2\nlayers = 1\ntest_time_steps");
  const Report uniform =
      make_report(f.suite, f.plans, collect_results(f.suite, f.plans, f.out), 1000, provenance);
  EXPECT_NE(uniform.markdown.find("L = 2, attention-only (ffn = none), positions none"),
            std::string::npos)
      << uniform.markdown;
  EXPECT_EQ(uniform.results["runs"][2]["ffn"], "none");
  EXPECT_FALSE(uniform.results["runs"][2].contains("layers"));
  const Report mixed =
      make_report(g.suite, g.plans, collect_results(g.suite, g.plans, g.out), 1000, provenance);
  EXPECT_NE(mixed.markdown.find("L = 1 or 2 by run (results.json: \"layers\"), positions none"),
            std::string::npos)
      << mixed.markdown;
  EXPECT_EQ(mixed.results["runs"][2]["layers"], 1);
  EXPECT_EQ(mixed.results["runs"][3]["layers"], 2);
}

}  // namespace
}  // namespace cemfrac
