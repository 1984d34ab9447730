// The training loop on a toy model: exact resume, accumulation, metrics and summary files, the
// NaN guard, SIGINT, frozen parameters, and refusals (existing run, foreign config).
#include "cemfrac/train/trainer.h"

#include <gtest/gtest.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <csignal>
#include <filesystem>
#include <limits>
#include <sstream>

#include "cemfrac/core/atomic_file.h"
#include "tests/test_util.h"
#include "tests/train/toy_lm.h"

namespace cemfrac {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using test::make_toy_model;

constexpr int64_t kVocab = 32, kWidth = 16;

// One toy dataset for the whole file (its contents are deterministic).
const std::string& data_dir() {
  static const std::string dir = [] {
    const std::string d = test::temp_dir("trainer_data");
    test::write_toy_dataset(d, kVocab, 60, 10);
    return d;
  }();
  return dir;
}

TrainerOptions toy_options(const std::string& out, int64_t steps) {
  TrainerOptions o;
  o.train.steps = steps;
  o.train.micro_batch = 4;
  o.train.seq_len = 16;
  o.train.tokens_per_step = 2 * 4 * 16;  // two micro-batches per step
  o.train.lr_max = 3e-2;
  o.train.lr_min = 3e-3;
  o.train.warmup_steps = 3;
  o.train.weight_decay = 0.1;
  o.train.grad_clip = 1.0;
  o.train.seed = 1234;
  o.train.log_every = 1;
  o.train.eval_every = 4;
  o.train.eval_tokens = 256;
  o.train.checkpoint_every = 0;
  o.train.keep_checkpoints = 2;
  o.train.out = out;
  o.data_dir = data_dir();
  o.progress = false;
  return o;
}

std::vector<json> read_metrics(const std::string& run) {
  std::vector<json> out;
  std::istringstream in(read_file(run + "/metrics.jsonl"));
  for (std::string line; std::getline(in, line);) out.push_back(json::parse(line));
  return out;
}

TEST(Trainer, ResumeGivesBitwiseTheSameLosses) {
  const int64_t N = 10;  // 20 steps x 8 windows cross the end of the first epoch (~130 windows)
  // Uninterrupted: 2N steps.
  const std::string a = test::temp_dir("trainer_full");
  TrainModel ma = make_toy_model(kVocab, kWidth, 1);
  const TrainResult ra = Trainer(ma, toy_options(a, 2 * N)).run();
  EXPECT_EQ(ra.status, TrainStatus::kCompleted);
  EXPECT_EQ(ra.step, 2 * N);

  // Interrupted after N steps (same schedule), then resumed into a model initialised differently:
  // everything must come from the checkpoint.
  const std::string b = test::temp_dir("trainer_resumed");
  TrainerOptions first = toy_options(b, 2 * N);
  first.stop_at_step = N;
  const TrainResult rb1 = Trainer(make_toy_model(kVocab, kWidth, 1), first).run();
  EXPECT_EQ(rb1.status, TrainStatus::kStopped);
  EXPECT_EQ(rb1.last_checkpoint, b + "/checkpoints/step-000010");
  torch::manual_seed(555);
  (void)torch::randn({100});  // disturb the global RNG: the checkpoint must restore it
  TrainModel mb = make_toy_model(kVocab, kWidth, 999);
  TrainerOptions second = toy_options(b, 2 * N);
  second.resume = b;
  const TrainResult rb2 = Trainer(mb, second).run();
  EXPECT_EQ(rb2.status, TrainStatus::kCompleted);
  EXPECT_EQ(rb2.tokens, ra.tokens);

  const auto la = read_metrics(a), lb = read_metrics(b);
  ASSERT_EQ(la.size(), static_cast<size_t>(2 * N));
  ASSERT_EQ(lb.size(), la.size()) << "the resumed run continues the same metrics file";
  for (size_t i = 0; i < la.size(); ++i) {
    SCOPED_TRACE(fmt::format("step {}", i + 1));
    EXPECT_EQ(lb[i]["step"], la[i]["step"]);
    EXPECT_EQ(lb[i]["tokens"], la[i]["tokens"]);
    EXPECT_EQ(lb[i]["loss"].get<double>(), la[i]["loss"].get<double>()) << "bitwise";
    EXPECT_EQ(lb[i]["grad_norm"].get<double>(), la[i]["grad_norm"].get<double>());
    EXPECT_EQ(lb[i]["lr"].get<double>(), la[i]["lr"].get<double>());
    EXPECT_EQ(lb[i]["val_loss"], la[i]["val_loss"]);
  }
  for (const auto& [name, p] : parameters_by_name(*ma.module, ma.params))
    EXPECT_TRUE(torch::equal(p, parameters_by_name(*mb.module, mb.params).at(name))) << name;
  EXPECT_GE(load_checkpoint(rb2.last_checkpoint).trainer.loader.at("epoch").get<int64_t>(), 1)
      << "the test should cover resuming across an epoch boundary";
}

TEST(Trainer, AccumulationAveragesLikeOneBigBatch) {
  // 2 micro-batches of 4 see the same 8 windows as 1 micro-batch of 8: same loss and update up to
  // rounding. In float64: the two runs differ only by summation order, i.e. by A * u with u the
  // unit roundoff and A the amplification of 3 AdamW steps. In float32 (u = 6e-8) a rounding
  // difference in a gradient near cancellation is far above AdamW's eps and can flip that
  // coordinate's update by O(lr), so A depends on the CPU's summation order and no fixed float32
  // bound is safe; in float64 (u = 1.1e-16) such differences stay far below eps = 1e-8, the update
  // is continuous in them, and 1e-9 leaves a factor > 1e6 on A.
  TrainerOptions acc = toy_options(test::temp_dir("trainer_acc"), 3);
  TrainerOptions big = toy_options(test::temp_dir("trainer_big"), 3);
  big.train.micro_batch = 8;
  TrainModel m1 = make_toy_model(kVocab, kWidth, 3), m2 = make_toy_model(kVocab, kWidth, 3);
  m1.module->to(torch::kFloat64);
  m2.module->to(torch::kFloat64);
  Trainer t1(m1, acc), t2(m2, big);
  EXPECT_EQ(t1.accumulation_steps(), 2);
  EXPECT_EQ(t2.accumulation_steps(), 1);
  t1.run();
  t2.run();
  const auto l1 = read_metrics(acc.train.out), l2 = read_metrics(big.train.out);
  ASSERT_EQ(l1.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_NEAR(l1[i]["loss"].get<double>(), l2[i]["loss"].get<double>(), 1e-9) << i;
    EXPECT_NEAR(l1[i]["grad_norm"].get<double>(), l2[i]["grad_norm"].get<double>(), 1e-9) << i;
  }
}

TEST(Trainer, MetricsSummaryAndLearning) {
  const std::string run = test::temp_dir("trainer_metrics");
  TrainerOptions o = toy_options(run, 40);
  o.train.log_every = 5;
  o.train.eval_every = 20;
  o.train.checkpoint_every = 10;
  o.progress = true;  // stderr is not a TTY here: one line every log_every steps
  ::testing::internal::CaptureStderr();
  const TrainResult r = Trainer(make_toy_model(kVocab, kWidth, 4), o).run();
  const std::string progress = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(progress.find("step 5/40 | loss "), std::string::npos) << progress;
  EXPECT_NE(progress.find("step 40/40 | loss "), std::string::npos) << progress;
  EXPECT_NE(progress.find("| val "), std::string::npos) << progress;
  EXPECT_NE(progress.find(" tok/s | ETA "), std::string::npos) << progress;
  EXPECT_EQ(progress.find("step 4/40"), std::string::npos) << "only every log_every steps";
  EXPECT_EQ(progress.find('\r'), std::string::npos);
  const auto lines = read_metrics(run);
  ASSERT_EQ(lines.size(), 8u) << "every 5th step";
  const std::vector<std::string> keys = {"step", "tokens",    "loss",         "val_loss",
                                         "lr",   "grad_norm", "tokens_per_s", "elapsed_s"};
  for (const json& j : lines) {
    std::vector<std::string> got;
    for (auto it = j.begin(); it != j.end(); ++it) got.push_back(it.key());
    std::sort(got.begin(), got.end());
    std::vector<std::string> want = keys;
    std::sort(want.begin(), want.end());
    EXPECT_EQ(got, want) << j.dump();
    const int64_t step = j["step"];
    EXPECT_EQ(j["tokens"].get<int64_t>(), step * 128);
    EXPECT_EQ(j["val_loss"].is_null(), step % 20 != 0) << j.dump();
  }
  EXPECT_LT(lines.back()["loss"].get<double>(), lines.front()["loss"].get<double>() - 0.5)
      << "the toy model learns the data's structure";
  EXPECT_LT(*r.last_val_loss, std::log(static_cast<double>(kVocab)) - 0.5);
  const json summary = json::parse(read_file(run + "/summary.json"));
  EXPECT_EQ(summary["status"], "completed");
  EXPECT_EQ(summary["step"], 40);
  EXPECT_EQ(summary["last_checkpoint"], run + "/checkpoints/step-000040");
  const auto kept = list_checkpoints(run);
  ASSERT_EQ(kept.size(), 2u) << "keep_checkpoints = 2";
  EXPECT_EQ(kept[0].first, 30);
  EXPECT_EQ(kept[1].first, 40);
}

TEST(Trainer, ValidationIsDeterministic) {
  Trainer t(make_toy_model(kVocab, kWidth, 5), toy_options(test::temp_dir("trainer_val"), 1));
  const double v1 = t.evaluate().value(), v2 = t.evaluate().value();
  EXPECT_EQ(v1, v2);
  EXPECT_TRUE(std::isfinite(v1));
}

TEST(Trainer, NonFiniteLossStopsWithoutTouchingTheLastCheckpoint) {
  const std::string run = test::temp_dir("trainer_nan");
  TrainerOptions o = toy_options(run, 10);
  o.train.checkpoint_every = 1;
  std::string good_bytes;
  o.on_step = [&](Trainer& t, const StepMetrics& m) {
    if (m.step != 4) return;
    good_bytes = read_file(run + "/checkpoints/step-000004/model.safetensors");
    torch::NoGradGuard no_grad;
    parameters_by_name(*t.model().module, t.model().params).at("head.bias")[3] =
        std::numeric_limits<float>::quiet_NaN();
  };
  Trainer trainer(make_toy_model(kVocab, kWidth, 6), o);
  try {
    trainer.run();
    FAIL() << "training went on with a NaN parameter";
  } catch (const TrainingDiverged& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("step 5/10"), std::string::npos) << msg;
    EXPECT_NE(msg.find("non-finite loss"), std::string::npos) << msg;
    EXPECT_NE(msg.find("at lr "), std::string::npos) << msg;
    EXPECT_NE(msg.find("epoch 0 window "), std::string::npos) << msg;
    EXPECT_NE(msg.find("step-000004"), std::string::npos) << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  }
  EXPECT_EQ(trainer.step(), 4);
  const auto kept = list_checkpoints(run);
  ASSERT_FALSE(kept.empty());
  EXPECT_EQ(kept.back().first, 4) << "no checkpoint for the failed step";
  EXPECT_EQ(read_file(run + "/checkpoints/step-000004/model.safetensors"), good_bytes)
      << "the last good checkpoint is intact";
  const json summary = json::parse(read_file(run + "/summary.json"));
  EXPECT_EQ(summary["status"], "diverged");
  EXPECT_NE(summary["report"].get<std::string>().find("step 5/10"), std::string::npos);
  // It is a cemfrac::Error, so the CLI prints it as one line and exits non-zero.
  EXPECT_TRUE((std::is_base_of_v<Error, TrainingDiverged>));
}

TEST(Trainer, SigintCheckpointsAndStopsCleanly) {
  const std::string run = test::temp_dir("trainer_sigint");
  TrainerOptions o = toy_options(run, 10);
  o.on_step = [](Trainer&, const StepMetrics& m) {
    if (m.step == 3) std::raise(SIGINT);  // the handler only sets a flag
  };
  const TrainResult r = Trainer(make_toy_model(kVocab, kWidth, 7), o).run();
  EXPECT_EQ(r.status, TrainStatus::kInterrupted);
  EXPECT_EQ(r.step, 3);
  EXPECT_EQ(r.last_checkpoint, run + "/checkpoints/step-000003");
  EXPECT_EQ(json::parse(read_file(run + "/summary.json"))["status"], "interrupted");
  // The previous disposition is back after run().
  struct sigaction now {};
  sigaction(SIGINT, nullptr, &now);
  EXPECT_EQ(now.sa_handler, SIG_DFL);
  // And the run resumes from there.
  TrainerOptions again = toy_options(run, 10);
  again.resume = run;
  const TrainResult r2 = Trainer(make_toy_model(kVocab, kWidth, 7), again).run();
  EXPECT_EQ(r2.status, TrainStatus::kCompleted);
  EXPECT_EQ(r2.step, 10);
}

TEST(Trainer, FrozenParametersStayPutUntilUnfrozen) {
  const std::string run = test::temp_dir("trainer_frozen");
  TrainerOptions o = toy_options(run, 6);
  torch::Tensor gate_at_3;
  o.on_step = [&](Trainer& t, const StepMetrics& m) {
    if (m.step == 3) {
      gate_at_3 = parameters_by_name(*t.model().module, t.model().params).at("gate").clone();
      t.optimizer().unfreeze("gate", ParamGroup::kNoDecay);
    }
  };
  TrainModel m = make_toy_model(kVocab, kWidth, 8, /*freeze_gate=*/true);
  const torch::Tensor gate0 = parameters_by_name(*m.module, m.params).at("gate").clone();
  Trainer(m, o).run();
  const torch::Tensor gate = parameters_by_name(*m.module, m.params).at("gate");
  EXPECT_TRUE(torch::equal(gate_at_3, gate0)) << "frozen for steps 1-3";
  EXPECT_FALSE(torch::equal(gate, gate0)) << "trained after unfreezing";
}

// The data's cursor in trainer.json is checked by the data itself (TokenData::restore) on resume:
// a damaged one is one error naming the file.
TEST(Trainer, RefusesADamagedDataCursor) {
  const std::string run = test::temp_dir("trainer_cursor");
  const TrainResult r = Trainer(make_toy_model(kVocab, kWidth, 9), toy_options(run, 2)).run();
  const std::string trainer_json = r.last_checkpoint + "/" + kCheckpointTrainerFile;
  for (const nlohmann::json& bad :
       {nlohmann::json{{"epoch", 0}, {"index", "x"}}, nlohmann::json{{"epoch", -1}, {"index", 0}},
        nlohmann::json{{"gp_generator", "abc"}}}) {
    nlohmann::json j = nlohmann::json::parse(test::read_file(trainer_json));
    j["loader"] = bad;
    test::write_file(trainer_json, j.dump());
    TrainerOptions resume = toy_options(run, 4);
    resume.resume = run;
    try {
      Trainer(make_toy_model(kVocab, kWidth, 9), resume);
      ADD_FAILURE() << "resumed from the cursor " << bad.dump();
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(trainer_json), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("cursor"), std::string::npos) << e.what();
    }
  }
}

TEST(Trainer, RefusesToOverwriteARunOrLoadAForeignCheckpoint) {
  const std::string run = test::temp_dir("trainer_refuse");
  Trainer(make_toy_model(kVocab, kWidth, 9), toy_options(run, 2)).run();
  try {
    Trainer(make_toy_model(kVocab, kWidth, 9), toy_options(run, 2));
    FAIL() << "a fresh run over existing checkpoints";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--resume"), std::string::npos) << e.what();
  }
  TrainerOptions resume = toy_options(test::temp_dir("trainer_refuse2"), 4);
  resume.resume = run;
  TrainModel wider = make_toy_model(kVocab, 2 * kWidth, 9);
  try {
    Trainer(wider, resume);
    FAIL() << "resumed a checkpoint of another architecture";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("field 'd_model' is 16 but the run's model has 32"),
              std::string::npos)
        << e.what();
  }
  // Same config, other shapes (a model bug or a hand-edited config): named tensor by tensor.
  TrainModel lying = make_toy_model(kVocab, 2 * kWidth, 9);
  lying.config = test::toy_config(kVocab, kWidth);
  try {
    Trainer(lying, resume);
    FAIL() << "loaded tensors of the wrong shape";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("embed.weight: file [32, 16] vs model [32, 32]"),
              std::string::npos)
        << e.what();
  }
}

TEST(Trainer, RejectsBadSettings) {
  auto expect_error = [](TrainerOptions o, const std::string& what) {
    try {
      Trainer(make_toy_model(kVocab, kWidth, 10), o);
      ADD_FAILURE() << "no error for " << what;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  TrainerOptions o = toy_options(test::temp_dir("trainer_bad"), 2);
  o.train.tokens_per_step = 100;
  expect_error(o, "tokens_per_step");
  o = toy_options(test::temp_dir("trainer_bad"), 2);
  o.train.seq_len = 65;
  expect_error(o, "train.seq_len = 65: must be in 0..model.context = 64");
  o = toy_options(test::temp_dir("trainer_bad"), 2);
  o.data_dir = "/nonexistent";
  expect_error(o, "/nonexistent/train.bin");
  TrainModel small = make_toy_model(16, kWidth, 10);
  o = toy_options(test::temp_dir("trainer_bad"), 2);
  try {
    Trainer(small, o);
    ADD_FAILURE() << "vocabulary larger than the model's";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("vocab_size"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace cemfrac
