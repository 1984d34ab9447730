// The GP task (docs/gp.md): the sampler's covariance is the kernel's, the Cholesky oracle
// equals one linear solve per prefix, the model is causal, the test-time-scaling copy is the same
// model, a short training lowers the held-out RMSE, and the experiment's rows, JSON and SVG.
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <torch/autograd.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <cmath>
#include <sstream>

#include "cemfrac/core/check.h"
#include "cemfrac/core/random.h"
#include "cemfrac/tasks/gp_data.h"
#include "cemfrac/tasks/gp_experiment.h"
#include "cemfrac/tasks/gp_model.h"
#include "cemfrac/train/checkpoint.h"
#include "tests/model_test_util.h"

namespace cemfrac {
namespace {

const auto kF64 = torch::TensorOptions().dtype(torch::kFloat64);

ModelConfig tiny_config(const std::string& mixer, const std::string& ffn, int64_t steps,
                        const std::string& positions = "none") {
  ModelConfig c = test::tiny_model(1, 32, 32);
  c.mixer = mixer;
  c.ffn = ffn;
  c.positions = parse_enum<Positions>(positions, "positions");
  c.cem.steps = steps;
  return c;
}

// With fixed inputs and lengthscale, the empirical covariance of many draws is k(t_i, t_j) + s^2
// d_ij. Standard error of each entry is about sqrt(2 / S) ~ 0.0045 at S = 100000; a wrong kernel
// (e.g. l instead of l^2, or no noise on the diagonal) moves entries by more than 0.1.
TEST(GpData, SamplerCovarianceMatchesKernel) {
  const int64_t S = 100000;
  const double l = 0.3, s = 0.5;
  torch::Tensor t1 = torch::tensor({-0.9, -0.3, 0.2, 0.25, 0.7}, kF64);
  torch::Tensor t = t1.unsqueeze(0).expand({S, 5}).contiguous();
  torch::Tensor ls = torch::full({S}, l, kF64);
  at::Generator gen = at::detail::createCPUGenerator(7);
  torch::Tensor y = sample_gp_observations(t, ls, s, gen);  // (S, 5)
  torch::Tensor empirical = y.t().matmul(y) / double(S);    // (5, 5); the mean is 0
  for (int64_t i = 0; i < 5; ++i) {
    for (int64_t j = 0; j < 5; ++j) {
      const double d = t1[i].item<double>() - t1[j].item<double>();
      const double want = std::exp(-d * d / (2 * l * l)) + (i == j ? s * s : 0.0);
      EXPECT_NEAR(empirical[i][j].item<double>(), want, 0.02) << i << "," << j;
    }
  }
  // And rbf_kernel itself, one entry by hand.
  torch::Tensor k = rbf_kernel(t1.unsqueeze(0), t1.unsqueeze(0), torch::full({1}, l, kF64));
  EXPECT_DOUBLE_EQ(k[0][0][1].item<double>(), std::exp(-0.36 / (2 * 0.09)));
}

// The batch: shapes, dtypes, tokens [t_n, y_n, t_{n+1}], targets y_{n+1}, l in range with log l
// uniform, t in [-1, 1], and the same seed giving the same batch.
TEST(GpData, BatchLayoutAndDistributions) {
  GpTaskOptions task;
  at::Generator gen = at::detail::createCPUGenerator(3);
  GpBatch b = sample_gp_batch(4000, task, gen, /*with_oracle=*/false);
  ASSERT_EQ(b.tokens.sizes(), torch::IntArrayRef({4000, 63, 3}));
  ASSERT_EQ(b.targets.sizes(), torch::IntArrayRef({4000, 63}));
  EXPECT_EQ(b.tokens.scalar_type(), torch::kFloat32);
  EXPECT_FALSE(b.posterior_mean.defined());
  EXPECT_TRUE(torch::equal(b.tokens.select(2, 0), b.t.narrow(1, 0, 63).to(torch::kFloat32)));
  EXPECT_TRUE(torch::equal(b.tokens.select(2, 1), b.y.narrow(1, 0, 63).to(torch::kFloat32)));
  EXPECT_TRUE(torch::equal(b.tokens.select(2, 2), b.t.narrow(1, 1, 63).to(torch::kFloat32)));
  EXPECT_TRUE(torch::equal(b.targets, b.y.narrow(1, 1, 63).to(torch::kFloat32)));
  EXPECT_GE(b.lengthscale.min().item<double>(), 0.1);
  EXPECT_LE(b.lengthscale.max().item<double>(), 1.0);
  // log l ~ U[log 0.1, 0]: mean log(0.1) / 2 = -1.151, sd 0.665; se of the mean ~0.011.
  EXPECT_NEAR(b.lengthscale.log().mean().item<double>(), std::log(0.1) / 2, 0.05);
  EXPECT_GE(b.t.min().item<double>(), -1.0);
  EXPECT_LE(b.t.max().item<double>(), 1.0);
  // Marginal variance of y: 1 + s^2.
  EXPECT_NEAR(b.y.pow(2).mean().item<double>(), 1.01, 0.03);
  at::Generator again = at::detail::createCPUGenerator(3);
  GpBatch c = sample_gp_batch(4000, task, again, false);
  EXPECT_TRUE(torch::equal(b.y, c.y));
}

// The Cholesky oracle against one direct solve per prefix, on a tiny case, and m = 1 by hand:
// E[y_1 | y_0] = k(t_0, t_1) y_0 / (1 + s^2).
TEST(GpData, OracleMatchesDirectSolve) {
  torch::manual_seed(11);
  const int64_t B = 3, N = 7;
  const double s = 0.1;
  torch::Tensor t = torch::rand({B, N}, kF64) * 2 - 1;
  torch::Tensor y = torch::randn({B, N}, kF64);
  torch::Tensor ls = torch::tensor({0.1, 0.4, 1.0}, kF64);
  torch::Tensor fast = gp_posterior_means(t, y, ls, s);
  torch::Tensor slow = gp_posterior_means_reference(t, y, ls, s);
  ASSERT_EQ(fast.sizes(), torch::IntArrayRef({B, N - 1}));
  EXPECT_LT((fast - slow).abs().max().item<double>(), 1e-10);
  for (int64_t b = 0; b < B; ++b) {
    const double d = (t[b][0] - t[b][1]).item<double>();
    const double l = ls[b].item<double>();
    const double want = std::exp(-d * d / (2 * l * l)) * y[b][0].item<double>() / (1 + s * s);
    EXPECT_NEAR(fast[b][0].item<double>(), want, 1e-12);
  }
  // The sampler's oracle is the same function of its own draws.
  GpTaskOptions task;
  task.n_points = 9;
  at::Generator gen = at::detail::createCPUGenerator(5);
  GpBatch batch = sample_gp_batch(4, task, gen, /*with_oracle=*/true);
  torch::Tensor direct = gp_posterior_means_reference(batch.t, batch.y, batch.lengthscale, 0.1);
  EXPECT_LT((batch.posterior_mean - direct).abs().max().item<double>(), 1e-10);
}

// Prediction n depends on tokens 0..n only: perturbing later tokens leaves earlier outputs
// bit-identical, and the gradient of an early output towards later tokens is exactly 0.
TEST(GpModel, IsCausal) {
  const std::vector<ModelConfig> configs = {tiny_config("cem_attention", "cem_mlp", 1),
                                            tiny_config("cem_attention", "cem_mlp", 4),
                                            tiny_config("cem_attention", "cem_mlp", 2, "rope"),
                                            tiny_config("mha", "swiglu", 1),
                                            tiny_config("cem_attention", "none", 4),
                                            tiny_config("mha", "none", 1)};
  for (const ModelConfig& c : configs) {
    SCOPED_TRACE(c.mixer + "+" + c.ffn + " T=" + std::to_string(c.cem.steps) + " " +
                 enum_name(c.positions));
    torch::manual_seed(1);
    GpModel model(c);
    torch::Tensor tokens = torch::randn({2, 12, 3});
    torch::Tensor out = model->forward(tokens);  // (2, 12)
    ASSERT_EQ(out.sizes(), torch::IntArrayRef({2, 12}));
    const int64_t i = 5;
    torch::Tensor changed = tokens.clone();
    changed.narrow(1, i + 1, 12 - i - 1).add_(torch::randn({2, 12 - i - 1, 3}));
    torch::Tensor out2 = model->forward(changed);
    EXPECT_TRUE(torch::equal(out.narrow(1, 0, i + 1), out2.narrow(1, 0, i + 1)));
    EXPECT_FALSE(torch::equal(out.narrow(1, i + 1, 12 - i - 1), out2.narrow(1, i + 1, 12 - i - 1)));
    torch::Tensor x = tokens.clone().requires_grad_(true);
    torch::Tensor grad = torch::autograd::grad({model->forward(x).select(1, i).sum()}, {x})[0];
    EXPECT_EQ(grad.narrow(1, i + 1, 12 - i - 1).abs().max().item<double>(), 0.0);
    EXPECT_GT(grad.narrow(1, 0, i + 1).abs().max().item<double>(), 0.0);
  }
}

// Every parameter is tagged (the optimizer groups come from the table), and the counts follow the
// per-layer formulas of the spec: CEM 2D^2 + 2DM (+ 2 eta), Llama 4D^2 + 3DM.
TEST(GpModel, ParameterTable) {
  const int64_t D = 16, M = 32, L = 2;
  const int64_t shared =
      (3 * D + D) + L * 2 * D + D + (D + 1);  // embed, block norms, norm_f, readout
  GpModel cem(tiny_config("cem_attention", "cem_mlp", 2));
  GpModel llama(tiny_config("mha", "swiglu", 1));
  int64_t total = 0;
  for (const ParamInfo& p : cem->parameter_table()) total += p.numel;
  EXPECT_EQ(total, cem->num_parameters());
  EXPECT_EQ(cem->num_parameters(), shared + L * (2 * D * D + 2 * D * M + 2));
  EXPECT_EQ(llama->num_parameters(), shared + L * (4 * D * D + 3 * D * M));
  // Attention-only (ffn = none): no norm2, no FFN, no FFN eta.
  GpModel cem_attn(tiny_config("cem_attention", "none", 2));
  GpModel mha_only(tiny_config("mha", "none", 1));
  EXPECT_EQ(cem_attn->num_parameters(), shared - L * D + L * (2 * D * D + 1));
  EXPECT_EQ(mha_only->num_parameters(), shared - L * D + L * 4 * D * D);
}

// The copy at another T has the same parameters: at the same T it gives the same bits, at another T
// other predictions.
TEST(GpModel, WithStepsCopiesParameters) {
  torch::manual_seed(2);
  GpModel model(tiny_config("cem_attention", "cem_mlp", 2));
  torch::Tensor tokens = torch::randn({2, 10, 3});
  torch::NoGradGuard no_grad;
  GpModel same = gp_model_with_steps(model, 2);
  GpModel deeper = gp_model_with_steps(model, 4);
  EXPECT_EQ(deeper->config().cem.steps, 4);
  EXPECT_TRUE(torch::equal(model->forward(tokens), same->forward(tokens)));
  EXPECT_FALSE(torch::equal(model->forward(tokens), deeper->forward(tokens)));
}

// A short training run lowers the held-out RMSE against the posterior mean well below the untrained
// model's (which predicts about 0, RMSE ~ the spread of the posterior means, ~0.9).
TEST(GpTrain, ShortRunLowersRmse) {
  GpTaskOptions task;
  task.n_points = 24;
  at::Generator gen = at::detail::createCPUGenerator(99);
  const GpBatch heldout = sample_gp_batch(128, task, gen, /*with_oracle=*/true);
  torch::manual_seed(3);
  ModelConfig c = tiny_config("cem_attention", "cem_mlp", 2);
  c.d_model = 32;
  GpModel model(c);
  const GpEvalResult before = evaluate_gp_model(model, heldout);
  GpTrainOptions train;
  train.steps = 200;
  train.batch = 16;
  train.lr_max = 3e-3;
  train.lr_min = 3e-4;
  train.warmup_steps = 10;
  const GpTrainResult tr = train_gp_model(model, task, train);
  const GpEvalResult after = evaluate_gp_model(model, heldout);
  EXPECT_EQ(tr.steps, 200);
  EXPECT_LT(after.rmse_posterior, 0.7 * before.rmse_posterior)
      << "before " << before.rmse_posterior << " after " << after.rmse_posterior;
  EXPECT_LT(after.rmse_targets, before.rmse_targets);
  // The oracle floor does not depend on the model and lies below the trained model.
  EXPECT_DOUBLE_EQ(after.rmse_oracle, before.rmse_oracle);
  EXPECT_LT(after.rmse_oracle, after.rmse_targets);
}

// The experiment's rows (each T, the test-time rows, baseline, oracle), JSON and SVG on a tiny
// setup.
TEST(GpExperiment, RowsJsonAndSvg) {
  GpExperimentOptions o = default_gp_experiment();
  o.task.n_points = 12;
  o.cem_model = tiny_config("cem_attention", "cem_mlp", 1);
  o.baseline = tiny_config("mha", "swiglu", 1);
  o.steps = {1, 4};
  o.scale_from = 2;  // not in steps: trained on its own, run at 1 and 4
  o.train.steps = 3;
  o.train.batch = 4;
  o.eval_seqs = 8;
  const GpExperimentResult r = run_gp_experiment(o);
  ASSERT_EQ(r.rows.size(), 6u);
  EXPECT_EQ(r.rows[0].train_T, 1);
  EXPECT_EQ(r.rows[1].train_T, 4);
  EXPECT_EQ(r.rows[2].train_T, 2);
  EXPECT_EQ(r.rows[2].eval_T, 1);
  EXPECT_EQ(r.rows[3].eval_T, 4);
  EXPECT_EQ(r.rows[4].model, "llama");
  EXPECT_EQ(r.rows[5].model, "oracle");
  EXPECT_DOUBLE_EQ(r.rows[5].eval.rmse_targets, r.rows[0].eval.rmse_oracle);
  const nlohmann::json j = to_json(r);
  EXPECT_EQ(j["rows"].size(), 6u);
  EXPECT_TRUE(j["rows"][4]["train_T"].is_null());
  const std::string svg = gp_rmse_svg(r);
  EXPECT_EQ(svg.rfind("<?xml", 0), 0u);  // the one plotter's document (cemfrac/io/plot.h)
  EXPECT_NE(svg.find("<svg"), std::string::npos);
  EXPECT_NE(svg.find("</svg>"), std::string::npos);
  EXPECT_NE(svg.find("<polyline"), std::string::npos);
  EXPECT_NE(svg.find("data-name=\"Llama baseline\""), std::string::npos);
  // Two panels (posterior mean, noisy targets), ticks at the evaluated T, not at 0.4233.
  EXPECT_NE(svg.find("data-title=\"RMSE against the noisy targets\""), std::string::npos);
  EXPECT_NE(svg.find(">4</text>"), std::string::npos);
  // The saved JSON redraws the same plot (--replot); other JSON is a one-line error.
  EXPECT_EQ(gp_rmse_svg(gp_result_from_json(j, "gp.json")), svg);
  EXPECT_THROW(gp_result_from_json(nlohmann::json{{"rows", 1}}, "bad.json"), Error);
  // Same seed, same numbers.
  const GpExperimentResult again = run_gp_experiment(o);
  EXPECT_EQ(again.rows[1].eval.rmse_posterior, r.rows[1].eval.rmse_posterior);
}

// --variants trains each reading at each T. At T = 1 a variant's training would repeat
// the first variant's exactly (same function, weights and batches): the test trains one alone and
// gets the copied row's numbers bit for bit, which is what justifies the copy.
TEST(GpExperiment, VariantsAreRowsAndShareTheTOneModel) {
  GpExperimentOptions o = default_gp_experiment();
  o.task.n_points = 12;
  o.cem_model = tiny_config("cem_attention", "cem_mlp", 1);
  o.steps = {1, 2};
  o.scale_from = 0;
  o.run_baseline = false;
  o.train.steps = 3;
  o.train.batch = 4;
  o.eval_seqs = 8;
  o.variants = {"fixed", "iterate+prox", "step_norm"};
  const GpExperimentResult r = run_gp_experiment(o);
  ASSERT_EQ(r.rows.size(), 7u);
  const std::vector<std::string> want = {
      "fixed", "fixed", "iterate+prox", "iterate+prox", "step_norm", "step_norm", ""};
  for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(r.rows[i].variant, want[i]) << i;
  EXPECT_EQ(r.rows[2].eval.rmse_posterior, r.rows[0].eval.rmse_posterior);
  EXPECT_EQ(r.rows[2].params, r.rows[0].params + 2 * 2);  // a lambda per CEM sub-layer, L = 2
  EXPECT_NE(r.rows[3].eval.rmse_posterior, r.rows[1].eval.rmse_posterior);
  EXPECT_NE(r.rows[5].eval.rmse_posterior, r.rows[1].eval.rmse_posterior);
  GpExperimentOptions alone = o;
  alone.variants = {"iterate+prox"};
  alone.steps = {1};
  const GpExperimentResult a = run_gp_experiment(alone);
  EXPECT_EQ(a.rows[0].eval.rmse_posterior, r.rows[0].eval.rmse_posterior);
  EXPECT_EQ(a.rows[0].last_train_loss, r.rows[0].last_train_loss);
  // The linear energy is another function at T = 1: trained, not copied; a second linear variant
  // copies the first's T = 1 row.
  GpExperimentOptions lin = o;
  lin.steps = {1};
  lin.variants = {"fixed", "linear", "linear+prox"};
  const GpExperimentResult l = run_gp_experiment(lin);
  ASSERT_EQ(l.rows.size(), 4u);
  EXPECT_EQ(l.rows[0].eval.rmse_posterior, r.rows[0].eval.rmse_posterior);
  EXPECT_NE(l.rows[1].eval.rmse_posterior, l.rows[0].eval.rmse_posterior);
  EXPECT_GT(l.rows[1].train_s, 0.0);
  EXPECT_EQ(l.rows[2].eval.rmse_posterior, l.rows[1].eval.rmse_posterior);
  // JSON keeps the variant; the plot names every variant.
  const GpExperimentResult back = gp_result_from_json(to_json(r), "gp.json");
  EXPECT_EQ(back.rows[3].variant, "iterate+prox");
  EXPECT_NE(gp_rmse_svg(r).find("CEM iterate+prox trained at T"), std::string::npos);
  // An unknown part is one error naming it, before any training.
  o.variants = {"fixed", "iterate+proxy"};
  try {
    run_gp_experiment(o);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("unknown part \"proxy\""), std::string::npos) << e.what();
  }
}

// The validation set: its stream comes after the three of every earlier run, so adding
// it changes no init, no training batch and no held-out set; it is a different set from the
// held-out one; and without it the JSON has no trace of it (earlier gp.json files keep their exact
// form).
TEST(GpExperiment, ValidationSetIsSeparateAndChangesNothingElse) {
  SplitMix64 stream(11);
  const GpSeeds seeds = gp_seeds(11);
  EXPECT_EQ(seeds.init, stream.next());
  EXPECT_EQ(seeds.train, stream.next());
  EXPECT_EQ(seeds.test, stream.next());
  EXPECT_EQ(seeds.val, stream.next());

  GpExperimentOptions o = default_gp_experiment();
  o.task.n_points = 12;
  o.cem_model = tiny_config("cem_attention", "cem_mlp", 1);
  o.steps = {1};
  o.scale_from = 0;
  o.run_baseline = false;
  o.train.steps = 3;
  o.train.batch = 4;
  o.eval_seqs = 8;
  const GpExperimentResult without = run_gp_experiment(o);
  o.val_seqs = 8;  // as many as held out: equal RMSEs would mean the same set
  const GpExperimentResult with = run_gp_experiment(o);
  ASSERT_EQ(with.rows.size(), without.rows.size());
  EXPECT_EQ(with.rows[0].eval.rmse_posterior, without.rows[0].eval.rmse_posterior);
  EXPECT_EQ(with.rows[0].last_train_loss, without.rows[0].last_train_loss);
  EXPECT_FALSE(without.rows[0].val.has_value());
  ASSERT_TRUE(with.rows[0].val.has_value());
  EXPECT_NE(with.rows[0].val->rmse_posterior, with.rows[0].eval.rmse_posterior);
  EXPECT_FALSE(to_json(without).contains("val_seqs"));
  EXPECT_FALSE(to_json(without)["rows"][0].contains("val_rmse_posterior"));
  const GpExperimentResult back = gp_result_from_json(to_json(with), "gp.json");
  EXPECT_EQ(back.val_seqs, 8);
  ASSERT_TRUE(back.rows[0].val.has_value());
  EXPECT_EQ(back.rows[0].val->rmse_posterior, with.rows[0].val->rmse_posterior);
}

// One model on its own (cemfrac gp --one, the GP job of cemfrac compare) is the experiment's model:
// with seed = eval seed it reproduces the experiment's rows bit for bit, test-time T included.
// Another eval seed changes the sets and not the model; another seed changes the model.
TEST(GpSingle, ReproducesTheExperimentsRows) {
  GpExperimentOptions o = default_gp_experiment();
  o.task.n_points = 12;
  o.cem_model = tiny_config("cem_attention", "cem_mlp", 1);
  o.steps = {1, 2};
  o.variants = {"iterate"};
  o.scale_from = 2;
  o.run_baseline = false;
  o.train.steps = 3;
  o.train.batch = 4;
  o.eval_seqs = 8;
  o.val_seqs = 6;
  o.seed = 4;
  const GpExperimentResult r = run_gp_experiment(o);
  ASSERT_EQ(r.rows.size(), 4u);  // T=1, T=2, T=2 run at 1, oracle
  ASSERT_EQ(r.rows[2].train_T, 2);
  ASSERT_EQ(r.rows[2].eval_T, 1);

  GpRunOptions one;
  one.task = o.task;
  one.train = o.train;
  one.model = o.cem_model;
  apply_gp_variant(one.model, "iterate");
  one.model.cem.steps = 2;
  one.eval_steps = {1, 2};
  one.val_seqs = 6;
  one.test_seqs = 8;
  one.seed = 4;
  one.eval_seed = 4;
  const GpRunResult s = run_gp_single(one);
  EXPECT_EQ(s.status, "completed");
  EXPECT_EQ(s.params, r.rows[1].params);
  ASSERT_TRUE(s.test.has_value() && s.val.has_value());
  EXPECT_EQ(s.test->rmse_posterior, r.rows[1].eval.rmse_posterior);
  EXPECT_EQ(s.test->rmse_targets, r.rows[1].eval.rmse_targets);
  EXPECT_EQ(s.val->rmse_posterior, r.rows[1].val->rmse_posterior);
  EXPECT_EQ(s.test_at.at(1).rmse_posterior, r.rows[2].eval.rmse_posterior);
  EXPECT_EQ(s.test_at.at(2).rmse_posterior, s.test->rmse_posterior);
  EXPECT_EQ(s.train.last_loss, r.rows[1].last_train_loss);
  EXPECT_EQ(s.oracle_test_rmse, r.rows.back().eval.rmse_targets);

  GpRunOptions other_sets = one;
  other_sets.eval_seed = 5;
  const GpRunResult t = run_gp_single(other_sets);
  EXPECT_EQ(t.train.last_loss, s.train.last_loss);            // the same model...
  EXPECT_NE(t.test->rmse_posterior, s.test->rmse_posterior);  // ...on other sets
  GpRunOptions other_seed = one;
  other_seed.seed = 5;
  const GpRunResult u = run_gp_single(other_seed);
  EXPECT_NE(u.train.last_loss, s.train.last_loss);
  EXPECT_EQ(u.oracle_test_rmse, s.oracle_test_rmse);  // the same test set

  // A grid run: no test set drawn, and the JSON says so.
  GpRunOptions grid = one;
  grid.test_seqs = 0;
  grid.eval_steps = {};
  const nlohmann::json j = to_json(run_gp_single(grid), grid);
  EXPECT_TRUE(j["test"].is_null());
  EXPECT_EQ(j["val"]["rmse_posterior"].get<double>(), s.val->rmse_posterior);
  // test-time T is for CEM models only.
  GpRunOptions llama = one;
  llama.model = tiny_config("mha", "swiglu", 1);
  EXPECT_THROW(run_gp_single(llama), Error);
}

// A non-finite loss: the trainer throws by default; a single run (a learning-rate grid value) stops
// and reports "diverged" with the step, evaluating nothing. A learning rate of 1e30 moves every
// weight by about 1e30 at the first update (AdamW's step is lr-sized), so step 2's attention
// scores overflow float32 and its loss is the first non-finite one.
TEST(GpSingle, DivergedIsAResult) {
  GpRunOptions one;
  one.task.n_points = 12;
  one.model = tiny_config("cem_attention", "cem_mlp", 1);
  one.train.steps = 5;
  one.train.batch = 2;
  one.train.warmup_steps = 1;
  one.train.lr_max = 1e30;
  one.train.lr_min = 1e30;
  one.val_seqs = 4;
  one.test_seqs = 4;
  {
    torch::manual_seed(1);
    GpModel model(one.model);
    EXPECT_THROW(train_gp_model(model, one.task, one.train), Error);
  }
  one.train.throw_on_nonfinite = false;
  const GpRunResult r = run_gp_single(one);
  EXPECT_EQ(r.status, "diverged");
  EXPECT_EQ(r.train.diverged_at_step, 2);
  EXPECT_EQ(r.train.steps, 1);
  EXPECT_FALSE(r.val.has_value());
  EXPECT_FALSE(r.test.has_value());
  const nlohmann::json j = to_json(r, one);
  EXPECT_EQ(j["status"], "diverged");
  EXPECT_EQ(j["diverged_at_step"], 2);
}

// Resumable training (--checkpoint-dir, the GP jobs of cemfrac compare): a training stopped after
// step 5 of 7 and started again gives the uninterrupted run's weights, losses and RMSEs bit for bit
// (parameters, AdamW moments, the training stream's generator and the running loss sums all come
// back); a finished one restarts from its last checkpoint without training; a checkpoint of other
// settings or another model is refused with one line naming the setting.
TEST(GpSingle, ResumedTrainingIsBitwiseTheUninterruptedOne) {
  GpRunOptions one;
  one.task.n_points = 12;
  one.model = tiny_config("cem_attention", "cem_mlp", 2);
  apply_gp_variant(one.model, "iterate+prox");
  one.train.steps = 7;
  one.train.batch = 3;
  one.train.warmup_steps = 2;
  one.train.checkpoint_every = 2;
  one.eval_steps = {1, 2};
  one.val_seqs = 4;
  one.test_seqs = 6;
  one.seed = 3;
  const GpRunResult plain = run_gp_single(one);
  ASSERT_EQ(plain.status, "completed");

  const std::string dir = test::temp_dir("gp-resume");
  GpRunOptions stopped = one;
  stopped.checkpoint_run_dir = dir;
  stopped.train.stop_at_step = 5;
  try {
    run_gp_single(stopped);
    ADD_FAILURE() << "an interrupted training must be an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("interrupted at step 5/7"), std::string::npos) << e.what();
  }
  auto saved = list_checkpoints(dir);
  ASSERT_EQ(saved.size(), 1u);  // the newest kept
  EXPECT_EQ(saved.front().first, 5);

  GpRunOptions resumed = stopped;
  resumed.train.stop_at_step = 0;
  const GpRunResult r = run_gp_single(resumed);
  EXPECT_EQ(r.train.resumed_from, 5);
  EXPECT_EQ(r.train.steps, 7);
  EXPECT_EQ(r.train.last_loss, plain.train.last_loss);  // the loss sums over steps 1..7
  ASSERT_TRUE(r.test && r.val);
  EXPECT_EQ(r.test->rmse_posterior, plain.test->rmse_posterior);
  EXPECT_EQ(r.val->rmse_posterior, plain.val->rmse_posterior);
  EXPECT_EQ(r.test_at.at(1).rmse_posterior, plain.test_at.at(1).rmse_posterior);
  saved = list_checkpoints(dir);
  ASSERT_EQ(saved.size(), 1u);
  EXPECT_EQ(saved.front().first, 7);  // saved after the last step
  // The project's one trainer wrote the run: its summary and metrics (steps 1..7, none twice).
  const nlohmann::json summary = nlohmann::json::parse(test::read_file(dir + "/summary.json"));
  EXPECT_EQ(summary["status"], "completed");
  EXPECT_EQ(summary["step"], 7);
  std::vector<int64_t> logged;
  std::istringstream metrics(test::read_file(dir + "/metrics.jsonl"));
  for (std::string line; std::getline(metrics, line);)
    logged.push_back(nlohmann::json::parse(line)["step"].get<int64_t>());
  EXPECT_EQ(logged, (std::vector<int64_t>{1, 2, 3, 4, 5, 6, 7})) << "log_every = 7 / 10 -> 1";

  // Started again after the end: nothing to train, the same result.
  const GpRunResult again = run_gp_single(resumed);
  EXPECT_EQ(again.train.resumed_from, 7);
  EXPECT_EQ(again.train.last_loss, plain.train.last_loss);
  EXPECT_EQ(again.test->rmse_posterior, plain.test->rmse_posterior);
  EXPECT_EQ(to_json(again, resumed)["resumed_from_step"], 7);

  // Another learning rate, another seed, another T: refused, naming what differs.
  GpRunOptions other_lr = resumed;
  other_lr.train.lr_max *= 2;
  GpRunOptions other_seed = resumed;
  other_seed.seed = 4;
  GpRunOptions other_T = resumed;
  other_T.model.cem.steps = 1;
  other_T.eval_steps = {};
  for (const auto& [what, options] : std::vector<std::pair<std::string, GpRunOptions>>{
           {"train.lr_max", other_lr}, {"seed", other_seed}, {"cem.steps", other_T}}) {
    try {
      run_gp_single(options);
      ADD_FAILURE() << "a checkpoint of " << what << " must be refused";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace cemfrac
