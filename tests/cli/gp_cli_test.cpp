// cemfrac gp: bad flags are one-line errors; a tiny run prints the JSON rows and writes gp.json and
// the SVG plot into --out.
#include <gtest/gtest.h>
#include <signal.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "cemfrac/tasks/gp_experiment.h"
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
  EXPECT_EQ(test::read_file(out + "/gp-rmse.svg").rfind("<?xml", 0), 0u);
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
  // Attention-only: --ffn none reaches the model (fewer parameters, named in the result).
  r = test::run_cemfrac({"gp", "--one", "--variants", "iterate", "--steps", "2", "--ffn", "none",
                         "--train-steps", "2", "--batch", "2", "--val-seqs", "4", "--eval-seqs",
                         "4"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json attn = nlohmann::json::parse(r.out);
  EXPECT_EQ(attn["ffn"], "none");
  EXPECT_EQ(attn["mixer"], "cem_attention");
  EXPECT_LT(attn["params"].get<int64_t>(), j["params"].get<int64_t>());
  test::expect_one_line_error(test::run_cemfrac({"gp", "--one", "--steps", "2", "--ffn", "gelu"}),
                              "--ffn");

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

// Ctrl-C on a resumable `gp --one --checkpoint-dir` (as `cemfrac compare` runs it) saves a
// checkpoint and exits 3 with one line, as `train` does (the same trainer); the same command
// resumes from it, and the result equals an uninterrupted run's bit for bit.
TEST(GpCli, LastLoggedStepReadsOnlyProgressLines) {
  EXPECT_EQ(last_logged_step(""), 0);
  EXPECT_EQ(last_logged_step("gp cem fixed T=8: resumed from d/checkpoints/step-002000 (step "
                             "2000/4000)\n"),
            0);
  const std::string log =
      "gp cem fixed T=8: step 2400/4000 | mse 0.1 | lr 1e-3 | norm 1 | 2.0 steps/s | ETA 1m\n"
      "gp cem fixed T=8: step 2800/4000 | mse 0.1 | lr 1e-3 | norm 1 | 2.0 steps/s | ETA 1m\n";
  EXPECT_EQ(last_logged_step(log), 2800);
  // A line still being written (no "/" yet) is skipped for the one before it.
  EXPECT_EQ(last_logged_step(log + "gp cem fixed T=8: step 32"), 2800);
  EXPECT_EQ(last_logged_step(log + "gp cem fixed T=8: interrupted at step 2950/4000; checkpoint "
                                   "d\n"),
            2800);
}

TEST(GpCli, InterruptedOneResumesBitForBit) {
  const std::string dir = test::temp_dir("gp_cli_resume");
  const std::vector<std::string> args = {
      "--threads",     "1",   "gp",      "--one", "--steps",    "1", "--layers",    "1",
      "--train-steps", "300", "--batch", "2",     "--val-seqs", "4", "--eval-seqs", "4",
      "--eval-steps",  "1,2"};
  const test::RunResult plain = test::run_cemfrac(args);
  ASSERT_EQ(plain.exit_code, 0) << plain.err;
  const nlohmann::json p = nlohmann::json::parse(plain.out);
  EXPECT_EQ(p["resumed_from_step"], 0);
  // Its progress lines, as `cemfrac compare` follows them: every tenth of the steps, the last.
  EXPECT_EQ(last_logged_step(plain.err), 300) << plain.err;
  const size_t first = plain.err.find("\n", plain.err.find(": step "));
  EXPECT_EQ(last_logged_step(plain.err.substr(0, first)), 30) << plain.err;

  std::vector<std::string> resumable = args;
  resumable.insert(resumable.end(), {"--checkpoint-dir", dir + "/run"});
  const std::filesystem::path checkpoints = dir + "/run/checkpoints";
  {
    test::Background run(resumable, dir);
    ASSERT_TRUE(run.wait_for([&] { return test::has_complete_checkpoint(checkpoints); }))
        << run.err();
    EXPECT_EQ(run.stop(SIGINT), 3) << run.err();
    const std::string err = run.err();
    EXPECT_NE(err.find("cemfrac: gp cem fixed T=1: interrupted at step "), std::string::npos)
        << err;
    EXPECT_NE(err.find("run the same command again to resume"), std::string::npos) << err;
  }
  const test::RunResult resumed = test::run_cemfrac(resumable);
  ASSERT_EQ(resumed.exit_code, 0) << resumed.err;
  const nlohmann::json r = nlohmann::json::parse(resumed.out);
  EXPECT_GT(r["resumed_from_step"].get<int64_t>(), 0) << resumed.err;
  EXPECT_LT(r["resumed_from_step"].get<int64_t>(), 300) << resumed.err;
  EXPECT_NE(resumed.err.find("resumed from"), std::string::npos) << resumed.err;
  // "resumed from DIR (step k/300)" is not a progress line.
  const std::string resumed_line =
      resumed.err.substr(0, resumed.err.find("\n", resumed.err.find("resumed from")));
  EXPECT_EQ(last_logged_step(resumed_line), 0) << resumed.err;
  EXPECT_EQ(last_logged_step(resumed.err), 300) << resumed.err;
  // Everything but the timings.
  auto results = [](nlohmann::json j) {
    nlohmann::json out;
    for (const char* key : {"status", "steps_done", "params", "last_train_mse", "val", "test"}) {
      out[key] = j[key];
      if (out[key].is_object()) out[key].erase("eval_s");
    }
    for (auto& [T, e] : j["test_at_T"].items()) out["test_at_T"][T] = e["rmse_posterior"];
    return out;
  };
  EXPECT_EQ(results(r), results(p));
  EXPECT_TRUE(results(p)["last_train_mse"].is_number());
}

}  // namespace
}  // namespace cemfrac
