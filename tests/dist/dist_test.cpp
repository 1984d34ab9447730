// Data-parallel training on localhost: 2 ranks of the real cemfrac executable on a tiny
// model, through `cemfrac launch`, directly with torchrun's variables, and through torchrun itself
// when it is installed. Ports are never fixed: the launcher's store takes a free port from the OS,
// and the tests that start ranks by hand ask the OS for one.
//
// Exactness claim (derived, not tuned): rank r of w reads windows [r*A*B, (r+1)*A*B) of each global
// batch, so 2 ranks x micro-batch b see exactly the micro-batches 1 rank sees with 2 accumulation
// micro-batches of b, computed by the same kernels at the same thread count. One rank accumulates
// g0/2 + g1/2 (backward of loss/2: scaling by a power of two is exact in IEEE arithmetic barring
// under/overflow); two ranks get (g0 + g1)/2 from the all-reduce (one float add per element, which
// is commutative, then an exact halving). The loss is (l0 + l1)/2 in float64 both ways. So the runs
// are bitwise equal, and the tests demand that.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <torch/types.h>
#include <torch/utils.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "cemfrac/core/check.h"
#include "cemfrac/core/clock.h"
#include "cemfrac/model/lm_model.h"
#include "cemfrac/train/checkpoint.h"
#include "cemfrac/train/optimizer.h"
#include "cemfrac/dist/process_group.h"
#include "tests/model_test_util.h"
#include "tests/test_util.h"

namespace cemfrac {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

// A prepared byte-tokenizer dataset from generated text (a few seconds' worth of tiny steps).
std::string prepared_data() {
  const std::string dir = test::temp_dir("dist_data");
  uint64_t x = 42;
  const char* words[] = {"the", "cat", "sat", "on",    "a",     "mat", "and",   "dog",
                         "ran", "far", "in",  "green", "field", "of",  "stars", "quietly"};
  fs::create_directories(dir + "/corpus");
  for (int doc = 0; doc < 20; ++doc) {
    std::string text;
    for (int w = 0; w < 300; ++w) {
      x = x * 6364136223846793005ull + 1442695040888963407ull;
      text += words[(x >> 33) % 16];
      text += (w % 17 == 16) ? ".\n" : " ";
    }
    test::write_file(fmt::format("{}/corpus/doc{:02d}.txt", dir, doc), text);
  }
  auto r = test::run_cemfrac({"prepare", "--text", dir + "/corpus", "--tokenizer", "byte",
                              "--split", "80,10,10", "--out", dir + "/data"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  return dir + "/data";
}

// `train` arguments of a tiny Llama: seq_len 16, micro-batch 2, global batch 4 sequences.
std::vector<std::string> train_args(const std::string& data, const std::string& out, int steps,
                                    std::vector<std::string> extra = {}) {
  std::vector<std::string> a = {"--threads",
                                "1",
                                "train",
                                "--config",
                                test::source_path("configs/tiny-llama.toml"),
                                "--quiet",
                                "--out",
                                out,
                                "--set",
                                "data.path=" + data,
                                "--set",
                                "model.d_model=32",
                                "--set",
                                "model.d_ff=64",
                                "--set",
                                "model.context=16",
                                "--set",
                                "train.seq_len=16",
                                "--set",
                                "train.micro_batch=2",
                                "--set",
                                "train.tokens_per_step=64",
                                "--set",
                                "train.steps=" + std::to_string(steps),
                                "--set",
                                "train.warmup_steps=2",
                                "--set",
                                "train.log_every=1",
                                "--set",
                                "train.eval_every=0",
                                "--set",
                                "train.eval_tokens=256",
                                "--set",
                                "train.checkpoint_every=0",
                                "--set",
                                "train.keep_checkpoints=100"};
  a.insert(a.end(), extra.begin(), extra.end());
  return a;
}

std::vector<std::string> launch(int nproc, std::vector<std::string> args,
                                std::vector<std::string> flags = {}) {
  std::vector<std::string> a = {"launch", "--nproc", std::to_string(nproc)};
  a.insert(a.end(), flags.begin(), flags.end());
  a.push_back("--");
  a.insert(a.end(), args.begin(), args.end());
  return a;
}

// The CLI built with tests/dist/fault_injection.cpp, which reads CEMFRAC_FAULT (launch re-runs the
// same executable for every rank).
test::RunResult run_faulty(const std::vector<std::string>& args) {
  return test::run_program(CEMFRAC_FAULTS_EXE, args);
}

// Rank `rank` of 2 in a thread of this process, against a StoreServer on `port` (the launcher's
// store), and short timeouts with 2 KiB buckets: several buckets, several tensors per bucket.
DistEnv thread_rank_env(int rank, int port) {
  DistEnv env;
  env.rank = rank;
  env.world_size = 2;
  env.port = port;
  env.agent_store = true;
  return env;
}
DistOptions small_buckets() {
  DistOptions o;
  o.connect_timeout_s = 10;
  o.collective_timeout_s = 10;
  o.bucket_bytes = 2048;
  return o;
}

// The validation losses of metrics.jsonl (lines that have one).
std::vector<double> val_losses(const std::string& run) {
  std::vector<double> out;
  std::istringstream in(test::read_file(run + "/metrics.jsonl"));
  for (std::string line; std::getline(in, line);) {
    const json j = json::parse(line);
    if (!j["val_loss"].is_null()) out.push_back(j["val_loss"]);
  }
  return out;
}

std::vector<double> losses(const std::string& run) {
  std::vector<double> out;
  std::istringstream in(test::read_file(run + "/metrics.jsonl"));
  for (std::string line; std::getline(in, line);) out.push_back(json::parse(line)["loss"]);
  return out;
}

// The newest checkpoint's `file`, with its save id blanked: the id binds the parts of one checkpoint
// and hashes the trainer state, which differs between a 1-rank and a 2-rank run (their settings);
// the tensors and every other byte must still be equal. The id has a fixed length, so the header
// length is unchanged.
std::string newest_file(const std::string& run, const char* file) {
  const auto all = list_checkpoints(run);
  EXPECT_FALSE(all.empty()) << run;
  std::string bytes = all.empty() ? "" : test::read_file(all.back().second + "/" + file);
  const std::string key = "\"save_id\":\"";
  const size_t at = bytes.find(key);
  if (at != std::string::npos) {
    const size_t end = bytes.find('"', at + key.size());
    if (end != std::string::npos)
      bytes.replace(at + key.size(), end - at - key.size(), end - at - key.size(), '0');
  }
  return bytes;
}

// A TCP port nothing listens on right now (the OS's choice; closed again at once).
int free_port() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  EXPECT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  socklen_t len = sizeof a;
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  close(fd);
  return ntohs(a.sin_port);
}

// One process of the cemfrac executable with extra environment, output to files.
struct Proc {
  pid_t pid = -1;
  std::string out, err;
  int status = 0;

  Proc(const std::vector<std::string>& args, const std::map<std::string, std::string>& env) {
    const std::string dir = test::temp_dir("proc");
    out = dir + "/stdout";
    err = dir + "/stderr";
    pid = fork();
    if (pid == 0) {
      for (const auto& [k, v] : env) setenv(k.c_str(), v.c_str(), 1);
      if (!freopen(out.c_str(), "w", stdout) || !freopen(err.c_str(), "w", stderr)) _exit(126);
      std::vector<std::string> argv_s = {CEMFRAC_EXE};
      argv_s.insert(argv_s.end(), args.begin(), args.end());
      std::vector<char*> argv;
      for (auto& a : argv_s) argv.push_back(a.data());
      argv.push_back(nullptr);
      execv(argv[0], argv.data());
      _exit(127);
    }
  }
  // Waits at most `seconds`; false (and the process killed) when it did not end in time.
  bool wait(double seconds) {
    const auto until = Clock::now() + std::chrono::duration<double>(seconds);
    while (Clock::now() < until) {
      if (waitpid(pid, &status, WNOHANG) == pid) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
    return false;
  }
  int exit_code() const { return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status); }
  std::string stderr_text() const { return test::read_file(err); }
};

std::map<std::string, std::string> rank_env(int rank, int world, int port, bool agent_store,
                                            double timeout_s) {
  return {{"MASTER_ADDR", "127.0.0.1"},
          {"MASTER_PORT", std::to_string(port)},
          {"RANK", std::to_string(rank)},
          {"WORLD_SIZE", std::to_string(world)},
          {"LOCAL_RANK", std::to_string(rank)},
          {"TORCHELASTIC_USE_AGENT_STORE", agent_store ? "True" : "0"},
          {"CEMFRAC_CONNECT_TIMEOUT", fmt::format("{}", timeout_s)},
          {"CEMFRAC_COLLECTIVE_TIMEOUT", fmt::format("{}", timeout_s)}};
}

TEST(Distributed, TwoRanksEqualOneRankWithTwoAccumulationStepsBitwise) {
  const std::string data = prepared_data();
  const std::string one = test::temp_dir("dist_one"), two = test::temp_dir("dist_two");
  auto r1 = test::run_cemfrac(train_args(data, one + "/run", 4));
  ASSERT_EQ(r1.exit_code, 0) << r1.err;
  auto r2 = test::run_cemfrac(launch(2, train_args(data, two + "/run", 4)));
  ASSERT_EQ(r2.exit_code, 0) << r2.err;
  EXPECT_NE(r2.out.find("# data parallel: world 2, backend gloo, rank 0"), std::string::npos)
      << r2.out;
  EXPECT_NE(r2.out.find("gradient all-reduce overlapped with backward"), std::string::npos)
      << r2.out;
  // The after-backward path (train.dist_overlap = false) gives the same bits.
  auto r3 = test::run_cemfrac(
      launch(2, train_args(data, two + "/after", 4, {"--set", "train.dist_overlap=false"})));
  ASSERT_EQ(r3.exit_code, 0) << r3.err;
  EXPECT_NE(r3.out.find("gradient all-reduce after backward"), std::string::npos) << r3.out;
  const auto l1 = losses(one + "/run"), l2 = losses(two + "/run");
  ASSERT_EQ(l1.size(), 4u);
  EXPECT_EQ(l1, l2);  // bitwise (see the header comment)
  EXPECT_EQ(l1, losses(two + "/after"));
  // Validation (at the last step) is split across the ranks and still bitwise the 1-rank value.
  ASSERT_EQ(val_losses(one + "/run").size(), 1u);
  EXPECT_EQ(val_losses(one + "/run"), val_losses(two + "/run"));
  EXPECT_EQ(val_losses(one + "/run"), val_losses(two + "/after"));
  for (const std::string& run : {two + "/run", two + "/after"}) {
    EXPECT_EQ(newest_file(one + "/run", kCheckpointModelFile),
              newest_file(run, kCheckpointModelFile))
        << run;
    EXPECT_EQ(newest_file(one + "/run", kCheckpointOptimizerFile),
              newest_file(run, kCheckpointOptimizerFile))
        << run;
  }
  const json s1 = json::parse(test::read_file(one + "/run/summary.json"));
  const json s2 = json::parse(test::read_file(two + "/run/summary.json"));
  EXPECT_EQ(s1["accumulation_steps"], 2);
  EXPECT_EQ(s2["accumulation_steps"], 1);
  EXPECT_EQ(s1["tokens_per_step"], s2["tokens_per_step"]);
  EXPECT_EQ(s1["tokens"], s2["tokens"]);
  const json t2 =
      json::parse(test::read_file(list_checkpoints(two + "/run").back().second + "/trainer.json"));
  EXPECT_EQ(t2["world_size"], 2);
}

// Two ranks as threads of this process (a store from StoreServer, two Gloo groups): after
// allreduce_mean every parameter's gradient is exactly (g0 + g1) / 2 of the ranks' float64
// gradients from one backward pass each, with small buckets so that several parameters share one.
TEST(Distributed, AllReducedGradientIsTheMeanOfTheLocalGradients) {
  StoreServer store("127.0.0.1", 0, 10);
  const ModelConfig c = test::tiny_model(40, 32, 8);
  std::vector<std::vector<torch::Tensor>> local(2), reduced(2);
  std::vector<std::string> errors(2);
  auto rank_main = [&](int rank) {
    try {
      DistContext dist(thread_rank_env(rank, store.port()), small_buckets());
      torch::manual_seed(7);
      LmModel model(c);
      model->to(torch::kFloat64);
      torch::manual_seed(100 + rank);  // each rank its own batch
      const torch::Tensor tokens = torch::randint(0, c.vocab_size, {2, 9}, torch::kInt64);
      const torch::Tensor logits = model->forward(tokens.narrow(1, 0, 8));
      torch::cross_entropy_loss(logits.reshape({-1, c.vocab_size}),
                                tokens.narrow(1, 1, 8).reshape({-1}))
          .backward();
      std::vector<torch::Tensor> grads;
      for (const auto& p : model->parameters()) {
        grads.push_back(p.grad());
        local[rank].push_back(p.grad().clone());
      }
      dist.allreduce_mean(grads, "gradients");
      for (const auto& g : grads) reduced[rank].push_back(g.clone());
      dist.finish();
    } catch (const std::exception& e) {
      errors[rank] = e.what();
    }
  };
  std::thread t0(rank_main, 0), t1(rank_main, 1);
  t0.join();
  t1.join();
  ASSERT_EQ(errors[0], "");
  ASSERT_EQ(errors[1], "");
  ASSERT_EQ(local[0].size(), reduced[0].size());
  ASSERT_GT(local[0].size(), 4u);
  for (size_t i = 0; i < local[0].size(); ++i) {
    EXPECT_EQ(local[0][i].scalar_type(), torch::kFloat64);
    EXPECT_FALSE(torch::equal(local[0][i], local[1][i])) << i;  // the ranks' batches differ
    const torch::Tensor mean = (local[0][i] + local[1][i]) / 2;
    EXPECT_TRUE(torch::equal(reduced[0][i], mean)) << "parameter " << i;
    EXPECT_TRUE(torch::equal(reduced[1][i], mean)) << "parameter " << i;
  }
}

// The overlapped path (GradientReducer) in two threads of this process: two micro-batches per rank,
// only the second backward armed, small buckets; every gradient is exactly the mean over ranks of
// the locally accumulated gradients, and a parameter without a gradient stays without one.
TEST(Distributed, OverlappedReducerGivesTheMeanOfTheAccumulatedGradients) {
  StoreServer store("127.0.0.1", 0, 10);
  const ModelConfig c = test::tiny_model(40, 32, 8);
  std::vector<std::vector<torch::Tensor>> local(2), reduced(2);
  std::vector<std::string> errors(2);
  std::vector<int64_t> buckets(2);
  auto rank_main = [&](int rank) {
    try {
      DistContext dist(thread_rank_env(rank, store.port()), small_buckets());
      torch::manual_seed(7);
      LmModel model(c);
      model->to(torch::kFloat64);
      std::vector<torch::Tensor> params = model->parameters();
      params.front().set_requires_grad(false);  // like a frozen dyadic depth
      GradientReducer reducer(dist, params);
      buckets[rank] = reducer.buckets();
      torch::manual_seed(100 + rank);
      for (int micro = 0; micro < 2; ++micro) {
        const torch::Tensor tokens = torch::randint(0, c.vocab_size, {2, 9}, torch::kInt64);
        const torch::Tensor logits = model->forward(tokens.narrow(1, 0, 8));
        if (micro == 1) reducer.arm();
        (torch::cross_entropy_loss(logits.reshape({-1, c.vocab_size}),
                                   tokens.narrow(1, 1, 8).reshape({-1})) /
         2)
            .backward();
      }
      // What the two backward passes accumulated (finish() has not written the mean yet).
      for (const auto& p : params)
        local[rank].push_back(p.grad().defined() ? p.grad().clone() : torch::Tensor());
      reducer.finish();
      for (const auto& p : params)
        reduced[rank].push_back(p.grad().defined() ? p.grad().clone() : torch::Tensor());
      dist.finish();
    } catch (const std::exception& e) {
      errors[rank] = e.what();
    }
  };
  std::thread t0(rank_main, 0), t1(rank_main, 1);
  t0.join();
  t1.join();
  ASSERT_EQ(errors[0], "");
  ASSERT_EQ(errors[1], "");
  EXPECT_GT(buckets[0], 3);
  ASSERT_EQ(local[0].size(), reduced[0].size());
  EXPECT_FALSE(reduced[0][0].defined());
  EXPECT_FALSE(reduced[1][0].defined());
  for (size_t i = 1; i < local[0].size(); ++i) {
    EXPECT_FALSE(torch::equal(local[0][i], local[1][i])) << i;
    const torch::Tensor mean = (local[0][i] + local[1][i]) / 2;
    EXPECT_TRUE(torch::equal(reduced[0][i], mean)) << "parameter " << i;
    EXPECT_TRUE(torch::equal(reduced[1][i], mean)) << "parameter " << i;
  }
}

// Rank 1 gets its own --out: a rank other than 0 must not create it (config hashes ignore
// train.out).
TEST(Distributed, ResumeOfTwoRanksIsBitwiseExactAndOnlyRankZeroWrites) {
  const std::string data = prepared_data();
  const std::string dir = test::temp_dir("dist_resume");
  auto whole = test::run_cemfrac(launch(2, train_args(data, dir + "/whole", 6)));
  ASSERT_EQ(whole.exit_code, 0) << whole.err;

  auto run_pair = [&](std::vector<std::string> extra) {
    const int port = free_port();
    Proc p0(train_args(data, dir + "/split", 6, extra), rank_env(0, 2, port, false, 20));
    Proc p1(train_args(data, dir + "/rank1-out", 6, extra), rank_env(1, 2, port, false, 20));
    EXPECT_TRUE(p0.wait(60));
    EXPECT_TRUE(p1.wait(60));
    EXPECT_EQ(p0.exit_code(), 0) << p0.stderr_text();
    EXPECT_EQ(p1.exit_code(), 0) << p1.stderr_text();
  };
  run_pair({"--stop-at-step", "3"});
  ASSERT_EQ(list_checkpoints(dir + "/split").size(), 1u);
  run_pair({"--resume", dir + "/split"});
  EXPECT_FALSE(fs::exists(dir + "/rank1-out")) << "rank 1 wrote into its run directory";
  EXPECT_EQ(losses(dir + "/whole"), losses(dir + "/split"));
  EXPECT_EQ(newest_file(dir + "/whole", kCheckpointModelFile),
            newest_file(dir + "/split", kCheckpointModelFile));
  EXPECT_EQ(newest_file(dir + "/whole", kCheckpointOptimizerFile),
            newest_file(dir + "/split", kCheckpointOptimizerFile));

  // Another world size is refused with one line.
  auto other = test::run_cemfrac(train_args(data, dir + "/split", 8, {"--resume", dir + "/split"}));
  test::expect_one_line_error(other, "written by a run of 2 rank(s), resumed with 1");
}

TEST(Distributed, KilledRankStopsTheOthersNamingIt) {
  const std::string data = prepared_data();
  const std::string run = test::temp_dir("dist_kill") + "/run";
  setenv("CEMFRAC_FAULT", "1:3:kill", 1);
  const auto start = Clock::now();
  auto r = run_faulty(launch(2, train_args(data, run, 50, {"--set", "train.checkpoint_every=1"}),
                             {"--collective-timeout", "60", "--grace", "20"}));
  unsetenv("CEMFRAC_FAULT");
  // Well under the 60 s collective timeout (process start-up on a loaded machine takes seconds).
  EXPECT_LT(seconds_since(start), 45.0) << "a dead peer must be noticed at once, not by a timeout";
  EXPECT_NE(r.exit_code, 0);
  EXPECT_LT(r.exit_code, 128) << r.err;
  EXPECT_NE(r.err.find("rank 0 of 2: all-reduce of gradients failed: lost rank 1"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("launch: rank 1 of 2 was killed by signal 9"), std::string::npos) << r.err;
  // Steps 1 and 2 completed; the last complete checkpoint loads.
  const auto all = list_checkpoints(run);
  ASSERT_FALSE(all.empty());
  EXPECT_EQ(all.back().first, 2);
  EXPECT_NO_THROW(load_checkpoint(all.back().second));
}

TEST(Distributed, HungRankIsDetectedByTheCollectiveTimeout) {
  const std::string data = prepared_data();
  const std::string run = test::temp_dir("dist_hang") + "/run";
  setenv("CEMFRAC_FAULT", "1:2:hang", 1);
  const auto start = Clock::now();
  auto r = run_faulty(
      launch(2, train_args(data, run, 50), {"--collective-timeout", "2", "--grace", "1"}));
  unsetenv("CEMFRAC_FAULT");
  EXPECT_LT(seconds_since(start), 45.0);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("rank 0 of 2: all-reduce of gradients failed: rank 1 is alive but did not "
                       "join within the collective timeout of 2 s"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("launch: rank 0 of 2 exited with code 1"), std::string::npos) << r.err;
}

TEST(Distributed, NonFiniteGradientOnOneRankStopsEveryRank) {
  const std::string data = prepared_data();
  const std::string run = test::temp_dir("dist_nan") + "/run";
  setenv("CEMFRAC_FAULT", "1:2:nan", 1);
  auto r = run_faulty(launch(2, train_args(data, run, 50), {"--grace", "20"}));
  unsetenv("CEMFRAC_FAULT");
  EXPECT_NE(r.exit_code, 0);
  // Both ranks see the same reduced gradient and stop at the same step with the same report.
  size_t count = 0;
  for (size_t at = r.err.find("training stopped at step 2/50: non-finite gradient norm");
       at != std::string::npos; at = r.err.find("training stopped at step 2/50", at + 1))
    ++count;
  EXPECT_EQ(count, 2u) << r.err;
  EXPECT_EQ(json::parse(test::read_file(run + "/summary.json"))["status"], "diverged");
}

// The fault injection is a test executable's decorator: the cemfrac binary ignores CEMFRAC_FAULT
// and trains to the end.
TEST(Distributed, TheCemfracBinaryHasNoFaultInjection) {
  const std::string data = prepared_data();
  const std::string run = test::temp_dir("dist_nofault") + "/run";
  setenv("CEMFRAC_FAULT", "1:2:kill", 1);
  auto r = test::run_cemfrac(launch(2, train_args(data, run, 4), {"--grace", "20"}));
  unsetenv("CEMFRAC_FAULT");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(json::parse(test::read_file(run + "/summary.json"))["status"], "completed");
}

TEST(Distributed, WrongStorePortFailsWithinTheTimeout) {
  const int port = free_port();  // nothing listens there
  const auto start = Clock::now();
  Proc p(train_args("unused", test::temp_dir("dist_port") + "/run", 2),
         rank_env(1, 2, port, true, 2));
  ASSERT_TRUE(p.wait(30)) << "hung instead of failing";
  EXPECT_LT(seconds_since(start), 30.0);  // 2 s timeout + process start-up on a loaded machine
  test::RunResult r;
  r.exit_code = p.exit_code();
  r.err = p.stderr_text();
  test::expect_one_line_error(
      r, fmt::format("rank 1 of 2: cannot reach the rendezvous store at 127.0.0.1:{} within 2 s",
                     port));
}

TEST(Distributed, MismatchedConfigIsRefusedAtStart) {
  const std::string data = prepared_data();
  const std::string dir = test::temp_dir("dist_mismatch");
  const int port = free_port();
  Proc p0(train_args(data, dir + "/a", 4), rank_env(0, 2, port, false, 20));
  Proc p1(train_args(data, dir + "/b", 4, {"--set", "train.lr_max=0.01"}),
          rank_env(1, 2, port, false, 20));
  ASSERT_TRUE(p0.wait(60));
  ASSERT_TRUE(p1.wait(60));
  for (const Proc* p : {&p0, &p1}) {
    test::RunResult r;
    r.exit_code = p->exit_code();
    r.err = p->stderr_text();
    test::expect_one_line_error(r, "rank 1's run config hash");
  }
  EXPECT_FALSE(fs::exists(dir + "/a/checkpoints"));
}

// --stop-at-step is part of the run config hash: ranks stopping at different steps would leave one
// waiting for the other's next collective.
TEST(Distributed, MismatchedStopAtStepIsRefusedAtStart) {
  const std::string data = prepared_data();
  const std::string dir = test::temp_dir("dist_stop_at");
  const int port = free_port();
  Proc p0(train_args(data, dir + "/a", 6, {"--stop-at-step", "2"}),
          rank_env(0, 2, port, false, 20));
  Proc p1(train_args(data, dir + "/b", 6, {"--stop-at-step", "3"}),
          rank_env(1, 2, port, false, 20));
  ASSERT_TRUE(p0.wait(60));
  ASSERT_TRUE(p1.wait(60));
  for (const Proc* p : {&p0, &p1}) {
    test::RunResult r;
    r.exit_code = p->exit_code();
    r.err = p->stderr_text();
    test::expect_one_line_error(r, "rank 1's run config hash");
  }
  EXPECT_FALSE(fs::exists(dir + "/a/checkpoints"));
}

TEST(Distributed, SigintToTheLauncherStopsAllRanksWithOneCheckpoint) {
  const std::string data = prepared_data();
  const std::string run = test::temp_dir("dist_sigint") + "/run";
  Proc launcher(launch(2, train_args(data, run, 100000)), {});
  // Wait for training to be under way (a metrics line), then Ctrl-C the launcher.
  const auto until = Clock::now() + std::chrono::seconds(60);
  while (Clock::now() < until &&
         !(fs::exists(run + "/metrics.jsonl") && fs::file_size(run + "/metrics.jsonl") > 0))
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  kill(launcher.pid, SIGINT);
  ASSERT_TRUE(launcher.wait(60)) << launcher.stderr_text();
  // Every rank was interrupted (exit 3, checkpoint saved): the launcher exits 3 as `train` does,
  // not 1 naming rank 1 as failed.
  EXPECT_EQ(launcher.exit_code(), 3) << launcher.stderr_text();
  EXPECT_EQ(launcher.stderr_text().find("exited with code 3"), std::string::npos)
      << launcher.stderr_text();
  const auto all = list_checkpoints(run);
  ASSERT_EQ(all.size(), 1u) << launcher.stderr_text();
  const json summary = json::parse(test::read_file(run + "/summary.json"));
  EXPECT_EQ(summary["status"], "interrupted");
  EXPECT_EQ(summary["step"], all.back().first);
  EXPECT_LT(all.back().first, 100000);
}

// `cemfrac bench train --nproc 2` end to end on the tiny model (1 timed step, no warm-up): the
// three runs start (the rank programs by the executable's real path), and every reported number is
// there and positive, in --json and in the text table.
TEST(Distributed, BenchTrainNprocReportsPositiveRates) {
  const std::string data = prepared_data();
  std::vector<std::string> args = {
      "bench",    "train", "--config", test::source_path("configs/tiny-llama.toml"),
      "--nproc",  "2",     "--steps",  "1",
      "--warmup", "0"};
  for (const std::string& s : {"data.path=" + data, std::string("model.d_model=32"),
                               std::string("model.d_ff=64"), std::string("model.context=16"),
                               std::string("train.seq_len=16"), std::string("train.micro_batch=2")})
    args.insert(args.end(), {"--set", s});
  std::vector<std::string> as_json = args;
  as_json.push_back("--json");
  auto r = test::run_cemfrac(as_json);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json j = json::parse(r.out);
  EXPECT_EQ(j["nproc"], 2);
  EXPECT_EQ(j["global_tokens_per_step"], 2 * 2 * 16);
  for (const char* run : {"dp", "1x1", "1x2"})
    EXPECT_GT(j["tokens_per_s"][run].get<double>(), 0) << run << "\n" << r.out;
  for (const char* key : {"speedup_vs_1x1", "scaling_efficiency", "dp_vs_1xN",
                          "allreduce_ms_per_step", "allreduce_exposed_ms_per_step"})
    EXPECT_GT(j[key].get<double>(), 0) << key << "\n" << r.out;
  EXPECT_LE(j["allreduce_exposed_ms_per_step"].get<double>(),
            j["allreduce_ms_per_step"].get<double>() * 1.001 + 0.01);
  EXPECT_GE(j["allreduce_overlap_with_backward"].get<double>(), 0);
  EXPECT_EQ(j["dist_overlap"], true);
  // The text table, of the after-backward path.
  args.insert(args.end(), {"--set", "train.dist_overlap=false"});
  auto text = test::run_cemfrac(args);
  ASSERT_EQ(text.exit_code, 0) << text.err;
  for (const char* line : {"2 ranks x 1", "1 rank x 1", "1 rank x 2", "speed-up over 1x1",
                           "ms/step, exposed", "(train.dist_overlap = false)"})
    EXPECT_NE(text.out.find(line), std::string::npos) << line << "\n" << text.out;
}

TEST(Distributed, TorchrunStartsTheSameTraining) {
  if (std::system("command -v torchrun >/dev/null 2>&1") != 0)
    GTEST_SKIP() << "torchrun is not installed";
  // torchrun's own rendezvous store (elastic's c10d and static backends) is a TCPStore built with
  // the default options: Debian 13's torch 2.6 is built without libuv yet defaults to it, so that
  // store cannot start whatever the environment says (cemfrac's ranks turn libuv off themselves).
  if (std::system("/usr/bin/python3 -c 'import datetime, torch.distributed as d; "
                  "d.TCPStore(\"127.0.0.1\", 0, 1, True, datetime.timedelta(seconds=5))' "
                  ">/dev/null 2>&1") != 0)
    GTEST_SKIP() << "this torch's default TCPStore cannot start (built without libuv, which it asks "
                    "for by default: Debian's torch 2.x), so torchrun's rendezvous cannot either";
  const std::string data = prepared_data();
  const std::string dir = test::temp_dir("dist_torchrun");
  auto ours = test::run_cemfrac(launch(2, train_args(data, dir + "/ours", 3)));
  ASSERT_EQ(ours.exit_code, 0) << ours.err;
  // Debian's torchrun under Python 3.11 needs explicit -r/-t (its default 0 fails to parse).
  std::string cmd = fmt::format(
      "torchrun --standalone --nproc_per_node 2 --no_python -r 2 -t 2 --log_dir {}/logs {}", dir,
      CEMFRAC_EXE);
  for (const auto& a : train_args(data, dir + "/torchrun", 3)) cmd += " '" + a + "'";
  cmd += " >" + dir + "/out.txt 2>&1";
  const int status = std::system(cmd.c_str());
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << test::read_file(dir + "/out.txt");
  EXPECT_EQ(losses(dir + "/ours"), losses(dir + "/torchrun"));
}

// The multi-machine path: scripts/netns_demo.sh runs rank 0 and rank 1 in two network namespaces
// joined by a veth pair (Gloo over TCP between two addresses, the store on rank 0) and checks the
// losses against `cemfrac launch --nproc 2` here. Needs root and ip netns; skipped otherwise.
TEST(Distributed, TwoNetworkNamespacesEqualOneMachine) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root (ip netns add, ip link add)";
  if (std::system("ip netns list >/dev/null 2>&1") != 0)
    GTEST_SKIP() << "ip netns does not work here (iproute2 missing or no network namespaces)";
  const std::string data = prepared_data();
  const std::string dir = test::temp_dir("dist_netns");
  std::string cmd =
      test::source_path("scripts/netns_demo.sh") + " " + CEMFRAC_EXE + " " + dir + "/work --";
  for (const auto& a : train_args(data, "{out}", 3)) cmd += " '" + a + "'";
  cmd += " >" + dir + "/out.txt 2>&1";
  const int status = std::system(cmd.c_str());
  const std::string out = test::read_file(dir + "/out.txt");
  ASSERT_TRUE(WIFEXITED(status)) << out;
  if (WEXITSTATUS(status) == 2) GTEST_SKIP() << out;  // no CAP_NET_ADMIN (a container)
  ASSERT_EQ(WEXITSTATUS(status), 0) << out;
  EXPECT_NE(out.find("equal to cemfrac launch --nproc 2 on one machine (3 steps"),
            std::string::npos)
      << out;
}

TEST(Distributed, EnvironmentErrorsNameTheVariable) {
  setenv("WORLD_SIZE", "2", 1);
  setenv("RANK", "2", 1);
  std::string message;
  try {
    dist_env_from_environment();
  } catch (const Error& e) {
    message = e.what();
  }
  EXPECT_NE(message.find("RANK='2'"), std::string::npos) << message;
  unsetenv("RANK");
  unsetenv("WORLD_SIZE");
  const DistEnv one = dist_env_from_environment();
  EXPECT_EQ(one.world_size, 1);
  EXPECT_FALSE(DistContext(one, DistOptions{}).active());
}

}  // namespace
}  // namespace cemfrac

namespace cemfrac {
namespace {

// Where each rank trains: cuda without an index is one GPU per local rank, as torchrun's users
// expect; a named GPU shared by several local ranks, a local rank beyond the visible GPUs and a
// meta dry run are refused in one line naming the rank.
TEST(Distributed, EachCudaRankTakesItsLocalRanksGpu) {
  DistEnv env;
  env.rank = 3;
  env.world_size = 4;
  env.local_rank = 1;
  env.local_world_size = 2;
  EXPECT_EQ(data_parallel_device(c10::Device(c10::kCPU), false, env, 0), c10::Device(c10::kCPU));
  EXPECT_EQ(data_parallel_device(c10::Device(c10::kCUDA, 0), false, env, 2),
            c10::Device(c10::kCUDA, 1));
  try {
    data_parallel_device(c10::Device(c10::kCUDA, 0), false, env, 1);
    ADD_FAILURE() << "a local rank beyond the visible GPUs was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(
                  "rank 3 of 4: LOCAL_RANK 1 needs cuda:1, but only 1 GPU(s) are visible"),
              std::string::npos)
        << e.what();
  }
  try {
    data_parallel_device(c10::Device(c10::kCUDA, 1), true, env, 2);
    ADD_FAILURE() << "one named GPU for two local ranks was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cuda:1 names one GPU for all 2 ranks on this machine"),
              std::string::npos)
        << e.what();
  }
  env.local_world_size = 1;
  EXPECT_EQ(data_parallel_device(c10::Device(c10::kCUDA, 1), true, env, 2),
            c10::Device(c10::kCUDA, 1));
  try {
    data_parallel_device(c10::Device(c10::kMeta), false, env, 0);
    ADD_FAILURE() << "meta was accepted for a data-parallel rank";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("data-parallel ranks run on cpu or cuda, not meta"),
              std::string::npos)
        << e.what();
  }
}

// The same refusal through launch: every rank stops before it connects, and launch names it.
TEST(Distributed, MetaDeviceWithSeveralRanksIsOneLinePerRank) {
  const std::string run = test::temp_dir("dist_meta") + "/run";
  auto r = test::run_cemfrac({"--device", "meta", "launch", "--nproc", "2", "--", "--threads", "1",
                              "train", "--config", test::source_path("configs/tiny-llama.toml"),
                              "--quiet", "--out", run});
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_NE(r.err.find("data-parallel ranks run on cpu or cuda, not meta"), std::string::npos)
      << r.err;
  EXPECT_FALSE(fs::exists(run)) << "a refused run left a folder behind";
}

}  // namespace
}  // namespace cemfrac

namespace cemfrac {
namespace {

// shard_by_size: largest first to the least loaded rank, lowest rank on ties; every item owned.
TEST(Distributed, ShardBySizeBalancesLargestFirst) {
  EXPECT_EQ(shard_by_size({10, 40, 30, 20}, 2), (std::vector<int64_t>{0, 0, 1, 1}));
  EXPECT_EQ(shard_by_size({5, 5, 5}, 1), (std::vector<int64_t>{0, 0, 0}));
  EXPECT_EQ(shard_by_size({7}, 3), (std::vector<int64_t>{0}));
  std::vector<ParamInfo> table(4);
  for (int i = 0; i < 4; ++i) table[i].numel = (i + 1) * 10;  // 10, 20, 30, 40
  const ShardedStateBytes b = sharded_state_bytes(table, 2);
  EXPECT_EQ(b.whole, 2 * 100 * 4);
  EXPECT_EQ(b.largest_shard, 2 * 50 * 4);  // {40, 10} and {30, 20}
}

// train.shard_optimizer (ZeRO stage 1) changes where AdamW state lives, not the arithmetic: each
// parameter is updated by its owner with the same kernel on the same all-reduced gradient, then
// broadcast bit for bit. So the run equals plain data parallel (and one rank with two
// accumulation micro-batches) bitwise, losses and checkpoint files, also across a stop and a
// resume (the checkpoint gathers the whole state on rank 0; a resumed rank keeps its share). The
// CoFrGeNet run adds parameters that join the optimizer mid-run (the dyadic schedule).
TEST(Distributed, ShardedOptimizerStateGivesTheSameBitsAsPlainDataParallel) {
  const std::string data = prepared_data();
  const std::string dir = test::temp_dir("dist_shard");
  const std::vector<std::string> shard = {"--set", "train.shard_optimizer=true", "--set",
                                          "train.checkpoint_every=3"};
  for (const char* preset : {"configs/tiny-llama.toml", "configs/tiny-cofrgenet.toml"}) {
    SCOPED_TRACE(preset);
    const std::string tag = fs::path(preset).stem().string();
    auto with_preset = [&](std::vector<std::string> args) {
      for (auto& a : args)
        if (a == test::source_path("configs/tiny-llama.toml")) a = test::source_path(preset);
      return args;
    };
    const std::string plain = dir + "/" + tag + "-plain", sharded = dir + "/" + tag + "-sharded";
    auto r1 = test::run_cemfrac(launch(2, with_preset(train_args(data, plain, 6))));
    ASSERT_EQ(r1.exit_code, 0) << r1.err;
    auto r2 = test::run_cemfrac(
        launch(2, with_preset(train_args(data, sharded, 6, shard)), {"--grace", "20"}));
    ASSERT_EQ(r2.exit_code, 0) << r2.err;
    EXPECT_NE(r2.out.find("# optimizer state sharded over 2 ranks"), std::string::npos) << r2.out;
    ASSERT_EQ(losses(plain).size(), 6u);
    EXPECT_EQ(losses(plain), losses(sharded));
    EXPECT_EQ(newest_file(plain, kCheckpointModelFile), newest_file(sharded, kCheckpointModelFile));
    EXPECT_EQ(newest_file(plain, kCheckpointOptimizerFile),
              newest_file(sharded, kCheckpointOptimizerFile));
  }
  // Stopped at a checkpoint and resumed, still the same bits.
  const std::string split = dir + "/split";
  std::vector<std::string> stop = shard;
  stop.insert(stop.end(), {"--stop-at-step", "3"});
  auto a = test::run_cemfrac(launch(2, train_args(data, split, 6, stop)));
  ASSERT_EQ(a.exit_code, 0) << a.err;
  std::vector<std::string> resume = shard;
  resume.insert(resume.end(), {"--resume", split});
  auto b = test::run_cemfrac(launch(2, train_args(data, split, 6, resume)));
  ASSERT_EQ(b.exit_code, 0) << b.err;
  EXPECT_EQ(losses(dir + "/tiny-llama-plain"), losses(split));
  EXPECT_EQ(newest_file(dir + "/tiny-llama-plain", kCheckpointOptimizerFile),
            newest_file(split, kCheckpointOptimizerFile));
}

}  // namespace
}  // namespace cemfrac

namespace cemfrac {
namespace {

// Gradient sharding in two threads of this process: with owners, each gradient ends as the exact
// mean over ranks on its owner and undefined elsewhere, on both reduction paths (overlapped with
// backward and after it), with small buckets so that buckets of several parameters exist.
TEST(Distributed, ShardedGradientsAreTheMeanOnTheirOwnerOnly) {
  for (const bool overlap : {true, false}) {
    SCOPED_TRACE(overlap ? "overlapped" : "after backward");
    StoreServer store("127.0.0.1", 0, 10);
    const ModelConfig c = test::tiny_model(40, 32, 8);
    std::vector<std::vector<torch::Tensor>> local(2), reduced(2);
    std::vector<std::string> errors(2);
    std::vector<int64_t> owners;
    // Models and batches made here: the threads must not race on torch's global generator.
    std::vector<LmModel> models, twins;
    std::vector<torch::Tensor> batches;
    for (int rank = 0; rank < 2; ++rank) {
      for (auto* list : {&models, &twins}) {
        torch::manual_seed(7);
        list->emplace_back(c);
        list->back()->to(torch::kFloat64);
      }
      torch::manual_seed(100 + rank);
      batches.push_back(torch::randint(0, c.vocab_size, {2, 9}, torch::kInt64));
    }
    auto rank_main = [&](int rank) {
      try {
        DistContext dist(thread_rank_env(rank, store.port()), small_buckets());
        LmModel& model = models[rank];
        const std::vector<torch::Tensor> params = model->parameters();
        std::vector<int64_t> own;
        for (size_t i = 0; i < params.size(); ++i) own.push_back(i % 3 == 0 ? 1 : 0);
        if (rank == 0) owners = own;
        dist.attach_gradients(params, overlap, own);
        const torch::Tensor& tokens = batches[rank];
        auto loss_of = [&](LmModel& m) {
          return torch::cross_entropy_loss(
              m->forward(tokens.narrow(1, 0, 8)).reshape({-1, c.vocab_size}),
              tokens.narrow(1, 1, 8).reshape({-1}));
        };
        // This rank's own gradients, from a twin model (the overlapped path drops the other
        // owner's gradients during backward).
        LmModel& twin = twins[rank];
        loss_of(twin).backward();
        for (const auto& p : twin->parameters()) local[rank].push_back(p.grad().clone());
        dist.before_last_backward(1);
        loss_of(model).backward();
        dist.reduce_gradients();
        for (const auto& p : params)
          reduced[rank].push_back(p.grad().defined() ? p.grad().clone() : torch::Tensor());
        dist.finish();
      } catch (const std::exception& e) {
        errors[rank] = e.what();
      }
    };
    std::thread t0(rank_main, 0), t1(rank_main, 1);
    t0.join();
    t1.join();
    ASSERT_EQ(errors[0], "");
    ASSERT_EQ(errors[1], "");
    ASSERT_GT(owners.size(), 4u);
    for (size_t i = 0; i < owners.size(); ++i) {
      const int64_t o = owners[i];
      EXPECT_FALSE(reduced[1 - o][i].defined()) << "parameter " << i << " kept off its owner";
      ASSERT_TRUE(reduced[o][i].defined()) << "parameter " << i;
      EXPECT_TRUE(torch::equal(reduced[o][i], (local[0][i] + local[1][i]) / 2)) << i;
    }
  }
}

// ZeRO stage 2 on the real trainer: with clipping off (the one place sharding changes the order
// of a sum: the gradient norm's squares, added per rank and then over ranks), the run equals plain
// data parallel bitwise on both reduction paths, and across a stop and a resume.
TEST(Distributed, ShardedGradientsGiveTheSameBitsWithoutClipping) {
  const std::string data = prepared_data();
  const std::string dir = test::temp_dir("dist_zero2");
  const std::vector<std::string> noclip = {"--set", "train.grad_clip=0", "--set",
                                           "train.checkpoint_every=3"};
  std::vector<std::string> zero2 = noclip;
  zero2.insert(zero2.end(),
               {"--set", "train.shard_optimizer=true", "--set", "train.shard_gradients=true"});
  auto r1 = test::run_cemfrac(launch(2, train_args(data, dir + "/plain", 6, noclip)));
  ASSERT_EQ(r1.exit_code, 0) << r1.err;
  auto r2 = test::run_cemfrac(launch(2, train_args(data, dir + "/zero2", 6, zero2)));
  ASSERT_EQ(r2.exit_code, 0) << r2.err;
  std::vector<std::string> after = zero2;
  after.insert(after.end(), {"--set", "train.dist_overlap=false", "--stop-at-step", "3"});
  auto r3 = test::run_cemfrac(launch(2, train_args(data, dir + "/after", 6, after)));
  ASSERT_EQ(r3.exit_code, 0) << r3.err;
  after.resize(after.size() - 2);
  after.insert(after.end(), {"--resume", dir + "/after"});
  auto r4 = test::run_cemfrac(launch(2, train_args(data, dir + "/after", 6, after)));
  ASSERT_EQ(r4.exit_code, 0) << r4.err;
  ASSERT_EQ(losses(dir + "/plain").size(), 6u);
  for (const char* run : {"/zero2", "/after"}) {
    EXPECT_EQ(losses(dir + "/plain"), losses(dir + run)) << run;
    EXPECT_EQ(newest_file(dir + "/plain", kCheckpointModelFile),
              newest_file(dir + run, kCheckpointModelFile))
        << run;
    EXPECT_EQ(newest_file(dir + "/plain", kCheckpointOptimizerFile),
              newest_file(dir + run, kCheckpointOptimizerFile))
        << run;
  }
  // Without shard_optimizer it is refused in one line.
  auto bad =
      test::run_cemfrac(train_args(data, dir + "/bad", 2, {"--set", "train.shard_gradients=true"}));
  test::expect_one_line_error(bad, "shard_gradients = true needs shard_optimizer = true");
}

}  // namespace
}  // namespace cemfrac
