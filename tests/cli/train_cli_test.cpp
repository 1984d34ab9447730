// `cemfrac train` as a user runs it (the built executable on a tiny byte-level dataset): refused
// commands write nothing, exit codes, summary.json while running and after, resume in the run's own
// directory with changed settings refused or warned about, crash leftovers, and a crash-safety test
// (SIGKILL at several points, resumed, bitwise equal to an uninterrupted run).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "cemfrac/model/lm_model.h"
#include "cemfrac/train/model_loader.h"
#include "cemfrac/train/run_config.h"
#include "cemfrac/train/run_dir.h"
#include "tests/test_util.h"

extern char** environ;

namespace cemfrac {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using test::expect_one_line_error;
using test::run_cemfrac;

// A prepared byte-level dataset: 24 documents of ~300 bytes (val and test get ~2 each).
const std::string& data_dir() {
  static const std::string dir = [] {
    const std::string src = test::temp_dir("train-cli-src");
    for (int d = 0; d < 24; ++d) {
      std::string text;
      for (int i = 0; text.size() < 300; ++i)
        text += "document " + std::to_string(d) + " says line " + std::to_string(i) + ". ";
      test::write_file(src + "/doc" + std::to_string(d) + ".txt", text);
    }
    const std::string out = test::temp_dir("train-cli-data") + "/data";
    const test::RunResult r = run_cemfrac(
        {"prepare", "--text", src, "--tokenizer", "byte", "--out", out, "--split", "80,10,10"});
    if (r.exit_code != 0) throw std::runtime_error("prepare failed: " + r.err);
    return out;
  }();
  return dir;
}

// A config of a tiny model (milliseconds per step) writing to `out`.
std::string write_config(const std::string& dir, const std::string& out, int64_t steps,
                         const std::string& extra_train = "") {
  const std::string path = dir + "/run.toml";
  test::write_file(path,
                   "[model]\nvocab_size = 257\nd_model = 16\nn_layers = 1\nn_heads = 2\n"
                   "d_ff = 32\ncontext = 16\n\n[data]\npath = \"" +
                       data_dir() + "\"\n\n[train]\nsteps = " + std::to_string(steps) +
                       "\nmicro_batch = 2\nwarmup_steps = 2\nlog_every = 1\neval_every = 0\n"
                       "eval_tokens = 64\ncheckpoint_every = 1\nkeep_checkpoints = 3\nout = \"" +
                       out + "\"\n" + extra_train);
  return path;
}

json summary(const std::string& run) {
  return json::parse(test::read_file(run + "/summary.json"));
}

std::vector<double> losses(const std::string& run) {
  std::vector<double> out;
  std::istringstream in(test::read_file(run + "/metrics.jsonl"));
  for (std::string line; std::getline(in, line);) out.push_back(json::parse(line)["loss"]);
  return out;
}

size_t metrics_lines(const std::string& run) {
  std::error_code ec;
  if (!fs::exists(run + "/metrics.jsonl", ec)) return 0;
  const std::string text = test::read_file(run + "/metrics.jsonl");
  return static_cast<size_t>(std::count(text.begin(), text.end(), '\n'));
}

using test::Background;

std::vector<std::string> train_args(const std::string& config, std::vector<std::string> more = {}) {
  std::vector<std::string> args = {"--threads", "1", "train", "--config", config, "--quiet"};
  args.insert(args.end(), more.begin(), more.end());
  return args;
}

bool has_checkpoint(const std::string& run) {
  std::error_code ec;
  const fs::path dir = fs::path(run) / "checkpoints";
  if (!fs::is_directory(dir, ec)) return false;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (e.path().filename().string().find(".tmp-") == std::string::npos) return true;
  return false;
}

bool has_temporary(const std::string& run) {
  std::error_code ec;
  const fs::path dir = fs::path(run) / "checkpoints";
  if (!fs::is_directory(dir, ec)) return false;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (e.path().filename().string().find(".tmp-") != std::string::npos) return true;
  return false;
}

// ---- refused commands write nothing ----

TEST(TrainCli, ARefusedTrainWritesNothing) {
  const std::string dir = test::temp_dir("train-cli-refuse");
  const std::string run = dir + "/run";
  const std::string config = write_config(dir, run, 2);
  ASSERT_EQ(run_cemfrac(train_args(config)).exit_code, 0);
  const std::string before = test::read_file(run + "/config.toml");
  const std::string summary_before = test::read_file(run + "/summary.json");

  // The same directory again with another setting: refused, config.toml untouched.
  expect_one_line_error(run_cemfrac(train_args(config, {"--set", "train.steps=5"})),
                        "already holds checkpoints");
  EXPECT_EQ(test::read_file(run + "/config.toml"), before);
  EXPECT_EQ(test::read_file(run + "/summary.json"), summary_before);

  // A run refused for its data leaves no directory behind.
  const std::string other = dir + "/never";
  expect_one_line_error(
      run_cemfrac(train_args(config, {"--out", other, "--set", "data.path=" + dir + "/nodata"})),
      "not a prepared dataset");
  EXPECT_FALSE(fs::exists(other));
  // Nor does one refused by the trainer's own checks (validation split shorter than a window).
  expect_one_line_error(
      run_cemfrac(train_args(
          config, {"--out", other, "--set", "model.context=2048", "--set", "train.seq_len=2048"})),
      "validation window");
  EXPECT_FALSE(fs::exists(other));
}

// ---- exit codes and summary.json (item 10) ----

TEST(TrainCli, InterruptedRunExitsThreeAndSummaryIsAlwaysTrue) {
  const std::string dir = test::temp_dir("train-cli-sigint");
  const std::string run = dir + "/run";
  const std::string config = write_config(dir, run, 100000);
  for (int sig : {SIGINT, SIGTERM}) {
    fs::remove_all(run);
    Background p(train_args(config), dir);
    ASSERT_TRUE(p.wait_for([&] { return metrics_lines(run) >= 2; })) << p.err();
    EXPECT_EQ(summary(run)["status"], "running");
    EXPECT_EQ(summary(run)["pid"], p.pid);
    EXPECT_EQ(p.stop(sig), 3) << p.err();
    EXPECT_NE(p.err().find("interrupted at step"), std::string::npos) << p.err();
    const json s = summary(run);
    EXPECT_EQ(s["status"], "interrupted");
    EXPECT_FALSE(s.contains("pid"));
    EXPECT_TRUE(fs::exists(s["last_checkpoint"].get<std::string>())) << s.dump();
  }

  // A finished run says "completed"; resumed with more steps and killed, it must not keep saying
  // so.
  fs::remove_all(run);
  const std::string short_config = write_config(dir, run, 3);
  ASSERT_EQ(run_cemfrac(train_args(short_config)).exit_code, 0);
  EXPECT_EQ(summary(run)["status"], "completed");
  Background p(train_args(write_config(dir, run, 100000), {"--resume", run}), dir);
  ASSERT_TRUE(p.wait_for([&] { return metrics_lines(run) >= 5; })) << p.err();
  EXPECT_EQ(p.stop(SIGKILL), 128 + SIGKILL);
  EXPECT_EQ(summary(run)["status"], "running");
  // Nobody holds the run any more: readers call it died, and the next writer records it.
  EXPECT_EQ(run_status(run), RunStatus::kDied);
  const test::RunResult e =
      run_cemfrac({"--threads", "1", "eval", "--checkpoint", run, "--data", data_dir() + ":val"});
  ASSERT_EQ(e.exit_code, 0) << e.err;
  EXPECT_NE(e.err.find("died at step"), std::string::npos) << e.err;
  const int64_t at = summary(run)["step"].get<int64_t>();
  const test::RunResult r =
      run_cemfrac(train_args(write_config(dir, run, at + 2), {"--resume", run}));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("died at step " + std::to_string(at)), std::string::npos) << r.err;
  EXPECT_EQ(summary(run)["status"], "completed");
  EXPECT_EQ(summary(run)["previous_status"], "died");
  EXPECT_EQ(run_status(run), RunStatus::kCompleted);
}

// ---- crash leftovers (item 14) ----

TEST(TrainCli, StaleTemporariesAreRemovedAndIncompleteCheckpointsSkipped) {
  const std::string dir = test::temp_dir("train-cli-leftovers");
  const std::string run = dir + "/run";
  ASSERT_EQ(run_cemfrac(train_args(write_config(dir, run, 2))).exit_code, 0);
  // What a save killed mid-way leaves (pid 99999999 is above any pid_max), and a checkpoint
  // directory cut short (say, by a copy).
  const std::string tmp = run + "/checkpoints/step-000003.tmp-99999999-abc123";
  fs::create_directories(tmp);
  test::write_file(tmp + "/model.safetensors", "partial");
  fs::create_directories(run + "/checkpoints/step-999999");
  fs::create_directories(run + "/checkpoints/step-000500");
  test::write_file(run + "/checkpoints/step-000500/trainer.json", "{}");

  // eval and generate take the newest complete checkpoint and say what they skipped.
  for (const std::vector<std::string>& cmd :
       {std::vector<std::string>{"eval", "--checkpoint", run, "--data", data_dir() + ":val"},
        std::vector<std::string>{"generate", "--checkpoint", run, "--prompt", "doc",
                                 "--max-new-tokens", "4"}}) {
    const test::RunResult r = run_cemfrac(cmd);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.err.find("skipped incomplete checkpoint " + run +
                         "/checkpoints/step-999999 (empty "
                         "directory)"),
              std::string::npos)
        << r.err;
    EXPECT_NE(r.err.find("step-000500 (config.json is missing)"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("using " + run + "/checkpoints/step-000002"), std::string::npos) << r.err;
  }

  // Resuming does the same, and removes the temporary, saying so.
  const test::RunResult r = run_cemfrac(train_args(write_config(dir, run, 3), {"--resume", run}));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("removed " + tmp), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(tmp));
  EXPECT_TRUE(fs::exists(run + "/checkpoints/step-000003/model.safetensors"));
  EXPECT_TRUE(fs::exists(run + "/checkpoints/step-999999")) << "only cemfrac's own temporaries go";
  EXPECT_EQ(summary(run)["step"], 3);
}

// ---- resume settings (item 13) ----

TEST(TrainCli, ResumeContinuesInItsDirectoryAndRefusesChangesThatBreakExactness) {
  const std::string dir = test::temp_dir("train-cli-resume");
  const std::string run = dir + "/run";
  ASSERT_EQ(run_cemfrac(train_args(write_config(dir, run, 2))).exit_code, 0);
  const std::string config_toml = test::read_file(run + "/config.toml");

  const std::string config = write_config(dir, run, 4);
  for (const auto& [set, field] : std::vector<std::pair<std::string, std::string>>{
           {"train.seq_len=8", "train.seq_len"},
           {"train.micro_batch=3", "train.micro_batch"},
           {"train.tokens_per_step=64", "train.tokens_per_step"},
           {"train.seed=7", "train.seed"},
           {"train.lr_max=0.01", "train.lr_max"},
           {"train.warmup_steps=5", "train.warmup_steps"},
           {"train.grad_clip=0.5", "train.grad_clip"},
           {"model.d_ff=48", "d_ff"}}) {
    const test::RunResult r = run_cemfrac(train_args(config, {"--resume", run, "--set", set}));
    expect_one_line_error(r, field);
    EXPECT_EQ(test::read_file(run + "/config.toml"), config_toml) << set;
    EXPECT_FALSE(fs::exists(run + "/checkpoints/step-000003")) << set;
  }

  // Another train.out is ignored (warned about): the run goes on in its own directory.
  const std::string elsewhere = dir + "/elsewhere";
  const test::RunResult r = run_cemfrac(
      train_args(config, {"--resume", run, "--out", elsewhere, "--set", "train.log_every=2"}));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(
      r.err.find("train.out = " + elsewhere + " is ignored: --resume continues the run in " + run),
      std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("train.steps changed from 2 to 4"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("train.log_every changed from 1 to 2"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(elsewhere));
  EXPECT_TRUE(fs::exists(run + "/checkpoints/step-000004"));
  EXPECT_NE(test::read_file(run + "/config.toml").find("out = \"" + run + "\""), std::string::npos);
}

// ---- crash safety: SIGKILL at several points, resume, bitwise equal ----

TEST(TrainCli, KilledAtSeveralPointsAndResumedEqualsAnUninterruptedRun) {
  const std::string dir = test::temp_dir("train-cli-crash");
  const int64_t steps = 16;
  const std::string full = dir + "/full", crashed = dir + "/crashed";
  ASSERT_EQ(run_cemfrac(train_args(write_config(dir, full, steps))).exit_code, 0);
  const std::string config = write_config(dir, crashed, steps);

  // Kill points: during the first step (no checkpoint yet), while a checkpoint is being written,
  // right after a metrics line (before that step's checkpoint is complete), and at a random moment.
  const std::vector<std::function<bool()>> points = {
      [&] { return fs::exists(crashed + "/summary.json"); },
      [&] { return has_temporary(crashed); },
      [&] { return metrics_lines(crashed) >= 6; },
      [&] { return has_temporary(crashed) && metrics_lines(crashed) >= 10; },
      [&] { return metrics_lines(crashed) >= 13; },
  };
  int kills = 0;
  for (size_t i = 0; i < points.size(); ++i) {
    std::vector<std::string> more;
    if (has_checkpoint(crashed)) more = {"--resume", crashed};
    Background p(train_args(config, more), dir);
    const bool reached = p.wait_for(points[i]);
    const int code = p.stop(SIGKILL);
    ASSERT_TRUE(reached || code == 0) << "point " << i << ": " << p.err();
    if (code != 128 + SIGKILL) continue;  // finished before the kill
    ++kills;
    EXPECT_EQ(summary(crashed)["status"], "running") << "point " << i;
  }
  EXPECT_GE(kills, 3) << "the run was too quick to be killed at most points";
  const test::RunResult r = run_cemfrac(train_args(config, {"--resume", crashed}));
  ASSERT_EQ(r.exit_code, 0) << r.err;

  EXPECT_EQ(losses(crashed), losses(full));
  ASSERT_EQ(losses(full).size(), static_cast<size_t>(steps));
  const std::string last = "/checkpoints/step-0000" + std::to_string(steps);
  for (const char* file : {"/model.safetensors", "/optimizer.safetensors"})
    EXPECT_EQ(test::read_file(crashed + last + file), test::read_file(full + last + file)) << file;
  EXPECT_EQ(summary(crashed)["status"], "completed");
  EXPECT_FALSE(has_temporary(crashed));
}

// ---- --config must be a real config (item 5) ----

TEST(TrainCli, ConfigMustBeANonEmptyRegularFile) {
  const std::string dir = test::temp_dir("train-cli-config");
  const std::string empty = dir + "/empty.toml";
  test::write_file(empty, "");
  for (const auto& [path, needle] :
       std::vector<std::pair<std::string, std::string>>{{dir, "is a directory"},
                                                        {"/dev/null", "not a regular file"},
                                                        {empty, "the file is empty"}}) {
    expect_one_line_error(run_cemfrac({"train", "--config", path, "--out", dir + "/run"}),
                          path + ": " + needle);
    expect_one_line_error(run_cemfrac({"params", "--config", path}), path + ": " + needle);
  }
  EXPECT_FALSE(fs::exists(dir + "/run"));
  // A config that sets nothing is accepted with a warning.
  const std::string nothing = dir + "/nothing.toml";
  test::write_file(nothing, "# only a comment\n[train]\n");
  const test::RunResult r = run_cemfrac({"params", "--config", nothing});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("cemfrac: warning: run config " + nothing + " sets no field"),
            std::string::npos)
      << r.err;
}

// ---- --threads is bounded (item 6) ----

TEST(TrainCli, ThreadsAreBoundedByTheCores) {
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  expect_one_line_error(run_cemfrac({"--threads", "4096", "info"}),
                        fmt::format("--threads 4096: at most {}", 4 * cores));
  expect_one_line_error(run_cemfrac({"--threads", std::to_string(4 * cores + 1), "info"}),
                        "at most");
  const test::RunResult r = run_cemfrac({"--threads", std::to_string(cores + 1), "info"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("cemfrac: warning: --threads " + std::to_string(cores + 1) +
                       " is more than the " + std::to_string(cores) + " core(s)"),
            std::string::npos)
      << r.err;
  const test::RunResult ok = run_cemfrac({"--threads", std::to_string(cores), "info"});
  EXPECT_EQ(ok.exit_code, 0) << ok.err;
  EXPECT_EQ(ok.err.find("warning"), std::string::npos) << ok.err;
}

// ---- sizes that cannot fit, filesystem errors (item 11) ----

TEST(TrainCli, ImpossibleSizesAndFilesystemErrorsAreOneClearLine) {
  const std::string dir = test::temp_dir("train-cli-sizes");
  const std::string config = write_config(dir, dir + "/run", 2);
  // Sizes past the config's bounds are refused naming the field; a size inside the bounds that
  // cannot fit in this machine's memory is refused by the memory estimate, naming the GiB.
  const std::pair<const char*, const char*> cases[] = {
      {"model.d_model=1000000000", "model.d_model"},
      {"model.d_model=2147483648", "model.d_model"},
      {"model.n_layers=100000000", "model.n_layers"},
      {"model.d_model=131072", "GiB"},
  };
  for (const auto& [set, needle] : cases) {
    const test::RunResult r =
        run_cemfrac(train_args(config, {"--set", set, "--set", "model.n_heads=1"}));
    expect_one_line_error(r, needle);
    EXPECT_EQ(r.err.find("internal error"), std::string::npos) << r.err;
  }
  EXPECT_FALSE(fs::exists(dir + "/run"));
  // A run directory that cannot be created.
  const test::RunResult r = run_cemfrac(train_args(config, {"--out", "/proc/cemfrac-run"}));
  expect_one_line_error(r, "/proc/cemfrac-run");
  EXPECT_EQ(r.err.find("internal error"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("filesystem error"), std::string::npos) << r.err;
}

// ---- train.init_from: a new run from a checkpoint's weights ----

// A CoFrGeNet-F model started from a SwiGLU run: the embeddings, norms and attention come from the
// checkpoint bit for bit, the FFN keeps exactly the initialisation a plain run of the seed gives
// it; the run trains, and its refusals are one line each, with nothing written.
TEST(TrainCli, InitFromLoadsMatchingTensorsAndKeepsTheRestFresh) {
  const std::string dir = test::temp_dir("train-cli-init");
  const std::string base = dir + "/base";
  ASSERT_EQ(run_cemfrac(train_args(write_config(dir, base, 3))).exit_code, 0);

  const std::string config = write_config(dir, dir + "/unused", 2);
  RunConfig rc = load_run_config(config, {"model.ffn=cffn", "train.init_from=" + base});
  torch::manual_seed(rc.train.seed);
  LmModel model(rc.model);
  torch::manual_seed(rc.train.seed);
  LmModel plain(rc.model);
  const InitFromReport init = init_from_checkpoint(*model, base, nullptr);
  const LoadedModel source = load_model(base);
  auto src = source.model->named_parameters();
  auto fresh = plain->named_parameters();
  for (const auto& p : model->named_parameters()) {
    const bool loaded =
        std::find(init.loaded.begin(), init.loaded.end(), p.key()) != init.loaded.end();
    EXPECT_EQ(loaded, p.key().find(".mlp.") == std::string::npos) << p.key();
    EXPECT_TRUE(torch::equal(p.value(), loaded ? src[p.key()] : fresh[p.key()])) << p.key();
  }
  EXPECT_EQ(init.unused, (std::vector<std::string>{"blocks.0.mlp.w_down", "blocks.0.mlp.w_gate",
                                                   "blocks.0.mlp.w_up"}));

  const std::string run = dir + "/cffn";
  test::RunResult r = run_cemfrac({"--threads", "1", "train", "--config", config, "--out", run,
                                   "--set", "model.ffn=cffn", "--set", "train.init_from=" + base});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("# init_from " + base), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("freshly initialised (blocks.0.mlp."), std::string::npos) << r.out;
  EXPECT_NE(test::read_file(run + "/config.toml").find("init_from = \"" + base), std::string::npos);

  const std::pair<std::vector<std::string>, const char*> refused[] = {
      {{"--set", "train.init_from=" + dir + "/nothing"}, "nothing"},
      {{"--set", "train.init_from=" + base, "--set", "model.d_ff=48"},
       "[32, 16] there but [48, 16]"},
  };
  for (const auto& [sets, needle] : refused) {
    std::vector<std::string> args = {"--out", dir + "/refused"};
    args.insert(args.end(), sets.begin(), sets.end());
    expect_one_line_error(run_cemfrac(train_args(config, args)), needle);
    EXPECT_FALSE(fs::exists(dir + "/refused")) << needle;
  }
}

}  // namespace
}  // namespace cemfrac
