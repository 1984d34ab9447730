// `cemfrac compare` as a writer (label `reliability`): one compare per suite folder (a second one
// is refused naming the first), a compare killed outright leaves none of its job processes
// running, and the same command run again finishes the suite with the uninterrupted one's numbers.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/types.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "tests/compare/suite_fixtures.h"
#include "tests/test_util.h"

namespace cemfrac {
namespace {

namespace fs = std::filesystem;
using test::write_suite;

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
TEST(CompareWriter, SecondCompareOnOneOutIsRefused) {
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
TEST(CompareWriter, KilledCompareLeavesNoChild) {
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

// A `compare` killed outright (SIGKILL) at a random moment of a job that has checkpointed, then run
// again as it was: it resumes that job from its checkpoint, reuses what finished, and its results
// are those of an uninterrupted compare of the same suite, bit for bit.
TEST(CompareWriter, AKilledCompareRunAgainFinishesWithTheSameResults) {
  const std::string root = test::temp_dir("compare-kill-resume");
  const std::string suite =
      write_suite(root,
                  "[suite]\nname = \"resume\"\nseeds = [1, 2]\nlr = [3e-3]\n\n[gp]\n"
                  "steps = 600\nbatch = 2\nlayers = 1\nval_seqs = 4\ntest_seqs = 4\n\n"
                  "[[run]]\nname = \"g\"\ntask = \"gp\"\nT = 2\n");
  auto args = [&](const std::string& out) {
    return std::vector<std::string>{"--threads", "1", "compare", "--suite", suite, "--out", out};
  };
  const test::RunResult plain = test::run_cemfrac(args(root + "/plain"));
  ASSERT_EQ(plain.exit_code, 0) << plain.err;

  const std::string out = root + "/out";
  const std::string checkpoints = out + "/final/g/seed-1/checkpoints";
  std::mt19937 rng{std::random_device{}()};
  const int delay_ms = std::uniform_int_distribution<int>(0, 100)(rng);
  SCOPED_TRACE(::testing::Message() << "killed " << delay_ms << " ms after the first checkpoint");
  {
    test::Background run(args(out), root);
    ASSERT_TRUE(run.wait_for([&] { return test::has_complete_checkpoint(checkpoints); }))
        << run.err();
    std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
    ASSERT_EQ(run.stop(SIGKILL), 128 + SIGKILL) << "compare ended before the kill";
  }
  EXPECT_FALSE(fs::exists(out + "/results.json"));
  const test::RunResult again = test::run_cemfrac(args(out));
  ASSERT_EQ(again.exit_code, 0) << again.err;
  const std::string log = test::read_file(out + "/final/g/seed-1/gp.log");
  EXPECT_NE(log.find("resumed from"), std::string::npos) << log;
  auto numbers = [](const std::string& results) {
    nlohmann::json seeds = nlohmann::json::parse(test::read_file(results))["runs"][0]["seeds"];
    for (auto& s : seeds) {
      s.erase("train_s");
      s.erase("steps_per_s");
    }
    return seeds;
  };
  const nlohmann::json want = numbers(root + "/plain/results.json");
  EXPECT_EQ(numbers(out + "/results.json"), want);
  EXPECT_EQ(want.size(), 2u);
  EXPECT_TRUE(want[0]["test_rmse"].is_number());
}

// A reader racing the report's writer: while `compare` finishes a suite and while `compare --report`
// rewrites it, results.json and results.md are either absent or whole (the last run's or the new
// one), never a part.
TEST(CompareWriter, AReaderRacingTheReportSeesItWholeOrNotAtAll) {
  const std::string root = test::temp_dir("compare-report-race");
  const std::string suite =
      write_suite(root,
                  "[suite]\nname = \"race\"\nseeds = [1, 2]\nlr = [3e-3]\n\n[gp]\n"
                  "steps = 30\nbatch = 2\nlayers = 1\nval_seqs = 4\ntest_seqs = 4\n\n"
                  "[[run]]\nname = \"g\"\ntask = \"gp\"\nT = 1\n");
  const std::string out = root + "/out";
  int reads = 0, partial = 0;
  auto poll = [&] {
    std::error_code ec;
    if (fs::exists(out + "/results.json", ec)) {
      const auto j = nlohmann::json::parse(test::read_file(out + "/results.json"), nullptr, false);
      ++reads;
      if (j.is_discarded() || !j.contains("runs") || !j.contains("claims")) ++partial;
    }
    if (fs::exists(out + "/results.md", ec)) {
      const std::string md = test::read_file(out + "/results.md");
      ++reads;
      if (md.find("## Plots") == std::string::npos) ++partial;
    }
    return false;  // poll until it exits
  };
  for (const bool report_only : {false, true, true, true}) {
    std::vector<std::string> args = {"--threads", "1", "compare", "--suite", suite, "--out", out};
    if (report_only) args.push_back("--report");
    test::Background run(args, root);
    run.wait_for(poll);
    ASSERT_EQ(run.wait(), 0) << run.err();
  }
  EXPECT_EQ(partial, 0) << reads << " reads";
  EXPECT_GT(reads, 0);
}

}  // namespace
}  // namespace cemfrac
