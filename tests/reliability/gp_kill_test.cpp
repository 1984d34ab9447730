// `gp --one --checkpoint-dir` (the GP job of `cemfrac compare`) killed outright at a random moment
// of its training (SIGKILL: no handler runs, no checkpoint is saved on the way out), then run again
// as it was: it resumes from the last checkpoint it completed and its result is the uninterrupted
// run's, bit for bit (timings aside); the killed run left no result file, and its lock died with it.
// And a reader racing the writer: gp-run.json is either absent or the whole final result.
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "tests/test_util.h"

namespace cemfrac {
namespace {

namespace fs = std::filesystem;

const std::vector<std::string> kArgs = {
    "--threads",     "1",   "gp",      "--one", "--steps",    "2", "--layers",    "1",
    "--train-steps", "400", "--batch", "2",     "--val-seqs", "4", "--eval-seqs", "4"};

// Everything of a result but the timings.
nlohmann::json results(nlohmann::json j) {
  nlohmann::json out;
  for (const char* key : {"status", "steps_done", "params", "last_train_mse", "val", "test"}) {
    out[key] = j[key];
    if (out[key].is_object()) out[key].erase("eval_s");
  }
  return out;
}

TEST(GpKill, AKilledGpRunAgainResumesToTheUninterruptedResult) {
  const test::RunResult plain = test::run_cemfrac(kArgs);
  ASSERT_EQ(plain.exit_code, 0) << plain.err;
  const nlohmann::json p = nlohmann::json::parse(plain.out);

  const std::string dir = test::temp_dir("gp_kill");
  const std::string run = dir + "/run";
  std::vector<std::string> resumable = kArgs;
  resumable.insert(resumable.end(), {"--checkpoint-dir", run, "--out", run});
  std::mt19937 rng{std::random_device{}()};
  const int delay_ms = std::uniform_int_distribution<int>(0, 150)(rng);
  SCOPED_TRACE(::testing::Message() << "killed " << delay_ms << " ms after the first checkpoint");
  {
    test::Background bg(resumable, dir);
    ASSERT_TRUE(bg.wait_for([&] { return test::has_complete_checkpoint(run + "/checkpoints"); }))
        << bg.err();
    std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
    // 400 steps take seconds and the delay is at most 0.15 s: it is still training.
    ASSERT_EQ(bg.stop(SIGKILL), 128 + SIGKILL) << "gp ended before the kill: " << bg.err();
  }
  EXPECT_FALSE(fs::exists(run + "/gp-run.json")) << "a killed run left a result behind";

  const test::RunResult again = test::run_cemfrac(resumable);
  ASSERT_EQ(again.exit_code, 0) << again.err;
  const nlohmann::json r = nlohmann::json::parse(again.out);
  EXPECT_GT(r["resumed_from_step"].get<int64_t>(), 0) << again.err;
  EXPECT_LT(r["resumed_from_step"].get<int64_t>(), 400) << again.err;
  EXPECT_EQ(results(r), results(p));
  EXPECT_TRUE(results(p)["last_train_mse"].is_number());
  EXPECT_EQ(nlohmann::json::parse(test::read_file(run + "/gp-run.json")), r);
}

TEST(GpKill, AReaderRacingTheWriterSeesNoResultOrTheWholeOne) {
  const std::string dir = test::temp_dir("gp_race");
  const std::string out = dir + "/out";
  std::vector<std::string> args = kArgs;
  args.insert(args.end(), {"--out", out});
  int partial = 0, seen = 0;
  {
    test::Background bg(args, dir);
    // Read gp-run.json as fast as possible until the writer ends.
    bg.wait_for([&] {
      std::error_code ec;
      if (fs::exists(out + "/gp-run.json", ec)) {
        const std::string text = test::read_file(out + "/gp-run.json");
        const nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
        ++seen;
        if (j.is_discarded() || !j.contains("test")) ++partial;
      }
      return false;  // poll until it exits
    });
    ASSERT_EQ(bg.wait(), 0) << bg.err();
  }
  EXPECT_EQ(partial, 0) << seen << " reads";
  EXPECT_TRUE(nlohmann::json::parse(test::read_file(out + "/gp-run.json")).contains("test"));
}

}  // namespace
}  // namespace cemfrac
