// One writer per directory, as users meet it: a second `train` into a live run
// directory, `--resume` of a live run, `prepare --out` and `gp --one --checkpoint-dir` into a
// directory another process writes are refused with one line naming the holder's pid, and write
// nothing. The holder is either a real concurrent `cemfrac train` or this test process holding the
// lock itself (flock conflicts between two open files, also of one process).
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "cemfrac/core/dir_lock.h"
#include "tests/reliability/reliability_util.h"
#include "tests/test_util.h"

namespace cemfrac {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using test::expect_one_line_error;
using test::run_cemfrac;

std::string listing(const std::string& dir) {
  std::string out;
  std::error_code ec;
  std::set<std::string> names;
  for (const auto& e : fs::recursive_directory_iterator(dir, ec))
    names.insert(fs::relative(e.path(), dir).string());
  for (const std::string& n : names) out += n + "\n";
  return out;
}

TEST(OneWriter, ASecondTrainAndAResumeOfALiveRunAreRefused) {
  const std::string dir = test::temp_dir("rel-one-writer");
  const std::string run = dir + "/run";
  const std::string config = rel::write_config(dir, run, 100000);
  test::Background a(rel::train_args(config), dir);
  ASSERT_TRUE(a.wait_for([&] { return rel::metrics_lines(run) >= 2; })) << a.err();
  const std::string config_before = test::read_file(run + "/config.toml");
  const std::string holder = "(pid " + std::to_string(a.pid) + ", train)";

  // Another seed into the same directory: refused before it writes anything.
  expect_one_line_error(run_cemfrac(rel::train_args(config, {"--set", "train.seed=7"})), holder);
  EXPECT_EQ(test::read_file(run + "/config.toml"), config_before);
  // --resume of the live run (its directory, or one of its checkpoints).
  expect_one_line_error(run_cemfrac(rel::train_args(config, {"--resume", run})), holder);
  EXPECT_EQ(test::read_file(run + "/config.toml"), config_before);

  EXPECT_EQ(a.stop(SIGINT), 3) << a.err();
  // Exactly one writer's lines: every step once, in order.
  std::istringstream in(test::read_file(run + "/metrics.jsonl"));
  int64_t expected = 1;
  for (std::string line; std::getline(in, line); ++expected)
    EXPECT_EQ(json::parse(line)["step"], expected) << line;
  EXPECT_GE(expected, 3);
  // The lock died with its holder: the run resumes.
  EXPECT_EQ(
      run_cemfrac(rel::train_args(rel::write_config(dir, run, expected + 1), {"--resume", run}))
          .exit_code,
      0);
}

TEST(OneWriter, PrepareIntoALockedDirectoryIsRefused) {
  const std::string dir = test::temp_dir("rel-prepare-lock");
  rel::put(dir + "/src/a.txt", "some text of a document\n");
  rel::put(dir + "/src/b.txt", "another document of text\n");
  rel::put(dir + "/src/c.txt", "a third document of text\n");
  const std::string out = dir + "/data";
  const std::string holder = "(pid " + std::to_string(::getpid()) + ", test)";
  const std::vector<std::string> args = {"prepare", "--text", dir + "/src", "--tokenizer", "byte",
                                         "--out",   out,      "--split",    "50,25,25"};
  {
    const DirLock lock = DirLock::acquire(out, "test");
    expect_one_line_error(run_cemfrac(args), holder);
    EXPECT_EQ(listing(out), std::string(kDirLockFile) + "\n") << "nothing written";
  }
  const test::RunResult ok = run_cemfrac(args);
  ASSERT_EQ(ok.exit_code, 0) << ok.err;
  EXPECT_TRUE(fs::exists(out + "/meta.json"));
  // A prepared dataset being replaced (--force) is locked as well.
  std::vector<std::string> force = args;
  force.push_back("--force");
  {
    const DirLock lock = DirLock::acquire(out, "test");
    const std::string before = listing(out);
    expect_one_line_error(run_cemfrac(force), holder);
    EXPECT_EQ(listing(out), before);
  }
  // A prepare that fails does not leave the directory its lock created.
  const std::string never = dir + "/never";
  rel::put(dir + "/notext/readme.md", "not a .txt file\n");
  rel::expect_last_line_error(
      run_cemfrac({"prepare", "--text", dir + "/notext", "--tokenizer", "byte", "--out", never}),
      "holds no .txt files");
  EXPECT_FALSE(fs::exists(never));
}

TEST(OneWriter, GpIntoALockedDirectoryIsRefused) {
  const std::string dir = test::temp_dir("rel-gp-lock");
  const std::string holder = "(pid " + std::to_string(::getpid()) + ", test)";
  const std::vector<std::string> base = {
      "--threads",     "1", "gp",      "--one", "--steps",    "1", "--layers",    "1",
      "--train-steps", "4", "--batch", "2",     "--val-seqs", "4", "--eval-seqs", "4"};
  std::vector<std::string> args = base;
  args.insert(args.end(), {"--checkpoint-dir", dir + "/run"});
  {
    const DirLock lock = DirLock::acquire(dir + "/run", "test");
    expect_one_line_error(run_cemfrac(args), holder);
    EXPECT_EQ(listing(dir + "/run"), std::string(kDirLockFile) + "\n") << "nothing written";
  }
  const test::RunResult ok = run_cemfrac(args);
  EXPECT_EQ(ok.exit_code, 0) << ok.err;
  // --out of a single run, and of the whole experiment.
  std::vector<std::string> out_args = base;
  out_args.insert(out_args.end(), {"--out", dir + "/out"});
  {
    const DirLock lock = DirLock::acquire(dir + "/out", "test");
    expect_one_line_error(run_cemfrac(out_args), holder);
  }
  EXPECT_FALSE(fs::exists(dir + "/out/gp-run.json"));
  {
    const DirLock lock = DirLock::acquire(dir + "/exp", "test");
    expect_one_line_error(
        run_cemfrac({"--threads", "1", "gp", "--steps", "1", "--train-steps", "2", "--batch", "2",
                     "--eval-seqs", "4", "--no-baseline", "--out", dir + "/exp"}),
        holder);
  }
  EXPECT_FALSE(fs::exists(dir + "/exp/gp.json"));
}

}  // namespace
}  // namespace cemfrac
