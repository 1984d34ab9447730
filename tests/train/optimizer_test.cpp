// AdamW groups (decay, no decay, frozen), unfreezing, state saved and restored by parameter name,
// and gradient clipping.
#include "cemfrac/train/optimizer.h"

#include <gtest/gtest.h>
#include <ATen/Parallel.h>
#include <torch/nn/module.h>
#include <torch/optim/adamw.h>
#include <torch/types.h>
#include <torch/utils.h>

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
  torch::cross_entropy_loss(logits.reshape({-1, logits.size(-1)}), tokens.roll(-1, 1).reshape({-1}))
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
  // A step must create state for every trainable parameter and state_tensors() must find all of it.
  torch::manual_seed(2);
  ToyLm model(8, 4);
  Optimizer opt(*model, model->table(), config());
  backward(model);
  opt.step();
  const TensorMap state = opt.state_tensors();
  EXPECT_EQ(state.size(), 3u * 4u);
  EXPECT_EQ(opt.num_states(), 4u);
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
  // b's table lists the parameters in another order, and gate is frozen there: loading unfreezes
  // it.
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

// The fused update against torch::optim::AdamW (the formulation it implements) over several steps
// with changing learning rates, decay on the decay group only; in float64 to 1e-12, in float32 to a
// few float ulps. A non-contiguous parameter takes the ATen path and must agree too.
TEST(Optimizer, FusedAdamWMatchesTorchAdamW) {
  for (auto dtype : {torch::kFloat64, torch::kFloat32}) {
    SCOPED_TRACE(c10::toString(dtype));
    torch::manual_seed(6);
    ToyLm mine(8, 4), ref(8, 4);
    mine->to(dtype);
    ref->to(dtype);
    {
      torch::NoGradGuard no_grad;
      for (const auto& [name, p] : parameters_by_name(*mine, mine->table()))
        p.copy_(parameters_by_name(*ref, ref->table()).at(name));
    }
    AdamWConfig c = config();
    Optimizer opt(*mine, mine->table(), c);
    const auto ref_params = parameters_by_name(*ref, ref->table());
    std::vector<torch::Tensor> decay{ref_params.at("head.weight")};
    std::vector<torch::Tensor> no_decay{ref_params.at("embed.weight"), ref_params.at("gate"),
                                        ref_params.at("head.bias")};
    auto options = [&](double wd) {
      return std::make_unique<torch::optim::AdamWOptions>(
          torch::optim::AdamWOptions(c.lr)
              .betas(std::make_tuple(c.beta1, c.beta2))
              .eps(c.eps)
              .weight_decay(wd));
    };
    std::vector<torch::optim::OptimizerParamGroup> groups;
    groups.emplace_back(decay, options(c.weight_decay));
    groups.emplace_back(no_decay, options(0.0));
    torch::optim::AdamW torch_adamw(std::move(groups), torch::optim::AdamWOptions(c.lr));
    for (int step = 0; step < 6; ++step) {
      const double lr = 0.01 * (1 + step % 3);
      opt.set_lr(lr);
      for (auto& group : torch_adamw.param_groups())
        static_cast<torch::optim::AdamWOptions&>(group.options()).lr(lr);
      opt.zero_grad();
      torch_adamw.zero_grad();
      backward(mine);
      backward(ref);
      opt.step();
      torch_adamw.step();
    }
    const double tol = dtype == torch::kFloat64 ? 1e-12 : 1e-6;
    for (const auto& [name, p] : parameters_by_name(*mine, mine->table())) {
      const torch::Tensor& q = ref_params.at(name);
      EXPECT_TRUE(torch::allclose(p, q, tol, tol))
          << name << ": " << (p - q).abs().max().item<double>();
      EXPECT_FALSE(torch::equal(p, p.detach().clone().zero_())) << name;
    }
  }
}

TEST(Optimizer, AtenFallbackEqualsFusedUpdate) {
  // The same parameter values once as a contiguous tensor (fused kernel) and once as a transposed
  // view of a buffer (non-contiguous: the ATen formulas).
  torch::manual_seed(7);
  torch::Tensor init = torch::randn({5, 3}, torch::kFloat64);
  torch::Tensor fused = init.clone().requires_grad_();
  torch::Tensor strided = init.t().contiguous().t().detach().requires_grad_();  // same values
  ASSERT_FALSE(strided.is_contiguous());
  struct Holder : torch::nn::Module {
    explicit Holder(const torch::Tensor& t) { register_parameter("w", t); }
  };
  Holder a(fused), b(strided);
  ParamInfo info;
  info.name = "w";
  info.group = ParamGroup::kDecay;
  Optimizer oa(a, {info}, config()), ob(b, {info}, config());
  for (int step = 0; step < 4; ++step) {
    torch::Tensor g = torch::randn({5, 3}, torch::kFloat64);
    fused.mutable_grad() = g.clone();
    strided.mutable_grad() = g.t().contiguous().t();
    oa.step();
    ob.step();
  }
  EXPECT_TRUE(torch::allclose(fused, strided, 1e-14, 1e-14));
  EXPECT_FALSE(torch::allclose(fused, init, 1e-3, 1e-3)) << "the parameter moved";
}

TEST(Optimizer, ClipNormIsThreadCountIndependentAndExact) {
  torch::manual_seed(8);
  torch::Tensor big = torch::zeros({300000}, torch::requires_grad());
  big.mutable_grad() = torch::randn({300000});
  const double reference = std::sqrt(big.grad().to(torch::kFloat64).square().sum().item<double>());
  const int threads = at::get_num_threads();
  at::set_num_threads(1);
  const double one = clip_grad_norm({big}, 0.0);
  at::set_num_threads(2);
  const double two = clip_grad_norm({big}, 0.0);
  at::set_num_threads(threads);
  EXPECT_EQ(one, two) << "bitwise for any thread count";
  EXPECT_NEAR(one, reference, 1e-12 * reference);
}

// Tensors off the fused CPU kernel are updated in multi-tensor batches (one per step count and
// weight decay): bit for bit the update of one tensor at a time by torch.optim.AdamW's formulas,
// here for strided tensors of both groups, one of which starts two steps late (unfrozen then).
TEST(Optimizer, MultiTensorBatchesEqualOneTensorAtATime) {
  torch::manual_seed(12);
  struct Holder : torch::nn::Module {
    explicit Holder(const std::vector<torch::Tensor>& ts) {
      for (size_t i = 0; i < ts.size(); ++i) register_parameter("w" + std::to_string(i), ts[i]);
    }
  };
  std::vector<torch::Tensor> params, init;
  for (int i = 0; i < 4; ++i) {
    init.push_back(torch::randn({6 + i, 3}));
    params.push_back(init.back().t().contiguous().t().detach().requires_grad_());  // strided
    ASSERT_FALSE(params.back().is_contiguous());
  }
  Holder h(params);
  std::vector<ParamInfo> table(4);
  for (int i = 0; i < 4; ++i) {
    table[i].name = "w" + std::to_string(i);
    table[i].group = i % 2 == 0 ? ParamGroup::kDecay : ParamGroup::kNoDecay;
  }
  table[3].group = ParamGroup::kFrozen;
  const AdamWConfig c = config();
  Optimizer opt(h, table, c);
  std::vector<torch::Tensor> ref, m(4), v(4);
  for (const torch::Tensor& t : init) ref.push_back(t.clone());
  std::vector<int64_t> steps(4, 0);
  for (int step = 0; step < 5; ++step) {
    if (step == 2) opt.unfreeze("w3", ParamGroup::kDecay);
    for (int i = 0; i < 4; ++i) {
      if (i == 3 && step < 2) continue;
      const torch::Tensor g = torch::randn(params[i].sizes());
      params[i].mutable_grad() = g.t().contiguous().t();
      // The reference: one tensor, torch.optim.AdamW's sequence.
      if (steps[i]++ == 0) m[i] = torch::zeros_like(g), v[i] = torch::zeros_like(g);
      const double wd = table[i].group == ParamGroup::kDecay || i == 3 ? c.weight_decay : 0.0;
      const double bc1 = 1 - std::pow(c.beta1, double(steps[i])),
                   bc2 = 1 - std::pow(c.beta2, double(steps[i]));
      if (wd != 0) ref[i].mul_(1.0 - c.lr * wd);
      m[i].mul_(c.beta1).add_(g, 1.0 - c.beta1);
      v[i].mul_(c.beta2).addcmul_(g, g, 1.0 - c.beta2);
      ref[i].addcdiv_(m[i], (v[i].sqrt() / std::sqrt(bc2)).add_(c.eps), -c.lr / bc1);
    }
    opt.step();
    for (auto& p : params) p.mutable_grad().reset();
  }
  for (int i = 0; i < 4; ++i) EXPECT_TRUE(torch::equal(params[i].detach(), ref[i])) << "w" << i;
  EXPECT_FALSE(torch::equal(params[3].detach(), init[3])) << "the unfrozen tensor moved";
}

// Gradients off the fused CPU path (non-contiguous here; every gradient on a GPU) are summed on
// their device and read once: the norm equals the float64 one over all of them, mixed with fused
// ones, and a NaN among them still comes out.
TEST(Optimizer, ClipNormSumsGradientsOffTheFusedPathOnTheirDevice) {
  torch::manual_seed(9);
  torch::Tensor a = torch::zeros({40, 30}, torch::requires_grad());
  torch::Tensor b = torch::zeros({30, 40}, torch::requires_grad());
  torch::Tensor c = torch::zeros({50}, torch::requires_grad());
  a.mutable_grad() = torch::randn({30, 40}).t();  // strided: the device path
  b.mutable_grad() = torch::randn({40, 30}).t();
  c.mutable_grad() = torch::randn({50});  // contiguous: the fused CPU kernel
  ASSERT_FALSE(a.grad().is_contiguous());
  double reference = 0;
  for (const torch::Tensor& t : {a, b, c})
    reference += t.grad().to(torch::kFloat64).square().sum().item<double>();
  reference = std::sqrt(reference);
  EXPECT_NEAR(clip_grad_norm({a, b, c}, 0.0), reference, 1e-14 * reference);
  b.mutable_grad().select(0, 3).select(0, 2).fill_(std::numeric_limits<float>::quiet_NaN());
  EXPECT_TRUE(std::isnan(clip_grad_norm({a, b, c}, 1.0)));
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
  const double after =
      std::sqrt(a.grad().pow(2).sum().item<double>() + b.grad().pow(2).sum().item<double>());
  EXPECT_NEAR(after, 1.0, 1e-6) << "clipped to the limit";
  EXPECT_NEAR(clip_grad_norm({a, b}, 0.0), after, 1e-7) << "0 = no clipping";
  EXPECT_NEAR(
      after, std::sqrt(a.grad().pow(2).sum().item<double>() + b.grad().pow(2).sum().item<double>()),
      0.0)
      << "max_norm 0 leaves the gradients alone";
  b.mutable_grad() = torch::tensor({std::numeric_limits<float>::quiet_NaN()});
  EXPECT_TRUE(std::isnan(clip_grad_norm({a, b}, 1.0)));
}

}  // namespace
}  // namespace cemfrac
