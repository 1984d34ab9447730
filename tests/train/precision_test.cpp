// train.precision = "bf16": the forward under autocast with float32 master weights,
// optimizer state and loss tracks the float32 run within a derived bound.
//
// The bound. Under autocast every matrix product takes operands rounded to bfloat16 (8 significant
// bits: unit roundoff u = 2^-8) and accumulates in float32, so an output entry y = sum_i a_i b_i
// becomes sum_i a_i (1 + alpha_i) b_i (1 + beta_i) with |alpha_i|, |beta_i| <= u: an error of at
// most 2u sum_i |a_i b_i|, i.e. a relative error of at most 2u when the products do not cancel.
// From the embedding to the logits the longest chain of products has M = 6 L + 1 of them (per
// block: the q/k/v projection, the scores, attention times values, the output projection, the
// FFN's input and output projections; then the head); elementwise ops and norms run in float32.
// To first order the relative errors add along the chain, so each logit is off by at most
// 2 M u |z|, and since the cross-entropy's gradient in z (softmax - one-hot) has L1 norm <= 2, the
// loss of one forward changes by at most
//     |L_bf16 - L_fp32| <= 2 * 2 M u max|z| = 4 M u max|z|.
// That is the bound checked: for one forward of the same weights, and for the mean of the last
// steps of a short run, with max|z| of the float32 model (the drift between the two weight
// trajectories is of higher order over so few steps; this run keeps it below the bound).
#include <gtest/gtest.h>
#include <torch/types.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>
#include <vector>

#include "cemfrac/core/compat.h"
#include "cemfrac/model/lm_model.h"
#include "cemfrac/train/trainer.h"
#include "tests/model_test_util.h"
#include "tests/test_util.h"
#include "tests/train/toy_lm.h"

namespace cemfrac {
namespace {

constexpr double kBf16Roundoff = 1.0 / 256.0;  // 2^-8

ModelConfig tiny_config() {
  return test::tiny_model(32, 32, 32);  // D = 16, L = 2, Llama flavour
}

double loss_bound(const ModelConfig& c, double max_logit) {
  const double chain = 6.0 * double(c.n_layers) + 1.0;  // M
  return 4.0 * chain * kBf16Roundoff * max_logit;
}

torch::Tensor batch_tokens(int64_t V) {
  torch::manual_seed(5);
  return torch::randint(V, {2, 17}, torch::kInt64);
}

double cross_entropy(const torch::Tensor& logits, const torch::Tensor& targets) {
  return torch::cross_entropy_loss(logits.reshape({-1, logits.size(-1)}), targets.reshape({-1}))
      .item<double>();
}

TEST(Precision, Bf16ForwardIsWithinTheDerivedBound) {
  const ModelConfig c = tiny_config();
  torch::manual_seed(1);
  LmModel model(c);
  {
    // Larger weights than the init (std 0.02) give logits far from 0, where the bound is tight
    // enough to mean something.
    torch::NoGradGuard no_grad;
    for (auto& p : model->parameters())
      if (p.dim() == 2) p.mul_(10.0);
  }
  const torch::Tensor t = batch_tokens(c.vocab_size);
  const torch::Tensor in = t.narrow(1, 0, 16), target = t.narrow(1, 1, 16);
  const torch::Tensor z = model->forward(in);
  torch::Tensor zb;
  {
    compat::AutocastGuard autocast(torch::kCPU, torch::kBFloat16);
    zb = model->forward(in);
  }
  zb = zb.to(torch::kFloat32);
  EXPECT_FALSE(torch::equal(z, zb)) << "autocast changed nothing: bf16 is not in effect";
  for (const auto& p : model->parameters()) EXPECT_EQ(p.scalar_type(), torch::kFloat32);
  const double max_z = z.abs().max().item<double>();
  const double diff = std::abs(cross_entropy(zb, target) - cross_entropy(z, target));
  EXPECT_LE(diff, loss_bound(c, max_z)) << "max|z| = " << max_z;
  // The logits themselves: within 2 M u max|z| each.
  EXPECT_LE((zb - z).abs().max().item<double>(), loss_bound(c, max_z) / 2.0);
}

TEST(Precision, Bf16RunTracksFp32) {
  const std::string data = test::temp_dir("precision_data");
  test::write_toy_dataset(data, 32, 30, 6);
  const ModelConfig c = tiny_config();
  constexpr int64_t kSteps = 30, kLast = 5;
  auto run = [&](const std::string& precision, LmModel* keep) {
    const std::string out = test::temp_dir("precision_" + precision);
    TrainerOptions o = test::tiny_trainer_options(out, data, kSteps, 64);
    o.train.eval_every = 0;
    o.train.eval_tokens = 64;
    o.train.precision = precision;
    seed_everything(1);
    LmModel model(c);
    Trainer(make_train_model(model), o).run();
    if (keep != nullptr) *keep = model;
    for (const auto& p : model->parameters()) EXPECT_EQ(p.scalar_type(), torch::kFloat32);
    return test::metrics_losses(out);
  };
  LmModel fp32_model{nullptr};
  const std::vector<double> a = run("fp32", &fp32_model), b = run("bf16", nullptr);
  ASSERT_EQ(a.size(), size_t(kSteps));
  ASSERT_EQ(b.size(), size_t(kSteps));
  EXPECT_NE(a, b) << "the bf16 run gave the fp32 run's losses: bf16 is not in effect";
  const double mean_a = std::accumulate(a.end() - kLast, a.end(), 0.0) / kLast;
  const double mean_b = std::accumulate(b.end() - kLast, b.end(), 0.0) / kLast;
  fp32_model->eval();
  torch::NoGradGuard no_grad;
  const torch::Tensor t = batch_tokens(c.vocab_size);
  const double max_z = fp32_model->forward(t.narrow(1, 0, 16)).abs().max().item<double>();
  EXPECT_LE(std::abs(mean_b - mean_a), loss_bound(c, max_z))
      << "fp32 " << mean_a << ", bf16 " << mean_b << ", max|z| " << max_z;
  EXPECT_LT(mean_b, b.front() - 0.5) << "the bf16 run learns";
}

}  // namespace
}  // namespace cemfrac
