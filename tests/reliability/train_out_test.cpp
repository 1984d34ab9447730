// `train --out DIR` writes only into a new or empty directory, or continues a run with --resume:
// a directory holding the user's files, a finished run kept without its checkpoints, the dataset
// directory, a file or a dangling link are refused naming what is there, and nothing in them
// changes.
#include <gtest/gtest.h>

#include <filesystem>

#include "cemfrac/core/dir_lock.h"
#include "cemfrac/train/run_dir.h"
#include "tests/reliability/reliability_util.h"
#include "tests/test_util.h"

namespace cemfrac {
namespace {

namespace fs = std::filesystem;
using test::expect_one_line_error;
using test::run_cemfrac;

TEST(TrainOut, OnlyANewOrEmptyDirectoryOrAResumedRun) {
  const std::string dir = test::temp_dir("rel-train-out");
  const std::string run = dir + "/run";
  const std::string config = rel::write_config(dir, run, 2);

  // The user's files, no checkpoints/: refused, both files kept byte for byte.
  rel::put(run + "/config.toml", "# my notes\n");
  rel::put(run + "/metrics.jsonl", "{\"mine\": 1}\n");
  expect_one_line_error(
      run_cemfrac(rel::train_args(config)),
      "train.out = " + run + " is not empty (it holds config.toml, metrics.jsonl)");
  EXPECT_EQ(test::read_file(run + "/config.toml"), "# my notes\n");
  EXPECT_EQ(test::read_file(run + "/metrics.jsonl"), "{\"mine\": 1}\n");
  EXPECT_FALSE(fs::exists(run + "/summary.json"));

  // A finished run kept without its checkpoints (docs/compare.md suggests keeping those).
  const std::string kept = dir + "/kept";
  ASSERT_EQ(run_cemfrac(rel::train_args(config, {"--out", kept})).exit_code, 0);
  fs::remove_all(kept + "/checkpoints");
  const std::string summary = test::read_file(kept + "/summary.json");
  expect_one_line_error(run_cemfrac(rel::train_args(config, {"--out", kept})), "is not empty");
  EXPECT_EQ(test::read_file(kept + "/summary.json"), summary);

  // The dataset directory, a file, a dangling link.
  expect_one_line_error(run_cemfrac(rel::train_args(config, {"--out", rel::data_dir()})),
                        "is the dataset directory (data.path)");
  rel::put(dir + "/file", "x");
  expect_one_line_error(run_cemfrac(rel::train_args(config, {"--out", dir + "/file"})),
                        "exists and is not a directory");
  fs::create_symlink(dir + "/nowhere", dir + "/dangling");
  expect_one_line_error(run_cemfrac(rel::train_args(config, {"--out", dir + "/dangling"})),
                        "is a dangling symbolic link");

  // A run killed before its first checkpoint (summary.json "running", nobody holding the lock)
  // starts again with the same command.
  const std::string killed = dir + "/killed";
  rel::put(killed + "/summary.json", "{\"status\": \"running\", \"pid\": 999999999}\n");
  rel::put(killed + "/config.toml", "# the killed run's\n");
  const test::RunResult again = run_cemfrac(rel::train_args(config, {"--out", killed}));
  EXPECT_EQ(again.exit_code, 0) << again.err;

  // Allowed: an empty directory, one holding only a stale lock file or what `compare` writes
  // before it starts a training; and a run continued with --resume.
  const std::string empty = dir + "/empty";
  fs::create_directories(empty);
  EXPECT_EQ(run_cemfrac(rel::train_args(config, {"--out", empty})).exit_code, 0);
  const std::string suite_run = dir + "/suite-run";
  rel::put(suite_run + "/compare-run.json", "{}\n");
  rel::put(suite_run + "/train.log", "cemfrac train ...\n");
  rel::put(suite_run + "/" + kDirLockFile, "1 train\n");
  const test::RunResult r = run_cemfrac(rel::train_args(config, {"--out", suite_run}));
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(test::read_file(suite_run + "/compare-run.json"), "{}\n");
  const test::RunResult resumed =
      run_cemfrac(rel::train_args(rel::write_config(dir, empty, 3), {"--resume", empty}));
  EXPECT_EQ(resumed.exit_code, 0) << resumed.err;
}

// summary.json's "running" is believed only while a process holds the directory's lock.
TEST(TrainOut, RunStatusCallsARunningRunNobodyHoldsDied) {
  const std::string dir = test::temp_dir("run-status");
  EXPECT_EQ(run_status(dir), RunStatus::kNone);  // no summary.json
  test::write_file(dir + "/summary.json", R"({"status": "running", "step": 7, "pid": 1})");
  int64_t step = 0;
  EXPECT_EQ(run_status(dir, &step), RunStatus::kDied);
  EXPECT_EQ(step, 7);
  {
    const DirLock lock = DirLock::acquire(dir, "train");
    EXPECT_EQ(run_status(dir), RunStatus::kRunning);
  }
  EXPECT_EQ(run_status(dir), RunStatus::kDied);
  test::write_file(dir + "/summary.json", R"({"status": "interrupted", "step": 7})");
  EXPECT_EQ(run_status(dir), RunStatus::kInterrupted);
  test::write_file(dir + "/summary.json", "{not json");
  EXPECT_EQ(run_status(dir), RunStatus::kNone);
}

}  // namespace
}  // namespace cemfrac
