// Checkpoints under faults and races: the parts of one checkpoint are
// bound together (save id, directory step), rotation converges after a removal cut short,
// summary.json is true while a run goes, and a reader racing a writer that rotates its
// checkpoints away reads the newest complete one or says the one it was given was rotated away.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>

#include "tests/reliability/reliability_util.h"
#include "tests/test_util.h"

namespace cemfrac {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using test::expect_one_line_error;
using test::run_cemfrac;

std::set<std::string> checkpoint_names(const std::string& run) {
  std::set<std::string> names;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(run + "/checkpoints", ec))
    names.insert(e.path().filename().string());
  return names;
}

std::string step_dir(const std::string& run, int step) {
  return run + "/checkpoints/" + fmt::format("step-{:06d}", step);
}

TEST(CheckpointParts, APartOfAnotherSaveOrAnotherStepIsRefused) {
  const std::string dir = test::temp_dir("rel-parts");
  const std::string a = dir + "/a", b = dir + "/b";
  ASSERT_EQ(run_cemfrac(rel::train_args(rel::write_config(dir, a, 2))).exit_code, 0);
  ASSERT_EQ(run_cemfrac(rel::train_args(rel::write_config(dir, b, 2), {"--set", "train.seed=7"}))
                .exit_code,
            0);
  const std::string config5 = rel::write_config(dir, a, 5);

  // Run B's optimizer state (same shapes) dropped into run A's checkpoint.
  const std::string victim = step_dir(a, 2);
  const std::string saved = test::read_file(victim + "/optimizer.safetensors");
  fs::copy_file(step_dir(b, 2) + "/optimizer.safetensors", victim + "/optimizer.safetensors",
                fs::copy_options::overwrite_existing);
  expect_one_line_error(run_cemfrac(rel::train_args(config5, {"--resume", victim})),
                        victim + "/optimizer.safetensors belongs to another checkpoint");
  test::write_file(victim + "/optimizer.safetensors", saved);
  // Its weights, for a reader too.
  const std::string weights = test::read_file(victim + "/model.safetensors");
  fs::copy_file(step_dir(b, 2) + "/model.safetensors", victim + "/model.safetensors",
                fs::copy_options::overwrite_existing);
  expect_one_line_error(
      run_cemfrac({"eval", "--checkpoint", victim, "--data", rel::data_dir() + ":val"}),
      "model.safetensors belongs to another checkpoint");
  test::write_file(victim + "/model.safetensors", weights);

  // trainer.json of another step inside step-000002.
  const std::string trainer = test::read_file(victim + "/trainer.json");
  json t = json::parse(trainer);
  t["step"] = 1000;
  test::write_file(victim + "/trainer.json", t.dump(2));
  expect_one_line_error(run_cemfrac(rel::train_args(config5, {"--resume", victim})),
                        "trainer.json says step 1000 but the directory is step-000002");
  test::write_file(victim + "/trainer.json", trainer);
  const test::RunResult ok = run_cemfrac(rel::train_args(config5, {"--resume", a}));
  EXPECT_EQ(ok.exit_code, 0) << ok.err;
}

TEST(CheckpointRotation, ConvergesAfterARemovalCutShort) {
  const std::string dir = test::temp_dir("rel-rotation");
  const std::string run = dir + "/run";
  const std::vector<std::string> keep2 = {"--set", "train.keep_checkpoints=2"};
  ASSERT_EQ(run_cemfrac(rel::train_args(rel::write_config(dir, run, 3), keep2)).exit_code, 0);
  // What a SIGKILL during the removal of step 1 used to leave: a step-N missing some of its parts.
  fs::create_directories(step_dir(run, 1));
  fs::copy_file(step_dir(run, 2) + "/config.json", step_dir(run, 1) + "/config.json");
  fs::copy_file(step_dir(run, 2) + "/model.safetensors", step_dir(run, 1) + "/model.safetensors");
  // And a temporary of a removal under the new scheme, of a process that is gone.
  fs::create_directories(step_dir(run, 2) + ".tmp-999999999-abc.old");
  ASSERT_EQ(checkpoint_names(run).size(), 4u);
  const test::RunResult r = run_cemfrac(rel::train_args(
      rel::write_config(dir, run, 5), {"--set", "train.keep_checkpoints=2", "--resume", run}));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(checkpoint_names(run), (std::set<std::string>{"step-000004", "step-000005"}));
}

TEST(CheckpointRotation, SummaryIsTrueAtEveryCheckpoint) {
  const std::string dir = test::temp_dir("rel-summary");
  const std::string run = dir + "/run";
  test::Background p(rel::train_args(rel::write_config(dir, run, 100000)), dir);
  ASSERT_TRUE(p.wait_for([&] { return fs::exists(step_dir(run, 3)); })) << p.err();
  // Read while it runs: status running, and the step and checkpoint it has reached (never 0/null).
  const json s = json::parse(test::read_file(run + "/summary.json"));
  EXPECT_EQ(s["status"], "running");
  EXPECT_GE(s["step"].get<int64_t>(), 1) << s.dump();
  ASSERT_TRUE(s["last_checkpoint"].is_string()) << s.dump();
  const std::string last = s["last_checkpoint"];
  EXPECT_EQ(last, step_dir(run, static_cast<int>(s["step"].get<int64_t>()))) << s.dump();
  EXPECT_EQ(p.stop(SIGINT), 3) << p.err();
}

TEST(ReaderRace, EvalDuringRotationReadsTheNewestOrSaysItWasRotatedAway) {
  const std::string dir = test::temp_dir("rel-reader");
  const std::string run = dir + "/run";
  test::Background p(
      rel::train_args(rel::write_config(dir, run, 1000000), {"--set", "train.keep_checkpoints=1"}),
      dir);
  ASSERT_TRUE(p.wait_for([&] { return !checkpoint_names(run).empty(); })) << p.err();
  // A run directory: every read succeeds, on whichever checkpoint is newest when it looks.
  for (int k = 0; k < 12; ++k) {
    const test::RunResult r = run_cemfrac({"--threads", "1", "eval", "--checkpoint", run, "--data",
                                           rel::data_dir() + ":val", "--json"});
    EXPECT_EQ(r.exit_code, 0) << r.err;
  }
  // A checkpoint named directly that the run has rotated away: said so, with the way out.
  std::string named;
  for (const std::string& n : checkpoint_names(run))
    if (n.find(".tmp-") == std::string::npos) named = run + "/checkpoints/" + n;
  ASSERT_FALSE(named.empty());
  ASSERT_TRUE(p.wait_for([&] { return !fs::exists(named); })) << p.err();
  expect_one_line_error(
      run_cemfrac({"eval", "--checkpoint", named, "--data", rel::data_dir() + ":val"}),
      "rotated away by its run");
  EXPECT_EQ(p.stop(SIGINT), 3) << p.err();
}

}  // namespace
}  // namespace cemfrac
