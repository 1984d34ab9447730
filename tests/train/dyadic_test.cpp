// The dyadic depth schedule of CoFrGeNet ladders in the trainer (CoFrGeNet spec §4, spec §8
// property 18) and eval-time clipping of ladder outputs with its checkpoint round trip (property
// 20): depth-i tensors are bitwise unchanged (no update, no decay, no optimizer state) until step
// ceil(t (1 - 2^-i)) and change after it; depth 0 changes from the first step; resuming gives the
// same steps bit for bit, with and without `truncate`.
#include <gtest/gtest.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <map>
#include <sstream>

#include "cemfrac/core/atomic_file.h"
#include "cemfrac/layers/cofrgenet/cffn.h"
#include "cemfrac/layers/cofrgenet/dyadic.h"
#include "cemfrac/model/lm_model.h"
#include "cemfrac/train/model_loader.h"
#include "cemfrac/train/trainer.h"
#include "tests/model_test_util.h"
#include "tests/test_util.h"
#include "tests/train/toy_lm.h"

namespace cemfrac {
namespace {

using json = nlohmann::json;

TEST(Dyadic, Thresholds) {
  const int64_t t = 19073;
  const std::vector<int64_t> expected = {0, 9537, 14305, 16689, 17881, 18477};
  for (int64_t i = 0; i <= 5; ++i) EXPECT_EQ(dyadic_start(i, t), expected[i]) << "depth " << i;
  for (int64_t i = 1; i <= 5; ++i) {
    // ceil(t (1 - 2^-i)) computed in exact rational arithmetic.
    EXPECT_EQ(dyadic_start(i, t), (t * ((int64_t{1} << i) - 1) + (int64_t{1} << i) - 1) >> i);
    EXPECT_EQ(dyadic_active_depth(expected[i] - 1, t, 5), i - 1);
    EXPECT_EQ(dyadic_active_depth(expected[i], t, 5), i);
  }
  EXPECT_EQ(dyadic_active_depth(0, t, 5), 0);
  EXPECT_EQ(dyadic_active_depth(t - 1, t, 5), 5);
  EXPECT_EQ(dyadic_active_depth(t - 1, t, 3), 3) << "capped at the ladder depth";
  EXPECT_EQ(dyadic_start(1, 1), 1) << "a one-step run never trains depth 1";
  EXPECT_EQ(dyadic_start(3, 16), 14);
}

ModelConfig cofr_tiny(bool truncate) {
  ModelConfig c = test::gpt2_flavour(test::tiny_model(32, 32, 16));
  c.mixer = "cattn_m";
  c.ffn = "cffn";
  c.cofrgenet.depth = 3;
  c.cofrgenet.m_depth = 2;
  c.cofrgenet.truncate = truncate;
  return c;
}

TrainerOptions options(const std::string& out, const std::string& data, int64_t steps) {
  TrainerOptions o = test::tiny_trainer_options(out, data, steps, /*tokens_per_step=*/32);
  o.train.weight_decay = 0.1;
  o.train.eval_every = 0;
  o.train.eval_tokens = 32;
  return o;
}

std::string dataset() {
  static const std::string dir = [] {
    const std::string d = test::temp_dir("dyadic_data");
    test::write_toy_dataset(d, 32, 30, 6);
    return d;
  }();
  return dir;
}

TEST(Dyadic, FrozenDepthsAreBitwiseUnchangedUntilTheirStep) {
  const int64_t t = 16;  // starts: depth 1 at 8, depth 2 at 12, depth 3 at 14
  seed_everything(5);
  LmModel model(cofr_tiny(false));
  TrainModel tm = make_train_model(model);
  std::map<std::string, int64_t> depth_of;
  for (const ParamInfo& p : tm.params) depth_of[p.name] = p.depth;
  const std::vector<std::string> watched = {
      "blocks.0.mlp.w_gate",      "blocks.0.mlp.w_out",       "blocks.0.mlp.w_ladder_1",
      "blocks.0.mlp.w_ladder_2",  "blocks.1.mlp.w_ladder_3",  "blocks.1.mlp.b_ladder_2",
      "blocks.0.attn.w_ladder_1", "blocks.0.attn.b_ladder_2", "blocks.1.attn.w_logits"};
  ASSERT_EQ(depth_of.at("blocks.0.mlp.w_gate"), 0);
  ASSERT_EQ(depth_of.at("blocks.1.mlp.w_ladder_3"), 3);
  ASSERT_EQ(depth_of.at("blocks.0.attn.b_ladder_2"), 2);
  const auto named = model->named_parameters();
  std::map<std::string, torch::Tensor> initial;
  for (const std::string& n : watched) initial[n] = named[n].detach().clone();

  TrainerOptions o = options(test::temp_dir("dyadic_frozen"), dataset(), t);
  int checks = 0;
  o.on_step = [&](Trainer& trainer, const StepMetrics& m) {
    // m.step steps are done; step index m.step - 1 was the last one run.
    for (const std::string& n : watched) {
      const int64_t start = dyadic_start(depth_of.at(n), t);
      const bool same = torch::equal(named[n], initial.at(n));
      const bool has_state = trainer.optimizer().state_tensors().count(n + ".exp_avg") > 0;
      if (m.step <= start) {
        EXPECT_TRUE(same) << n << " changed by step " << m.step << " before its start " << start;
        EXPECT_FALSE(has_state) << n << " has AdamW state at step " << m.step;
        EXPECT_TRUE(trainer.optimizer().is_frozen(n) || start == 0);
      } else {
        EXPECT_FALSE(same) << n << " unchanged after its start " << start << " (step " << m.step
                           << ")";
        EXPECT_TRUE(has_state) << n;
      }
      ++checks;
    }
  };
  Trainer(tm, o).run();
  EXPECT_EQ(checks, static_cast<int>(watched.size() * t));
}

TEST(Dyadic, TrainDyadicFalseTrainsEveryDepthFromTheStart) {
  seed_everything(5);
  LmModel model(cofr_tiny(false));
  const torch::Tensor w3 = model->named_parameters()["blocks.0.mlp.w_ladder_3"].detach().clone();
  TrainerOptions o = options(test::temp_dir("dyadic_off"), dataset(), 2);
  o.train.dyadic = false;
  Trainer(make_train_model(model), o).run();
  EXPECT_FALSE(torch::equal(model->named_parameters()["blocks.0.mlp.w_ladder_3"], w3));
}

class DyadicResume : public ::testing::TestWithParam<bool> {};

TEST_P(DyadicResume, ResumeIsBitwiseAcrossUnfreezingSteps) {
  const ModelConfig config = cofr_tiny(GetParam());
  const int64_t t = 16;
  const std::string a = test::temp_dir("dyadic_a");
  seed_everything(1);
  LmModel ma(config);
  Trainer(make_train_model(ma), options(a, dataset(), t)).run();

  const std::string b = test::temp_dir("dyadic_b");
  TrainerOptions first = options(b, dataset(), t);
  first.stop_at_step = 9;  // between the starts of depth 1 (8) and depth 2 (12)
  seed_everything(1);
  Trainer(make_train_model(LmModel(config)), first).run();
  TrainerOptions second = options(b, dataset(), t);
  second.resume = b;
  seed_everything(2);
  LmModel mb(config);
  Trainer(make_train_model(mb), second).run();

  const auto la = test::metrics_losses(a), lb = test::metrics_losses(b);
  ASSERT_EQ(la.size(), static_cast<size_t>(t));
  ASSERT_EQ(lb.size(), static_cast<size_t>(t));
  for (size_t i = 0; i < la.size(); ++i) EXPECT_EQ(la[i], lb[i]) << "step " << i + 1 << ", bitwise";
  const auto pa = ma->named_parameters(), pb = mb->named_parameters();
  for (const auto& item : pa) EXPECT_TRUE(torch::equal(item.value(), pb[item.key()])) << item.key();
  const auto ba = state_buffers(*ma), bb = state_buffers(*mb);
  ASSERT_EQ(ba.size(), bb.size());
  for (size_t i = 0; i < ba.size(); ++i)
    EXPECT_TRUE(torch::equal(ba[i].second, bb[i].second)) << ba[i].first;
}

INSTANTIATE_TEST_SUITE_P(Truncate, DyadicResume, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "truncate" : "keep"; });

// Property 20: the recorded ranges are saved in the checkpoint, load back, and bound the eval-mode
// ladder outputs; train mode does not clip.
TEST(EvalClipping, RangesRoundTripAndClipOnlyInEval) {
  const ModelConfig config = cofr_tiny(false);
  const std::string run = test::temp_dir("dyadic_clip");
  seed_everything(3);
  LmModel model(config);
  Trainer(make_train_model(model), options(run, dataset(), 6)).run();

  const std::string ckpt = run + "/checkpoints/step-000006";
  const SafetensorsFile saved = load_safetensors(ckpt + "/buffers.safetensors");
  const auto buffers = state_buffers(*model);
  ASSERT_EQ(saved.tensors.size(), buffers.size());
  ASSERT_EQ(buffers.size(), 8u) << "z_min, z_max of 2 cffn and 2 cattn_m";
  for (const auto& [name, tensor] : buffers) {
    EXPECT_TRUE(torch::equal(saved.tensors.at(name), tensor)) << name;
    EXPECT_TRUE(torch::isfinite(tensor).all().item<bool>()) << name << " was recorded";
  }
  // A fresh model: ranges unset, so eval mode does not clip (same logits as train mode).
  seed_everything(4);
  LmModel fresh(config);
  {
    torch::NoGradGuard ng;
    const torch::Tensor tokens = torch::randint(0, 32, {2, 16}, torch::kInt64);
    const torch::Tensor train_logits = fresh->forward(tokens);
    fresh->eval();
    const torch::Tensor eval_logits = fresh->forward(tokens);
    fresh->train();
    EXPECT_TRUE(torch::isfinite(eval_logits).all().item<bool>());
    EXPECT_TRUE(torch::equal(train_logits, eval_logits)) << "nothing recorded: no clipping";
  }
  Checkpoint c = load_checkpoint(ckpt, LoadOptions{false, nullptr});
  load_state_buffers(c, *fresh);
  const auto loaded = state_buffers(*fresh);
  for (size_t i = 0; i < loaded.size(); ++i)
    EXPECT_TRUE(torch::equal(loaded[i].second, buffers[i].second));
  // What eval and generate load (train/model_loader) carries the ranges too.
  const LoadedModel for_eval = load_model(ckpt);
  const auto eval_buffers = state_buffers(*for_eval.model);
  ASSERT_EQ(eval_buffers.size(), buffers.size());
  for (size_t i = 0; i < eval_buffers.size(); ++i) {
    EXPECT_TRUE(torch::equal(eval_buffers[i].second, buffers[i].second)) << eval_buffers[i].first;
  }

  auto& ffn = dynamic_cast<CffnImpl&>(model->block(0).ffn());
  torch::NoGradGuard ng;
  const torch::Tensor x = torch::randn({2, 16, 16}) * 20.0;  // far outside what training saw
  const torch::Tensor x_hat = ffn.gated(x);
  const torch::Tensor z = ffn.ladders().evaluate(ffn.ladder_inputs(x_hat));  // (2, 16, L)
  ffn.eval();
  const torch::Tensor clipped = ffn.ladders().range(z, false, ffn.z_min, ffn.z_max);
  EXPECT_TRUE((clipped >= ffn.z_min).all().item<bool>() &&
              (clipped <= ffn.z_max).all().item<bool>());
  EXPECT_FALSE(torch::equal(clipped, z)) << "the test input leaves the recorded range";
  const torch::Tensor expected =
      torch::linear(clipped, ffn.w_out) + torch::linear(x_hat, ffn.w_direct);
  EXPECT_TRUE(torch::allclose(ffn.forward(x), expected, 1e-6, 1e-6));
  ffn.train();
  EXPECT_TRUE(torch::equal(ffn.ladders().range(z, true, ffn.z_min, ffn.z_max), z));
  EXPECT_TRUE(torch::allclose(ffn.forward(x),
                              torch::linear(z, ffn.w_out) + torch::linear(x_hat, ffn.w_direct),
                              1e-6, 1e-6));
}

}  // namespace
}  // namespace cemfrac
