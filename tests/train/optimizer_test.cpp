// AdamW groups (decay, no decay, frozen), unfreezing, state saved and restored by parameter name,
// and gradient clipping.
#include "cemfrac/train/optimizer.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "cemfrac/core/check.h"
#include "tests/train/toy_lm.h"

namespace cemfrac {
namespace {

using test::ToyLm;

// One forward/backward on fixed tokens.
void backward(ToyLm& model) {
  const torch::Tensor tokens = torch::arange(12, torch::kInt64).reshape({2, 6}) % 7;
  const torch::Tensor logits = model->forward(tokens);
  torch::nn::functional::cross_entropy(logits.reshape({-1, logits.size(-1)}),
                                       (tokens.roll(-1, 1)).reshape({-1}))
      .backward();
}

AdamWConfig config() {
  AdamWConfig c;
  c.lr = 0.01;
  c.weight_decay = 0.5;
  return c;
}

TEST(Optimizer, GroupsDecayNoDecayAndFrozen) {
  torch::manual_seed(1);
  ToyLm model(8, 4);
  Optimizer opt(*model, model->table(/*freeze_gate=*/true), config());
  EXPECT_FALSE(model->gate.requires_grad()) << "frozen parameters need no gradient";
  EXPECT_TRUE(opt.is_frozen("gate"));
  EXPECT_EQ(opt.trainable().size(), 3u);
  const torch::Tensor head0 = model->head->weight.detach().clone();
  const torch::Tensor bias0 = model->head->bias.detach().clone();
  const torch::Tensor gate0 = model->gate.detach().clone();
  // Zero gradients: Adam's update is 0, so only weight decay moves a parameter.
  for (const torch::Tensor& p : opt.trainable()) p.mutable_grad() = torch::zeros_like(p);
  opt.set_lr(0.01);
  opt.step();
  EXPECT_TRUE(torch::allclose(model->head->weight, head0 * (1 - 0.01 * 0.5), 0, 1e-7))
      << "decay group: p *= 1 - lr * weight_decay";
  EXPECT_TRUE(torch::equal(model->head->bias, bias0)) << "no-decay group is not decayed";
  EXPECT_TRUE(torch::equal(model->gate, gate0)) << "frozen parameter unchanged";
  const TensorMap state = opt.state_tensors();
  EXPECT_EQ(state.count("gate.exp_avg"), 0u) << "frozen parameters have no optimizer state";
  EXPECT_EQ(state.count("head.weight.exp_avg"), 1u);
  EXPECT_EQ(state.at("head.weight.step").item<int64_t>(), 1);
}

TEST(Optimizer, StateKeysCoverEveryTrainedParameter) {
  // The by-name translation relies on torch::optim's state keys; a step must create state for
  // every trainable parameter and state_tensors() must find all of it.
  torch::manual_seed(2);
  ToyLm model(8, 4);
  Optimizer opt(*model, model->table(), config());
  backward(model);
  opt.step();
  const TensorMap state = opt.state_tensors();
  EXPECT_EQ(state.size(), 3u * 4u);
  EXPECT_EQ(opt.adamw().state().size(), 4u);
}

TEST(Optimizer, UnfreezeJoinsAGroupAndTrains) {
  torch::manual_seed(3);
  ToyLm model(8, 4);
  Optimizer opt(*model, model->table(/*freeze_gate=*/true), config());
  backward(model);
  opt.step();
  const torch::Tensor gate0 = model->gate.detach().clone();
  opt.unfreeze("gate", ParamGroup::kNoDecay);
  EXPECT_TRUE(model->gate.requires_grad());
  EXPECT_FALSE(opt.is_frozen("gate"));
  opt.zero_grad();
  backward(model);
  opt.step();
  EXPECT_FALSE(torch::equal(model->gate, gate0)) << "unfrozen parameter is updated";
  EXPECT_EQ(opt.state_tensors().at("gate.step").item<int64_t>(), 1) << "its state starts fresh";
  EXPECT_THROW(opt.unfreeze("gate", ParamGroup::kDecay), Error) << "not frozen any more";
  EXPECT_THROW(opt.unfreeze("nope", ParamGroup::kDecay), Error);
}

TEST(Optimizer, StateRestoresByNameNotByIndex) {
  torch::manual_seed(4);
  ToyLm a(8, 4);
  torch::manual_seed(4);
  ToyLm b(8, 4);
  Optimizer oa(*a, a->table(/*freeze_gate=*/true), config());
  for (int i = 0; i < 3; ++i) {
    oa.zero_grad();
    backward(a);
    oa.step();
    if (i == 0) oa.unfreeze("gate", ParamGroup::kNoDecay);
  }
  // b's table lists the parameters in another order, and gate is frozen there: loading unfreezes it.
  auto table = b->table(/*freeze_gate=*/true);
  std::reverse(table.begin(), table.end());
  Optimizer ob(*b, table, config());
  {
    torch::NoGradGuard no_grad;
    for (const auto& [name, p] : parameters_by_name(*a, a->table()))
      parameters_by_name(*b, b->table()).at(name).copy_(p);
  }
  SafetensorsFile saved;
  saved.tensors = oa.state_tensors();
  saved.metadata = oa.state_metadata();
  ob.load_state(decode_safetensors(encode_safetensors(saved.tensors, saved.metadata), "opt"),
                "opt");
  EXPECT_FALSE(ob.is_frozen("gate"));
  for (auto* o : {&oa, &ob}) {
    o->zero_grad();
  }
  backward(a);
  backward(b);
  oa.step();
  ob.step();
  for (const auto& [name, p] : parameters_by_name(*a, a->table()))
    EXPECT_TRUE(torch::equal(p, parameters_by_name(*b, b->table()).at(name))) << name;
}

TEST(Optimizer, LoadStateRejectsForeignState) {
  torch::manual_seed(5);
  ToyLm model(8, 4);
  Optimizer opt(*model, model->table(), config());
  backward(model);
  opt.step();
  auto expect_error = [&](TensorMap tensors, std::map<std::string, std::string> meta,
                          const std::string& what) {
    SCOPED_TRACE(what);
    Optimizer fresh(*model, model->table(), config());
    try {
      fresh.load_state(SafetensorsFile{tensors, meta}, "x/optimizer.safetensors");
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("x/optimizer.safetensors"), std::string::npos);
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  const TensorMap good = opt.state_tensors();
  const auto meta = opt.state_metadata();
  TensorMap extra = good;
  extra["ghost.exp_avg"] = torch::zeros({1});
  expect_error(extra, meta, "unexpected tensor 'ghost.exp_avg'");
  TensorMap wrong = good;
  wrong["head.bias.exp_avg"] = torch::zeros({3});
  wrong["head.bias.exp_avg_sq"] = torch::zeros({3});
  expect_error(wrong, meta, "'head.bias' state shape [3] vs parameter [8]");
  TensorMap partial = good;
  partial.erase("head.weight.exp_avg_sq");
  expect_error(partial, meta, "'head.weight' lacks part of its state");
  expect_error(good, {}, "no 'groups' metadata");
  auto foreign = meta;
  foreign["groups"] = R"({"other.weight": "decay"})";
  expect_error(good, foreign, "'other.weight'");
}

TEST(Optimizer, ClipGradNormReturnsThePreClipNorm) {
  torch::Tensor a = torch::zeros({2}, torch::requires_grad());
  torch::Tensor b = torch::zeros({1}, torch::requires_grad());
  torch::Tensor c = torch::zeros({1}, torch::requires_grad());  // no gradient: skipped
  a.mutable_grad() = torch::tensor({3.0f, 0.0f});
  b.mutable_grad() = torch::tensor({4.0f});
  EXPECT_DOUBLE_EQ(clip_grad_norm({a, b, c}, 10.0), 5.0);
  EXPECT_TRUE(torch::equal(a.grad(), torch::tensor({3.0f, 0.0f}))) << "below the limit: untouched";
  EXPECT_DOUBLE_EQ(clip_grad_norm({a, b, c}, 1.0), 5.0);
  const double after = std::sqrt(a.grad().pow(2).sum().item<double>() + b.grad().pow(2).sum().item<double>());
  EXPECT_NEAR(after, 1.0, 1e-6) << "clipped to the limit";
  EXPECT_NEAR(clip_grad_norm({a, b}, 0.0), after, 1e-7) << "0 = no clipping";
  EXPECT_NEAR(after, std::sqrt(a.grad().pow(2).sum().item<double>() +
                               b.grad().pow(2).sum().item<double>()), 0.0)
      << "max_norm 0 leaves the gradients alone";
  b.mutable_grad() = torch::tensor({std::numeric_limits<float>::quiet_NaN()});
  EXPECT_TRUE(std::isnan(clip_grad_norm({a, b}, 1.0)));
}

}  // namespace
}  // namespace cemfrac
