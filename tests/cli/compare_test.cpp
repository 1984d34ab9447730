// cemfrac compare end to end: tiny language-model and GP suites whose second invocation reuses
// every finished run instead of training it again, their plots read back, an interrupted job, a
// second compare on one folder, a killed compare. (Suite parsing, statistics and the plotter have
// their tests beside their code: tests/compare/, tests/io/plot_test.cpp.)
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
#include "tests/compare/suite_fixtures.h"
#include "tests/svg_check.h"
#include "tests/test_util.h"

namespace cemfrac {
namespace {

namespace fs = std::filesystem;
using test::gp_suite;
using test::svg_series;
using test::tiny_suite;
using test::write_suite;

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

// Downstream jobs ([suite].tasks, [[finetune]]): every final LM run is scored on a zero-shot task and
// fine-tuned at two seeds right after its training, while its checkpoint exists; the report's
// downstream table and the claims on task_error / finetune_error read those files, with the values
// the claims compare being exactly 1 - accuracy (the mean over fine-tuning seeds); a second
// invocation runs nothing again, and a fine-tuning whose result is lost runs again alone.
TEST(CompareCli, DownstreamJobsFollowTrainingAndFeedTheirClaims) {
  const std::string root = test::temp_dir("compare-downstream");
  const std::string data = prepare_tiny_data(root);
  const std::string task = root + "/mc.jsonl";
  test::write_file(task,
                   "{\"context\": \"the cat\", \"choices\": [\" sat\", \" far\"], \"gold\": 0}\n"
                   "{\"context\": \"a dog\", \"choices\": [\" ran\", \" the\"], \"gold\": 0}\n"
                   "{\"context\": \"on a\", \"choices\": [\" mat\", \" ran\"], \"gold\": 0}\n");
  const std::string tail =
      "\n[[finetune]]\nname = \"genre\"\ntask = \"brown-genre\"\nseeds = [1, 2]\nepochs = 0.002\n"
      "batch = 4\nmax_len = 32\n\n"
      "[[claim]]\nid = \"D1\"\ntext = \"fine-tunes better\"\na = \"cem\"\nb = \"llama\"\n"
      "metric = \"finetune_error:genre\"\n\n"
      "[[claim]]\nid = \"D2\"\ntext = \"zero-shot better\"\na = \"cem\"\nb = \"llama\"\n"
      "metric = \"task_error:mc\"\n";
  const std::string suite = write_suite(root, tiny_suite(data, "tasks = [\"" + task + "\"]", tail));
  const std::string out = root + "/out";
  auto r = test::run_cemfrac({"--threads", "1", "compare", "--suite", suite, "--out", out});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (const char* run : {"llama", "cem"})
    for (int seed : {1, 2}) {
      const std::string dir = fmt::format("{}/final/{}/seed-{}", out, run, seed);
      EXPECT_TRUE(fs::exists(dir + "/task-mc.json")) << dir;
      EXPECT_TRUE(fs::exists(dir + "/ft-genre/compare-run.json")) << dir;
      for (int k : {1, 2}) {
        const auto ft = nlohmann::json::parse(
            test::read_file(fmt::format("{}/ft-genre/seed-{}/finetune.json", dir, k)));
        EXPECT_EQ(ft["task"], "brown-genre");
        EXPECT_EQ(ft["settings"]["seed"], k);
        EXPECT_EQ(ft["pretrained"].get<std::string>().rfind(dir, 0), 0u) << ft.dump();
      }
    }
  const auto j = nlohmann::json::parse(test::read_file(out + "/results.json"));
  // The claims' values are 1 - acc of the zero-shot task, and 1 - the mean fine-tuning accuracy.
  std::map<std::string, std::vector<double>> task_err, ft_err;
  for (const auto& run : j["runs"]) {
    for (const auto& s : run["seeds"]) {
      ASSERT_TRUE(s["task_acc"].contains("mc")) << s.dump();
      task_err[run["name"]].push_back(1 - s["task_acc"]["mc"].get<double>());
      ASSERT_EQ(s["finetune_acc"]["genre"].size(), 2u) << s.dump();
      ft_err[run["name"]].push_back(1 - (s["finetune_acc"]["genre"][0].get<double>() +
                                         s["finetune_acc"]["genre"][1].get<double>()) /
                                            2);
    }
  }
  ASSERT_EQ(j["claims"].size(), 4u);
  for (const auto& c : j["claims"]) {
    if (c["id"] != "D1" && c["id"] != "D2") continue;
    const auto& want = c["id"] == "D1" ? ft_err : task_err;
    const auto& pair = c["pairs"][0];
    EXPECT_EQ(pair["n"], 2) << c.dump();
    for (size_t i = 0; i < 2; ++i) {
      EXPECT_DOUBLE_EQ(pair["a_values"][i].get<double>(), want.at("cem")[i]) << c.dump();
      EXPECT_DOUBLE_EQ(pair["b_values"][i].get<double>(), want.at("llama")[i]) << c.dump();
    }
  }
  const std::string md = test::read_file(out + "/results.md");
  EXPECT_NE(md.find("## Downstream"), std::string::npos) << md;
  EXPECT_NE(md.find("| ft genre (brown-genre, 2 seeds) |"), std::string::npos) << md;
  // The floors: the task file's chance (1/2 for two choices) and brown-genre's majority class.
  const double majority = nlohmann::json::parse(test::read_file(
      out + "/final/cem/seed-1/ft-genre/seed-1/finetune.json"))["evals"]["test"]["majority"];
  EXPECT_NE(
      md.find(fmt::format("Floors: mc chance 0.500; ft genre majority class {:.3f}.", majority)),
      std::string::npos)
      << md;
  EXPECT_NE(md.find("error rate, 1 − accuracy"), std::string::npos) << md;
  EXPECT_EQ(j["provenance"]["final_runs_finished"], 4) << j["provenance"].dump();

  // Nothing runs again; then a lost fine-tuning result runs again alone.
  const std::string ft_log = out + "/final/cem/seed-2/ft-genre/seed-1.log";
  const std::string before = test::read_file(ft_log);
  r = test::run_cemfrac({"--threads", "1", "compare", "--suite", suite, "--out", out});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(test::read_file(ft_log), before);
  EXPECT_NE(r.out.find("left: 0s"), std::string::npos) << r.out;
  fs::remove(out + "/final/cem/seed-2/ft-genre/seed-1/finetune.json");
  const std::string other_log = test::read_file(out + "/final/llama/seed-1/ft-genre/seed-1.log");
  r = test::run_cemfrac({"--threads", "1", "compare", "--suite", suite, "--out", out});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(fs::exists(out + "/final/cem/seed-2/ft-genre/seed-1/finetune.json"));
  EXPECT_EQ(count(test::read_file(ft_log), "== cemfrac"), 2);
  EXPECT_EQ(test::read_file(out + "/final/llama/seed-1/ft-genre/seed-1.log"), other_log);
  EXPECT_EQ(nlohmann::json::parse(test::read_file(out + "/results.json"))["claims"], j["claims"]);

  // Other fine-tuning settings for the same folders are refused, naming the record.
  std::string changed = tiny_suite(data, "tasks = [\"" + task + "\"]", tail);
  changed.replace(changed.find("epochs = 0.002"), 14, "epochs = 0.003");
  test::expect_one_line_error(test::run_cemfrac({"--threads", "1", "compare", "--suite",
                                                 write_suite(root, changed), "--out", out}),
                              "ft-genre was trained with other settings");
}

}  // namespace
}  // namespace cemfrac
