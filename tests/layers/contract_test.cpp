// The contract every mixer and FFN kind keeps, checked for every kind the registry knows (a new
// kind is picked up without editing this file) under one or more tiny configs:
//   mixers: shapes; causality (bitwise outputs and exactly-zero gradients towards the future);
//           batch independence; every trainable parameter gets a finite, non-zero gradient;
//           determinism of init and forward; decoding through the state (chunks and single tokens)
//           equals the full forward; the meta-device module has the same parameters and runs a
//           forward and a backward on a meta input (nothing pinned to the CPU); and, in a whole
//           model,
//           cached decoding gives the full forward's logits in float32 and float64, and the model
//           learns one batch.
//   FFNs:   shapes; position-wise (bitwise); gradients; determinism; meta device; a whole model
//           learns one batch.
// A kind that needs settings the base tiny config lacks, or that has flavours worth checking, adds
// variants in mixer_variants() / ffn_variants() below (the only per-kind code in this file).
#include <gtest/gtest.h>
#include <torch/nn/module.h>
#include <torch/optim/adam.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <cmath>
#include <map>
#include <ostream>
#include <string>
#include <vector>

#include "cemfrac/layers/base/rope.h"
#include "cemfrac/layers/registry.h"
#include "cemfrac/model/layer_factory.h"
#include "cemfrac/model/lm_model.h"
#include "cemfrac/model/model_config.h"
#include "tests/model_test_util.h"

namespace cemfrac {
namespace {

struct Variant {
  std::string kind;
  std::string name;  // flavour, for the test name
  ModelConfig config;
};

void PrintTo(const Variant& v, std::ostream* os) {
  *os << v.kind << " (" << v.name << ")";
}

// Small enough for float64 loops over every position, big enough for two heads and a context the
// decode checks can split.
ModelConfig tiny_base() {
  return test::tiny_model(37, 24, 12);
}  // Llama flavour
using test::gpt2_flavour;

// ---- Per-kind hooks
// ------------------------------------------------------------------------------

std::vector<Variant> mixer_variants(const std::string& kind) {
  ModelConfig base = tiny_base();
  base.mixer = kind;
  std::vector<Variant> variants;
  if (kind == "mha") {
    variants.push_back({kind, "llama", base});
    variants.push_back({kind, "gpt2", gpt2_flavour(base)});
    ModelConfig gqa = base;
    gqa.n_heads = 4;
    gqa.n_kv_heads = 2;
    variants.push_back({kind, "gqa", gqa});
    return variants;
  }
  if (kind == "cem_attention") {
    variants.push_back({kind, "t1", base});
    ModelConfig t3 = base;
    t3.cem.steps = 3;
    variants.push_back({kind, "t3", t3});
    ModelConfig full = base;  // the cem-full preset's flavour: T = 2, per-head D+LR, preconditioner
    full.cem.steps = 2;
    full.cem.dlr = CemDiagonal::kPerHead;
    full.cem.precond = true;
    full.cem.precond_rank = 2;
    variants.push_back({kind, "full", full});
    ModelConfig shared = base;
    shared.cem.steps = 2;
    shared.cem.dlr = CemDiagonal::kShared;
    shared.cem.dlr_distance = true;
    shared.cem.precond = true;
    shared.cem.precond_psd = true;
    shared.cem.precond_rank = 2;
    variants.push_back({kind, "shared_distance_psd", shared});
    ModelConfig naive = base;
    naive.cem.steps = 2;
    naive.cem.rope_mode = CemRopeMode::kNaive;
    variants.push_back({kind, "naive_rope", naive});
    ModelConfig iterate = base;  // keys from the iterates: a per-step key cache when decoding
    iterate.cem.steps = 3;
    iterate.cem.recursion_keys = CemRecursionKeys::kIterate;
    variants.push_back({kind, "iterate_keys", iterate});
    ModelConfig linear = iterate;  // the quadratic energy: causal linear attention steps
    linear.cem.attention = CemAttentionKernel::kLinear;
    variants.push_back({kind, "linear_iterate_keys", linear});
    ModelConfig linear_gram = t3;  // fixed keys: the gram path serves it too
    linear_gram.cem.attention = CemAttentionKernel::kLinear;
    variants.push_back({kind, "linear_t3", linear_gram});
    ModelConfig iterate_dlr = iterate;  // with the diagonal's h rows cached per step too
    iterate_dlr.cem.steps = 2;
    iterate_dlr.cem.dlr = CemDiagonal::kPerHead;
    iterate_dlr.cem.prox = CemProxMode::kLearned;
    variants.push_back({kind, "iterate_keys_dlr_prox", iterate_dlr});
    ModelConfig prox_norm = base;
    prox_norm.cem.steps = 3;
    prox_norm.cem.prox = CemProxMode::kFixed;
    prox_norm.cem.step_norm = CemStepNorm::kRms;
    variants.push_back({kind, "prox_step_norm", prox_norm});
    variants.push_back({kind, "gpt2", gpt2_flavour(base)});
    return variants;
  }
  variants.push_back({kind, "base", base});
  return variants;
}

std::vector<Variant> ffn_variants(const std::string& kind) {
  ModelConfig base = tiny_base();
  base.ffn = kind;
  std::vector<Variant> variants{{kind, "base", base}};
  if (kind == "gelu_mlp" || kind == "swiglu")
    variants.push_back({kind, "bias", gpt2_flavour(base)});
  if (kind == "cem_mlp") {
    ModelConfig t3 = base;
    t3.cem.steps = 3;
    variants.push_back({kind, "t3", t3});
    ModelConfig b = base;
    b.cem.mlp_form = CemMlpForm::kB;
    b.cem.steps = 2;
    b.cem.precond = true;
    b.cem.precond_rank = 2;
    variants.push_back({kind, "form_b_precond", b});
    ModelConfig prox = base;
    prox.cem.steps = 3;
    prox.cem.prox = CemProxMode::kLearned;
    variants.push_back({kind, "prox", prox});
    ModelConfig norm = base;
    norm.cem.steps = 3;
    norm.cem.step_norm = CemStepNorm::kRms;
    norm.cem.prox = CemProxMode::kFixed;
    variants.push_back({kind, "step_norm_prox_fixed", norm});
  }
  return variants;
}

// ---- Shared machinery
// ----------------------------------------------------------------------------

template <typename Hook>
std::vector<Variant> all_variants(const std::vector<std::string>& kinds, Hook hook) {
  std::vector<Variant> out;
  for (const std::string& kind : kinds) {
    for (Variant& v : hook(kind)) out.push_back(std::move(v));
  }
  return out;
}

std::string variant_name(const testing::TestParamInfo<Variant>& info) {
  return info.param.kind + "_" + info.param.name;
}

const auto kF64 = torch::TensorOptions().dtype(torch::kFloat64);
constexpr int64_t kBatch = 2;

// Moves every parameter a little off its initial value, so that zero-initialised tensors (biases,
// low-rank factors, diagonals) take part in the checks like the others.
void perturb(torch::nn::Module& module, uint64_t seed) {
  torch::NoGradGuard no_grad;
  torch::manual_seed(seed);
  for (auto& p : module.parameters()) p.add_(torch::randn_like(p) * 0.05);
}

bool bitwise_equal(const torch::Tensor& a, const torch::Tensor& b) {
  return a.sizes() == b.sizes() && a.dtype() == b.dtype() && torch::equal(a, b);
}

// The mixer of layer 0 of the variant's config, in float64, slightly perturbed.
std::shared_ptr<MixerImpl> build_mixer(const ModelConfig& c, uint64_t seed = 1) {
  torch::manual_seed(seed);
  auto mixer = make_mixer(c, 0, torch::kCPU);
  mixer->to(torch::kFloat64);
  perturb(*mixer, seed + 100);
  return mixer;
}

std::shared_ptr<FfnImpl> build_ffn(const ModelConfig& c, uint64_t seed = 1) {
  torch::manual_seed(seed);
  auto ffn = make_ffn(c, 0, torch::kCPU);
  ffn->to(torch::kFloat64);
  perturb(*ffn, seed + 100);
  return ffn;
}

// Runs the mixer on x (B, n, D) as positions offset..offset+n-1, with RoPE tables when the config
// rotates, and the given decode state.
struct MixerRunner {
  const ModelConfig& config;
  MixerImpl& mixer;
  std::unique_ptr<RotaryEmbedding> rope;

  MixerRunner(const ModelConfig& c, MixerImpl& m) : config(c), mixer(m) {
    if (c.positions == Positions::kRope) {
      rope =
          std::make_unique<RotaryEmbedding>(c.head_dim(), c.context, c.rope_theta, c.rope_scaling);
    }
  }
  torch::Tensor operator()(const torch::Tensor& x, int64_t offset = 0,
                           MixerState* state = nullptr) {
    MixerContext ctx;
    ctx.offset = offset;
    ctx.state = state;
    if (rope) std::tie(ctx.rope_cos, ctx.rope_sin) = rope->tables(offset, x.size(1), x.options());
    return mixer.forward(x, ctx);
  }
};

std::vector<std::pair<std::string, std::vector<int64_t>>> parameter_shapes(torch::nn::Module& m) {
  std::vector<std::pair<std::string, std::vector<int64_t>>> shapes;
  for (const auto& item : m.named_parameters())
    shapes.emplace_back(item.key(), item.value().sizes().vec());
  return shapes;
}

void expect_gradients_reach_every_parameter(torch::nn::Module& module, const torch::Tensor& out) {
  torch::manual_seed(7);
  (out * torch::randn_like(out)).sum().backward();
  for (const auto& item : module.named_parameters()) {
    const torch::Tensor& p = item.value();
    if (!p.requires_grad()) continue;  // frozen by design (e.g. a depth before its dyadic step)
    ASSERT_TRUE(p.grad().defined()) << item.key() << " received no gradient";
    EXPECT_TRUE(torch::isfinite(p.grad()).all().item<bool>()) << item.key();
    EXPECT_GT(p.grad().abs().max().item<double>(), 0.0)
        << item.key() << " has an all-zero gradient";
  }
}

// Trainability, in a whole model built from the variant's config (its kind in every layer, float32,
// Adam): one batch of random tokens is learned. The bar is derived from the batch itself: H(next |
// current), the empirical entropy of each target given only the token before it. A model that sees
// nothing but the current token cannot do better than that in cross-entropy, whatever it learns;
// getting below it needs information from other positions (the mixer; learned positions in the
// GPT-2 flavour), so a mixer that drops its input, or gradients that do not reach the model, fail
// here. With 4 x 12 targets over V = 37 the bar is about 0.4 nats against ln V = 3.6 at the start.
// The tiny models cross it in well under 100 steps at lr 1e-2; kMaxSteps leaves room for BLAS and
// thread-count differences while keeping every kind's run to a fraction of a second.
double conditional_entropy(const torch::Tensor& input, const torch::Tensor& target) {
  std::map<int64_t, std::map<int64_t, double>> counts;  // current token -> next token -> count
  const auto in = input.reshape({-1}), out = target.reshape({-1});
  for (int64_t i = 0; i < in.numel(); ++i)
    counts[in[i].item<int64_t>()][out[i].item<int64_t>()] += 1;
  double h = 0;
  for (const auto& [token, next] : counts) {
    double total = 0;
    for (const auto& [t, n] : next) total += n;
    for (const auto& [t, n] : next) h -= n * std::log(n / total);
  }
  return h / double(in.numel());
}

void expect_overfits_one_batch(const ModelConfig& c) {
  constexpr int64_t kMaxSteps = 150;
  torch::manual_seed(10);
  LmModel model(c);
  const int64_t V = c.vocab_size, N = c.context;
  torch::manual_seed(12);
  const torch::Tensor batch = torch::randint(V, {4, N + 1}, torch::kInt64);
  const torch::Tensor input = batch.narrow(1, 0, N), target = batch.narrow(1, 1, N);
  const double bar = conditional_entropy(input, target);
  torch::optim::Adam adam(model->parameters(), torch::optim::AdamOptions(1e-2));
  double first = 0, loss_value = 0;
  int64_t step = 0;
  for (; step < kMaxSteps; ++step) {
    adam.zero_grad();
    torch::Tensor loss =
        torch::cross_entropy_loss(model->forward(input).reshape({-1, V}), target.reshape({-1}));
    loss.backward();
    adam.step();
    loss_value = loss.item<double>();
    if (step == 0) first = loss_value;
    if (loss_value < bar) break;
  }
  EXPECT_NEAR(first, std::log(double(V)), 0.5) << "initial loss";
  EXPECT_LT(loss_value, bar) << "after " << step << " steps (H(next | current) of the batch)";
}

// ---- Mixers
// --------------------------------------------------------------------------------------

class MixerContract : public testing::TestWithParam<Variant> {};

TEST_P(MixerContract, KeepsShapeAndDtype) {
  const ModelConfig& c = GetParam().config;
  auto mixer = build_mixer(c);
  MixerRunner run(c, *mixer);
  for (int64_t n : {int64_t(1), int64_t(5), c.context}) {
    torch::Tensor y = run(torch::randn({kBatch, n, c.d_model}, kF64));
    EXPECT_EQ(y.sizes(), (std::vector<int64_t>{kBatch, n, c.d_model})) << "n = " << n;
    EXPECT_EQ(y.scalar_type(), torch::kFloat64);
    EXPECT_TRUE(torch::isfinite(y).all().item<bool>());
  }
  mixer->to(torch::kFloat32);
  torch::Tensor y = run(torch::randn({kBatch, c.context, c.d_model}));
  EXPECT_EQ(y.scalar_type(), torch::kFloat32);
}

TEST_P(MixerContract, IsCausalBitwise) {
  const ModelConfig& c = GetParam().config;
  auto mixer = build_mixer(c);
  MixerRunner run(c, *mixer);
  const int64_t N = c.context;
  torch::Tensor x = torch::randn({kBatch, N, c.d_model}, kF64);
  torch::NoGradGuard no_grad;
  torch::Tensor y = run(x);
  for (int64_t j = 1; j < N; ++j) {
    torch::Tensor x2 = x.clone();
    x2.select(1, j).add_(torch::randn({kBatch, c.d_model}, kF64));  // change position j only
    torch::Tensor y2 = run(x2);
    EXPECT_TRUE(bitwise_equal(y.narrow(1, 0, j), y2.narrow(1, 0, j)))
        << "changing position " << j << " changed an earlier output";
    EXPECT_FALSE(torch::equal(y.select(1, j), y2.select(1, j)))
        << "position " << j << " ignores its input";
  }
}

TEST_P(MixerContract, HasNoGradientTowardsTheFuture) {
  const ModelConfig& c = GetParam().config;
  auto mixer = build_mixer(c);
  MixerRunner run(c, *mixer);
  const int64_t N = c.context;
  for (int64_t i : {int64_t(0), N / 2, N - 2}) {
    torch::Tensor x = torch::randn({kBatch, N, c.d_model}, kF64).requires_grad_();
    run(x).select(1, i).pow(2).sum().backward();
    torch::Tensor future = x.grad().narrow(1, i + 1, N - i - 1);
    EXPECT_EQ(future.abs().max().item<double>(), 0.0)
        << "output " << i << " has a gradient from later inputs";
    EXPECT_GT(x.grad().select(1, i).abs().max().item<double>(), 0.0);
  }
}

TEST_P(MixerContract, BatchItemsAreIndependent) {
  const ModelConfig& c = GetParam().config;
  auto mixer = build_mixer(c);
  MixerRunner run(c, *mixer);
  torch::NoGradGuard no_grad;
  torch::Tensor x = torch::randn({3, c.context, c.d_model}, kF64);
  torch::Tensor y = run(x);
  for (int64_t b = 0; b < 3; ++b) {
    EXPECT_TRUE(torch::allclose(y.narrow(0, b, 1), run(x.narrow(0, b, 1)), 1e-12, 1e-12))
        << "item " << b;
  }
}

TEST_P(MixerContract, EveryParameterGetsAGradient) {
  const ModelConfig& c = GetParam().config;
  auto mixer = build_mixer(c);
  MixerRunner run(c, *mixer);
  expect_gradients_reach_every_parameter(*mixer,
                                         run(torch::randn({kBatch, c.context, c.d_model}, kF64)));
}

TEST_P(MixerContract, IsDeterministic) {
  const ModelConfig& c = GetParam().config;
  auto a = build_mixer(c, 5), b = build_mixer(c, 5);
  const auto pa = a->named_parameters(), pb = b->named_parameters();
  ASSERT_EQ(pa.size(), pb.size());
  for (size_t i = 0; i < pa.size(); ++i)
    EXPECT_TRUE(bitwise_equal(pa[i].value(), pb[i].value())) << pa[i].key();
  MixerRunner run(c, *a);
  torch::NoGradGuard no_grad;
  torch::Tensor x = torch::randn({kBatch, c.context, c.d_model}, kF64);
  EXPECT_TRUE(bitwise_equal(run(x), run(x)));
}

TEST_P(MixerContract, DecodingThroughTheStateEqualsTheFullForward) {
  const ModelConfig& c = GetParam().config;
  auto mixer = build_mixer(c);
  MixerRunner run(c, *mixer);
  torch::NoGradGuard no_grad;
  const int64_t N = c.context;
  torch::Tensor x = torch::randn({kBatch, N, c.d_model}, kF64);
  torch::Tensor full = run(x);
  // Uneven chunks (a prompt, then one token, then the rest) and single tokens.
  for (const std::vector<int64_t>& chunks :
       {std::vector<int64_t>{3, 1, N - 4}, std::vector<int64_t>(N, 1)}) {
    auto state = mixer->new_state();
    ASSERT_NE(state, nullptr);
    std::vector<torch::Tensor> parts;
    int64_t offset = 0;
    for (int64_t n : chunks) {
      parts.push_back(run(x.narrow(1, offset, n), offset, state.get()));
      offset += n;
    }
    torch::Tensor decoded = torch::cat(parts, 1);
    EXPECT_TRUE(torch::allclose(decoded, full, 1e-10, 1e-10))
        << chunks.size() << " chunks: max difference "
        << (decoded - full).abs().max().item<double>();
  }
}

TEST_P(MixerContract, MetaDeviceModuleHasTheSameParameters) {
  const ModelConfig& c = GetParam().config;
  auto real = make_mixer(c, 0, torch::kCPU);
  auto meta = make_mixer(c, 0, torch::kMeta);
  EXPECT_EQ(parameter_shapes(*real), parameter_shapes(*meta));
}

// Nothing is pinned to the CPU (DESIGN.md, "Device is data"): built on the meta device, the layer
// runs a forward and a backward on a meta input, every trainable parameter gets a meta gradient of
// its shape, and the output has the input's shape. A tensor the layer made on the CPU (a plain
// member, a mask, an index) meets the meta input and raises a device mismatch, failing the test;
// so does an op whose output size depends on values (every kind runs here, per_head D+LR included).
TEST_P(MixerContract, RunsForwardAndBackwardOnMeta) {
  const ModelConfig& c = GetParam().config;
  auto mixer = make_mixer(c, 0, torch::kMeta);
  MixerRunner run(c, *mixer);
  const torch::Tensor x =
      torch::empty({kBatch, c.context, c.d_model}, torch::TensorOptions().device(torch::kMeta))
          .requires_grad_(true);
  const torch::Tensor y = run(x);
  EXPECT_TRUE(y.is_meta());
  EXPECT_EQ(y.sizes(), x.sizes());
  y.sum().backward();
  ASSERT_TRUE(x.grad().defined());
  EXPECT_TRUE(x.grad().is_meta());
  for (const auto& item : mixer->named_parameters()) {
    if (!item.value().requires_grad()) continue;
    ASSERT_TRUE(item.value().grad().defined()) << item.key();
    EXPECT_TRUE(item.value().grad().is_meta()) << item.key();
    EXPECT_EQ(item.value().grad().sizes(), item.value().sizes()) << item.key();
  }
  // Module::to() moves the buffers with the parameters (a plain member tensor would stay behind).
  auto cpu = make_mixer(c, 0, torch::kCPU);
  cpu->to(torch::kFloat64);
  for (const auto& item : cpu->named_buffers())
    EXPECT_EQ(item.value().scalar_type(), torch::kFloat64) << item.key();
}

// The kind inside a whole model: cached decoding reproduces the full forward's logits.
TEST_P(MixerContract, ModelDecodingEqualsFullForward) {
  const ModelConfig& c = GetParam().config;
  for (auto dtype : {torch::kFloat64, torch::kFloat32}) {
    torch::manual_seed(3);
    LmModel model(c);
    EXPECT_EQ(model->parameter_table().size(), model->named_parameters().size());  // all tagged
    model->to(dtype);
    perturb(*model, 4);
    torch::NoGradGuard no_grad;
    torch::Tensor tokens = torch::randint(c.vocab_size, {kBatch, c.context}, torch::kInt64);
    torch::Tensor full = model->forward(tokens);
    DecodeState state = model->new_decode_state();
    std::vector<torch::Tensor> parts{model->forward(tokens.narrow(1, 0, 4), &state)};
    for (int64_t n = 4; n < c.context; ++n)
      parts.push_back(model->forward(tokens.narrow(1, n, 1), &state));
    torch::Tensor decoded = torch::cat(parts, 1);
    const double tol = dtype == torch::kFloat64 ? 1e-10 : 1e-5;
    EXPECT_TRUE(torch::allclose(decoded, full, tol, tol))
        << c10::toString(dtype) << ": max difference "
        << (decoded - full).abs().max().item<double>();
  }
}

// The kind in every layer of a whole model learns one batch (see expect_overfits_one_batch).
TEST_P(MixerContract, ModelOverfitsOneBatch) {
  expect_overfits_one_batch(GetParam().config);
}

INSTANTIATE_TEST_SUITE_P(AllKinds, MixerContract,
                         testing::ValuesIn(all_variants(mixer_kind_names(), mixer_variants)),
                         variant_name);

// ---- FFNs
// ----------------------------------------------------------------------------------------

class FfnContract : public testing::TestWithParam<Variant> {};

TEST_P(FfnContract, KeepsShapeAndIsPositionWise) {
  const ModelConfig& c = GetParam().config;
  auto ffn = build_ffn(c);
  torch::NoGradGuard no_grad;
  const int64_t N = c.context;
  torch::Tensor x = torch::randn({kBatch, N, c.d_model}, kF64);
  torch::Tensor y = ffn->forward(x);
  ASSERT_EQ(y.sizes(), x.sizes());
  EXPECT_TRUE(torch::isfinite(y).all().item<bool>());
  for (int64_t j = 0; j < N; j += 3) {
    torch::Tensor x2 = x.clone();
    x2.select(1, j).add_(torch::randn({kBatch, c.d_model}, kF64));
    torch::Tensor y2 = ffn->forward(x2);
    torch::Tensor changed = (y2 != y).any(-1).any(0);  // (N): which positions moved
    for (int64_t n = 0; n < N; ++n) {
      EXPECT_EQ(changed[n].item<bool>(), n == j)
          << "changing position " << j << " moved position " << n;
    }
  }
  ffn->to(torch::kFloat32);
  EXPECT_EQ(ffn->forward(torch::randn({kBatch, 3, c.d_model})).scalar_type(), torch::kFloat32);
}

TEST_P(FfnContract, EveryParameterGetsAGradient) {
  const ModelConfig& c = GetParam().config;
  auto ffn = build_ffn(c);
  expect_gradients_reach_every_parameter(
      *ffn, ffn->forward(torch::randn({kBatch, c.context, c.d_model}, kF64)));
}

TEST_P(FfnContract, IsDeterministic) {
  const ModelConfig& c = GetParam().config;
  auto a = build_ffn(c, 5), b = build_ffn(c, 5);
  const auto pa = a->named_parameters(), pb = b->named_parameters();
  ASSERT_EQ(pa.size(), pb.size());
  for (size_t i = 0; i < pa.size(); ++i)
    EXPECT_TRUE(bitwise_equal(pa[i].value(), pb[i].value())) << pa[i].key();
  torch::NoGradGuard no_grad;
  torch::Tensor x = torch::randn({kBatch, c.context, c.d_model}, kF64);
  EXPECT_TRUE(bitwise_equal(a->forward(x), a->forward(x)));
}

TEST_P(FfnContract, MetaDeviceModuleHasTheSameParameters) {
  const ModelConfig& c = GetParam().config;
  auto real = make_ffn(c, 0, torch::kCPU);
  auto meta = make_ffn(c, 0, torch::kMeta);
  EXPECT_EQ(parameter_shapes(*real), parameter_shapes(*meta));
}

// As MixerContract.RunsForwardAndBackwardOnMeta.
TEST_P(FfnContract, RunsForwardAndBackwardOnMeta) {
  const ModelConfig& c = GetParam().config;
  auto ffn = make_ffn(c, 0, torch::kMeta);
  const torch::Tensor x =
      torch::empty({kBatch, c.context, c.d_model}, torch::TensorOptions().device(torch::kMeta))
          .requires_grad_(true);
  const torch::Tensor y = ffn->forward(x);
  EXPECT_TRUE(y.is_meta());
  EXPECT_EQ(y.sizes(), x.sizes());
  y.sum().backward();
  ASSERT_TRUE(x.grad().defined());
  for (const auto& item : ffn->named_parameters()) {
    if (!item.value().requires_grad()) continue;
    ASSERT_TRUE(item.value().grad().defined()) << item.key();
    EXPECT_TRUE(item.value().grad().is_meta()) << item.key();
    EXPECT_EQ(item.value().grad().sizes(), item.value().sizes()) << item.key();
  }
}

// The kind in every layer of a whole model learns one batch (see expect_overfits_one_batch).
TEST_P(FfnContract, ModelOverfitsOneBatch) {
  expect_overfits_one_batch(GetParam().config);
}

INSTANTIATE_TEST_SUITE_P(AllKinds, FfnContract,
                         testing::ValuesIn(all_variants(ffn_kind_names(), ffn_variants)),
                         variant_name);

// Attention-only models (ffn = "none": no FFN sub-layer) learn one batch with a softmax mixer of
// each family. (The block itself is tested in tests/model/lm_model_test.cpp.)
TEST(Contract, AttentionOnlyModelOverfitsOneBatch) {
  for (const char* mixer : {"mha", "cem_attention"}) {
    SCOPED_TRACE(mixer);
    ModelConfig c = tiny_base();
    c.mixer = mixer;
    c.ffn = kNoFfn;
    expect_overfits_one_batch(c);
  }
}

// Every registered kind is covered: the hooks must not drop one.
TEST(Contract, CoversEveryRegisteredKind) {
  std::map<std::string, int> mixers, ffns;
  for (const Variant& v : all_variants(mixer_kind_names(), mixer_variants)) ++mixers[v.kind];
  for (const Variant& v : all_variants(ffn_kind_names(), ffn_variants)) ++ffns[v.kind];
  for (const std::string& k : mixer_kind_names()) EXPECT_GE(mixers[k], 1) << k;
  for (const std::string& k : ffn_kind_names()) EXPECT_GE(ffns[k], 1) << k;
}

}  // namespace
}  // namespace cemfrac
