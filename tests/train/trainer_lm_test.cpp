// The trainer, checkpoints and sliding-window eval with the real LmModel (through
// make_train_model), for both flavours: exact resume, tied tensors stored once, and eval counting.
#include <gtest/gtest.h>
#include <torch/types.h>

#include <set>
#include <sstream>

#include "cemfrac/core/atomic_file.h"
#include "cemfrac/eval/perplexity.h"
#include "cemfrac/model/lm_model.h"
#include "cemfrac/train/trainer.h"
#include "tests/model_test_util.h"
#include "tests/test_util.h"
#include "tests/train/toy_lm.h"

namespace cemfrac {
namespace {

using json = nlohmann::json;

ModelConfig tiny(bool gpt2) {
  ModelConfig c = test::tiny_model(32, 32, 32);
  if (gpt2) {
    c = test::gpt2_flavour(c);
    c.ffn = "gelu_mlp";
  }
  return c;
}

TrainerOptions options(const std::string& out, const std::string& data, int64_t steps) {
  TrainerOptions o = test::tiny_trainer_options(out, data, steps, /*tokens_per_step=*/64);
  o.train.eval_every = 3;
  o.train.eval_tokens = 64;
  return o;
}

class TrainerLm : public ::testing::TestWithParam<bool> {};

TEST_P(TrainerLm, ResumeIsExactAndCheckpointsHoldEachTensorOnce) {
  const bool gpt2 = GetParam();
  const std::string data = test::temp_dir("trainer_lm_data");
  test::write_toy_dataset(data, 32, 30, 6);
  const ModelConfig config = tiny(gpt2);

  const std::string a = test::temp_dir("trainer_lm_a");
  seed_everything(1);
  TrainModel ma = make_train_model(LmModel(config));
  Trainer(ma, options(a, data, 8)).run();

  const std::string b = test::temp_dir("trainer_lm_b");
  TrainerOptions first = options(b, data, 8);
  first.stop_at_step = 4;
  seed_everything(1);
  Trainer(make_train_model(LmModel(config)), first).run();
  TrainerOptions second = options(b, data, 8);
  second.resume = b;
  seed_everything(2);  // another init: the checkpoint must overwrite all of it
  TrainModel mb = make_train_model(LmModel(config));
  Trainer(mb, second).run();

  const auto la = test::metrics_losses(a), lb = test::metrics_losses(b);
  ASSERT_EQ(la.size(), 8u);
  ASSERT_EQ(lb.size(), 8u);
  for (size_t i = 0; i < 8; ++i) EXPECT_EQ(la[i], lb[i]) << "step " << i + 1 << ", bitwise";

  // model.safetensors holds exactly the parameter table's tensors (tied ones once).
  const SafetensorsFile saved = load_safetensors(b + "/checkpoints/step-000008/model.safetensors");
  std::set<std::string> names, table;
  for (const auto& [name, t] : saved.tensors) names.insert(name);
  for (const ParamInfo& p : mb.params) table.insert(p.name);
  EXPECT_EQ(names, table);
  EXPECT_EQ(names.count("head.weight"), gpt2 ? 0u : 1u) << "a tied head is stored once, as wte";
  const json config_json = json::parse(read_file(b + "/checkpoints/step-000008/config.json"));
  EXPECT_EQ(model_config_from_json(config_json), config);
}

TEST_P(TrainerLm, EvalScoresEveryTokenOnce) {
  const ModelConfig config = tiny(GetParam());
  seed_everything(3);
  LmModel model(config);
  model->eval();
  const torch::Tensor tokens = torch::randint(0, 32, {77}, torch::kInt64);
  int64_t calls = 0;
  LogitsFn logits = [&](const torch::Tensor& x) {
    ++calls;
    return model->forward(x);
  };
  PerplexityOptions o;
  o.context = config.context;
  o.stride = 8;
  o.batch_size = 2;
  const PerplexityResult r = evaluate_perplexity(logits, tokens, o, 300);
  EXPECT_EQ(r.tokens_scored, 76);
  EXPECT_EQ(r.windows, 1 + (76 - 32 + 7) / 8);
  EXPECT_EQ(calls, (r.windows + 1) / 2);
  EXPECT_GT(r.mean_loss, 0.0);
  EXPECT_NEAR(r.mean_loss, std::log(32.0), 1.0) << "an untrained model is near uniform";
  // Stride 1 gives later targets 32 tokens of history, stride 32 as little as 1: a model that
  // uses its history scores the two differently.
  o.stride = 1;
  o.batch_size = 16;
  const double total1 = evaluate_perplexity(logits, tokens, o).total_nats;
  const double total32 = [&] {
    o.stride = 32;
    return evaluate_perplexity(logits, tokens, o).total_nats;
  }();
  EXPECT_NE(total1, total32) << "more history changes the scores of a model that uses it";
}

INSTANTIATE_TEST_SUITE_P(Flavours, TrainerLm, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? std::string("Gpt2") : std::string("Llama");
                         });

}  // namespace
}  // namespace cemfrac
