// cemfrac gp: bad flags are one-line errors; a tiny run prints the JSON rows and writes gp.json and
// the SVG plot into --out.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "tests/test_util.h"

namespace cemfrac {
namespace {

TEST(GpCli, BadFlagsAreOneLineErrors) {
  test::RunResult r = test::run_cemfrac({"gp", "--steps", "0"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("--steps"), std::string::npos) << r.err;
  r = test::run_cemfrac({"gp", "--positions", "learned"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("--positions"), std::string::npos) << r.err;
  r = test::run_cemfrac({"gp", "--train-steps", "many"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("--train-steps"), std::string::npos) << r.err;
}

TEST(GpCli, TinyRunWritesJsonAndPlot) {
  const std::string out = test::temp_dir("gp_cli") + "/run";
  test::RunResult r =
      test::run_cemfrac({"gp", "--steps", "1,2", "--train-steps", "2", "--batch", "2",
                         "--eval-seqs", "4", "--scale-from", "1", "--out", out, "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  // cem T=1, cem T=2, T=1 model run at T=2, the baseline, the oracle.
  ASSERT_EQ(j["rows"].size(), 5u);
  EXPECT_EQ(j["rows"][2]["train_T"], 1);
  EXPECT_EQ(j["rows"][2]["eval_T"], 2);
  EXPECT_EQ(j["rows"][4]["model"], "oracle");
  EXPECT_GT(j["rows"][0]["params"].get<int64_t>(), 0);
  EXPECT_EQ(nlohmann::json::parse(test::read_file(out + "/gp.json")), j);
  EXPECT_EQ(test::read_file(out + "/gp-rmse.svg").rfind("<svg", 0), 0u);
  // Progress lines go to stderr, one per training at least.
  EXPECT_NE(r.err.find("cem T=2: step 2/2"), std::string::npos) << r.err;
}

// --one: one model as one JSON object (the GP job of cemfrac compare); its flag mistakes are
// one-line errors.
TEST(GpCli, OneModelPrintsItsJson) {
  const std::string out = test::temp_dir("gp_cli_one") + "/run";
  test::RunResult r = test::run_cemfrac({"gp", "--one", "--variants", "iterate", "--steps", "2",
                                         "--eval-steps", "1,2", "--train-steps", "2", "--batch",
                                         "2", "--val-seqs", "4", "--eval-seqs", "4", "--out", out});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["status"], "completed");
  EXPECT_EQ(j["train_T"], 2);
  EXPECT_EQ(j["steps_done"], 2);
  EXPECT_TRUE(j["val"]["rmse_posterior"].is_number());
  EXPECT_EQ(j["test_at_T"].size(), 2u);
  EXPECT_EQ(j["test_at_T"]["2"], j["test"]);
  EXPECT_NE(j["test_at_T"]["1"], j["test"]);
  EXPECT_EQ(nlohmann::json::parse(test::read_file(out + "/gp-run.json")), j);

  test::expect_one_line_error(test::run_cemfrac({"gp", "--one", "--steps", "1,2"}),
                              "one --steps value");
  test::expect_one_line_error(
      test::run_cemfrac({"gp", "--one", "--model", "llama", "--steps", "2"}), "are for CEM");
  test::expect_one_line_error(
      test::run_cemfrac({"gp", "--one", "--steps", "2", "--variants", "proxx"}),
      "unknown part \"proxx\"");
  r = test::run_cemfrac({"gp", "--model", "llama"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("--one"), std::string::npos) << r.err;
  r = test::run_cemfrac({"gp", "--one", "--quick", "--steps", "1"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("--quick"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace cemfrac
