// `finetune` killed outright (SIGKILL: no handler runs, nothing is saved on the way out) at a random
// moment after its first checkpoint, then resumed as documented (`finetune --resume DIR` with the same
// task and flags): it continues from the last checkpoint it completed, and its metrics, its
// finetune.json (timings aside) and its final weights are the uninterrupted run's, bit for bit; the
// killed run left no finetune.json. And a reader racing the writer sees finetune.json either absent
// or whole.
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "tests/reliability/reliability_util.h"
#include "tests/test_util.h"

namespace cemfrac {
namespace {

namespace fs = std::filesystem;

// A pre-trained tiny byte-level model and a two-class TSV task of 40 examples: at batch 4 an epoch
// is 10 steps and a checkpoint (finetune checkpoints once per epoch); 80 epochs, 800 steps.
struct Fixture {
  std::string root, pretrained, task;
};

const Fixture& fixture() {
  static const Fixture f = [] {
    Fixture x;
    x.root = test::temp_dir("finetune_kill");
    const std::string run = x.root + "/pre";
    const test::RunResult r =
        test::run_cemfrac({"train", "--config", rel::write_config(x.root, run, 4), "--quiet"});
    if (r.exit_code != 0) throw std::runtime_error("pre-training failed: " + r.err);
    x.pretrained = run;
    x.task = x.root + "/task";
    std::string train, dev;
    for (int i = 0; i < 40; ++i) {
      train += (i % 2 ? "the cat sat on the mat " : "a dog ran far away ") + std::to_string(i) +
               "\t" + (i % 2 ? "cat" : "dog") + "\n";
      if (i < 10)
        dev += (i % 2 ? "a cat sat " : "the dog ran ") + std::to_string(i) + "\t" +
               (i % 2 ? "cat" : "dog") + "\n";
    }
    rel::put(x.task + "/train.tsv", train);
    rel::put(x.task + "/dev.tsv", dev);
    return x;
  }();
  return f;
}

std::vector<std::string> args(const std::vector<std::string>& where,
                              const std::string& epochs = "80") {
  std::vector<std::string> a = {
      "--threads",    "1",        "finetune", "--task",  "tsv", "--data",
      fixture().task, "--epochs", epochs,     "--batch", "4",   "--max-len",
      "16",           "--lr",     "1e-3",     "--seed",  "3",   "--quiet"};
  a.insert(a.end(), where.begin(), where.end());
  return a;
}

// finetune.json without what differs between two runs of the same job (paths, the resume source).
nlohmann::json report(const std::string& dir) {
  nlohmann::json j = nlohmann::json::parse(test::read_file(dir + "/finetune.json"));
  for (const char* key : {"checkpoint", "pretrained"}) j.erase(key);
  return j;
}

// metrics.jsonl's lines without their timings.
std::vector<nlohmann::json> metrics(const std::string& dir) {
  std::vector<nlohmann::json> out;
  const std::string text = test::read_file(dir + "/metrics.jsonl");
  for (size_t at = 0; at < text.size();) {
    const size_t end = text.find('\n', at);
    nlohmann::json line = nlohmann::json::parse(text.substr(at, end - at));
    for (const char* key : {"elapsed_s", "tokens_per_s", "step_s", "eval_s"}) line.erase(key);
    out.push_back(line);
    at = end == std::string::npos ? text.size() : end + 1;
  }
  return out;
}

std::string final_weights(const std::string& dir) {
  std::string last;
  for (const auto& e : fs::directory_iterator(dir + "/checkpoints"))
    if (e.path().filename().string() > fs::path(last).filename().string()) last = e.path().string();
  return test::read_file(last + "/model.safetensors");
}

TEST(FinetuneKill, AKilledFinetuneResumedGivesTheUninterruptedRun) {
  const Fixture& f = fixture();
  const std::string plain = f.root + "/plain";
  const test::RunResult p = test::run_cemfrac(args({"--checkpoint", f.pretrained, "--out", plain}));
  ASSERT_EQ(p.exit_code, 0) << p.err;

  const std::string dir = test::temp_dir("finetune_kill_run");
  const std::string run = dir + "/run";
  std::mt19937 rng{std::random_device{}()};
  const int delay_ms = std::uniform_int_distribution<int>(0, 150)(rng);
  SCOPED_TRACE(::testing::Message() << "killed " << delay_ms << " ms after the first checkpoint");
  {
    test::Background bg(args({"--checkpoint", f.pretrained, "--out", run}), dir);
    ASSERT_TRUE(bg.wait_for([&] { return test::has_complete_checkpoint(run + "/checkpoints"); }))
        << bg.err();
    std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
    // The run takes seconds and the delay is at most 0.15 s: it is still training.
    ASSERT_EQ(bg.stop(SIGKILL), 128 + SIGKILL) << "finetune ended before the kill: " << bg.err();
  }
  EXPECT_FALSE(fs::exists(run + "/finetune.json")) << "a killed run left a result behind";
  const nlohmann::json killed = nlohmann::json::parse(test::read_file(run + "/summary.json"));
  EXPECT_LT(killed["step"].get<int64_t>(), 800);

  const test::RunResult again = test::run_cemfrac(args({"--resume", run}));
  ASSERT_EQ(again.exit_code, 0) << again.err;
  EXPECT_EQ(report(run), report(plain));
  EXPECT_EQ(metrics(run), metrics(plain));
  EXPECT_EQ(final_weights(run), final_weights(plain)) << "the resumed weights differ";
}

TEST(FinetuneKill, AReaderRacingTheWriterSeesNoResultOrTheWholeOne) {
  const Fixture& f = fixture();
  const std::string dir = test::temp_dir("finetune_race");
  const std::string out = dir + "/out";
  int partial = 0, seen = 0;
  {
    test::Background bg(args({"--checkpoint", f.pretrained, "--out", out}), dir);
    bg.wait_for([&] {
      std::error_code ec;
      if (fs::exists(out + "/finetune.json", ec)) {
        const nlohmann::json j =
            nlohmann::json::parse(test::read_file(out + "/finetune.json"), nullptr, false);
        ++seen;
        if (j.is_discarded() || !j.contains("evals")) ++partial;
      }
      return false;  // poll until it exits
    });
    ASSERT_EQ(bg.wait(), 0) << bg.err();
  }
  EXPECT_EQ(partial, 0) << seen << " reads";
  EXPECT_TRUE(report(out).contains("evals"));
}

// One writer per run folder: while a fine-tuning runs, another one into its folder and a --resume of
// it are refused in one line (the resume naming the live writer) and write nothing; after the first
// stops, its metrics hold every step once, in order, and the resume goes through.
TEST(FinetuneKill, ASecondWriterOfALiveRunIsRefused) {
  const Fixture& f = fixture();
  const std::string dir = test::temp_dir("finetune_one_writer");
  const std::string run = dir + "/run";
  test::Background a(args({"--checkpoint", f.pretrained, "--out", run}, "5000"), dir);
  ASSERT_TRUE(a.wait_for([&] { return test::has_complete_checkpoint(run + "/checkpoints"); }))
      << a.err();
  const std::string holder = "(pid " + std::to_string(a.pid) + ", finetune)";
  test::expect_one_line_error(
      test::run_cemfrac(args({"--checkpoint", f.pretrained, "--out", run}, "5000")), run);
  test::expect_one_line_error(test::run_cemfrac(args({"--resume", run}, "5000")), holder);
  EXPECT_FALSE(fs::exists(run + "/finetune.json"));

  EXPECT_EQ(a.stop(SIGINT), 3) << a.err();
  const std::vector<nlohmann::json> lines = metrics(run);
  ASSERT_GE(lines.size(), 2u);
  for (size_t i = 1; i < lines.size(); ++i)
    EXPECT_GT(lines[i]["step"].get<int64_t>(), lines[i - 1]["step"].get<int64_t>());
  // The lock died with its holder: the run resumes (for ten more steps).
  const int64_t step = nlohmann::json::parse(test::read_file(run + "/summary.json"))["step"];
  const test::RunResult resumed = test::run_cemfrac(
      args({"--resume", run, "--stop-at-step", std::to_string(step + 10)}, "5000"));
  EXPECT_EQ(resumed.exit_code, 0) << resumed.err;
}

}  // namespace
}  // namespace cemfrac
