// Every input path is treated alike: a directory, a FIFO or a
// dangling link where a file is expected is refused at once with one line saying which it is
// (a FIFO never blocks the command), `prepare --text DIR` names a *.txt entry it cannot read
// instead of skipping it, and `generate` checks every sampling option before any output.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>

#include "tests/reliability/reliability_util.h"
#include "tests/test_util.h"

namespace cemfrac {
namespace {

namespace fs = std::filesystem;
using test::expect_one_line_error;
using test::run_cemfrac;

// `dir`/dir (a directory), `dir`/fifo, `dir`/dangling (a link to nowhere).
struct Odd {
  std::string dir, fifo, dangling;
};
Odd odd_paths(const std::string& tag) {
  Odd o;
  const std::string root = test::temp_dir(tag);
  o.dir = root + "/dir";
  o.fifo = root + "/fifo";
  o.dangling = root + "/dangling";
  fs::create_directories(o.dir);
  EXPECT_EQ(::mkfifo(o.fifo.c_str(), 0600), 0);
  fs::create_symlink(root + "/nowhere", o.dangling);
  return o;
}

// A finished two-step run to evaluate and sample from.
const std::string& trained_run() {
  static const std::string run = [] {
    const std::string dir = test::temp_dir("rel-inputs-run");
    const std::string out = dir + "/run";
    const test::RunResult r = run_cemfrac(rel::train_args(rel::write_config(dir, out, 2)));
    if (r.exit_code != 0) throw std::runtime_error("train failed: " + r.err);
    return out;
  }();
  return run;
}

TEST(InputPaths, TrainBinThatIsNotAFileIsNamedAsWhatItIs) {
  const Odd o = odd_paths("rel-trainbin");
  const std::string root = fs::path(o.dir).parent_path().string();
  struct Case {
    std::string target, words;
  };
  for (const Case& c : {Case{o.dir, "is a directory, not a file"},
                        Case{o.fifo, "is a FIFO (named pipe), not a regular file"},
                        Case{o.dangling, "is a dangling symbolic link"}}) {
    const std::string data = root + "/data-" + fs::path(c.target).filename().string();
    fs::copy(rel::data_dir(), data, fs::copy_options::recursive);
    fs::remove(data + "/train.bin");
    fs::create_symlink(c.target, data + "/train.bin");
    const std::string cfg_dir = root + "/cfg-" + fs::path(c.target).filename().string();
    fs::create_directories(cfg_dir);
    const test::RunResult r = run_cemfrac(rel::train_args(
        rel::write_config(cfg_dir, cfg_dir + "/run", 2), {"--set", "data.path=" + data}));
    expect_one_line_error(r, data + "/train.bin: " + c.words);
    EXPECT_FALSE(fs::exists(cfg_dir + "/run")) << "nothing written";
  }
}

TEST(InputPaths, EvalAndGenerateInputsMustBeRegularFiles) {
  const Odd o = odd_paths("rel-eval-gen");
  const std::string run = trained_run();
  for (const auto& [path, words] : std::vector<std::pair<std::string, std::string>>{
           {o.dir, "is a directory, not a file"},
           {o.fifo, "is a FIFO (named pipe)"},
           {o.dangling, "is a dangling symbolic link"}}) {
    expect_one_line_error(run_cemfrac({"eval", "--checkpoint", run, "--text", path}),
                          "--text " + path + ": " + words);
    const test::RunResult g = run_cemfrac({"generate", "--checkpoint", run, "--prompts", path});
    expect_one_line_error(g, "--prompts " + path + ": " + words);
    EXPECT_EQ(g.out, "");
  }
}

TEST(InputPaths, GenerateChecksEverySamplingOptionBeforeAnyOutput) {
  const std::string run = trained_run();
  for (const char* t : {"nan", "inf", "1e999"}) {
    const test::RunResult r =
        run_cemfrac({"generate", "--checkpoint", run, "--prompt", "The", "--temperature", t});
    expect_one_line_error(r, "--temperature");
    EXPECT_EQ(r.out, "") << t;
  }
  const test::RunResult p =
      run_cemfrac({"generate", "--checkpoint", run, "--prompt", "The", "--top-p", "nan"});
  expect_one_line_error(p, "--top-p");
  EXPECT_EQ(p.out, "");
}

TEST(InputPaths, PrepareTextRefusesWhatItCannotRead) {
  const Odd o = odd_paths("rel-prepare-text");
  const std::string root = fs::path(o.dir).parent_path().string();
  // A FIFO given as the one input file.
  expect_one_line_error(
      run_cemfrac({"prepare", "--text", o.fifo, "--tokenizer", "byte", "--out", root + "/o1"}),
      "--text " + o.fifo + ": is a FIFO (named pipe)");
  EXPECT_FALSE(fs::exists(root + "/o1"));
  // Entries of a directory named *.txt that cannot be read are named, never skipped.
  struct Case {
    std::string name, words;
  };
  int k = 0;
  for (const Case& c :
       {Case{"dangling", "is a dangling symbolic link"}, Case{"fifo", "is a FIFO (named pipe)"},
        Case{"loop", "is a symbolic link loop"}}) {
    const std::string src = root + "/src-" + c.name;
    rel::put(src + "/a.txt", "a readable document\n");
    rel::put(src + "/b.txt", "another readable document\n");
    const std::string bad = src + "/c.txt";
    if (c.name == "dangling") fs::create_symlink(root + "/nowhere", bad);
    if (c.name == "fifo") {
      ASSERT_EQ(::mkfifo(bad.c_str(), 0600), 0);
    }
    if (c.name == "loop") fs::create_symlink(bad, bad);
    const std::string out = root + "/out" + std::to_string(k++);
    rel::expect_last_line_error(
        run_cemfrac({"prepare", "--text", src, "--tokenizer", "byte", "--out", out}),
        bad + " " + c.words);
    EXPECT_FALSE(fs::exists(out)) << "nothing written";
  }
  // A directory named *.txt is listed, not refused.
  const std::string nested = root + "/src-nested";
  rel::put(nested + "/a.txt", "a readable document\n");
  rel::put(nested + "/more.txt/b.txt", "another readable document\n");
  rel::put(nested + "/more.txt/c.txt", "a third readable document\n");
  const test::RunResult ok = run_cemfrac({"prepare", "--text", nested, "--tokenizer", "byte",
                                          "--out", root + "/nested", "--split", "34,33,33"});
  EXPECT_EQ(ok.exit_code, 0) << ok.err;
}

}  // namespace
}  // namespace cemfrac
