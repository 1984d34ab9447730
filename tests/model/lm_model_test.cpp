// The whole model: causality, tied embeddings, cached decoding, initialisation and the parameter
// table (exact counts of the published shapes, equality with an instantiated model). That every
// kind's model learns one batch is part of the contract suite (tests/layers/contract_test.cpp).
#include <gtest/gtest.h>
#include <torch/optim/sgd.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "cemfrac/core/check.h"
#include "cemfrac/layers/registry.h"
#include "cemfrac/model/lm_model.h"
#include "cemfrac/train/budget.h"
#include "cemfrac/train/run_config.h"
#include "tests/model_test_util.h"
#include "tests/test_util.h"

namespace cemfrac {
namespace {

ModelConfig preset(const std::string& name) {
  return load_run_config(test::source_path("configs/" + name + ".toml")).model;
}

const char* const kTinyPresets[] = {"tiny-llama", "tiny-gpt2"};

torch::Tensor random_tokens(int64_t B, int64_t N, int64_t V, uint64_t seed) {
  torch::manual_seed(seed);
  return torch::randint(V, {B, N}, torch::kInt64);
}

// Changing token j never changes the logits before j, bitwise.
void check_causality(const ModelConfig& config, const std::string& name, torch::Dtype dtype) {
  SCOPED_TRACE(name + (dtype == torch::kFloat64 ? " float64" : " float32"));
  torch::manual_seed(1);
  LmModel model(config);
  model->to(dtype);
  torch::NoGradGuard no_grad;
  const int64_t N = 24, V = model->config().vocab_size;
  torch::Tensor tokens = random_tokens(2, N, V, 5);
  torch::Tensor base = model->forward(tokens);
  for (int64_t j : {int64_t{0}, int64_t{1}, int64_t{9}, N - 1}) {
    torch::Tensor changed = tokens.clone();
    changed.select(1, j).add_(1).remainder_(V);
    torch::Tensor logits = model->forward(changed);
    EXPECT_TRUE(torch::equal(logits.narrow(1, 0, j), base.narrow(1, 0, j))) << "token " << j;
    // ...while the changed position itself does see the change (the test can fail).
    EXPECT_FALSE(torch::equal(logits.select(1, j), base.select(1, j))) << "token " << j;
  }
}

TEST(LmModel, CausalFloat64) {
  for (const char* name : kTinyPresets) check_causality(preset(name), name, torch::kFloat64);
}
TEST(LmModel, CausalFloat32) {
  for (const char* name : kTinyPresets) check_causality(preset(name), name, torch::kFloat32);
}

TEST(LmModel, LogitsShape) {
  LmModel model(preset("tiny-llama"));
  torch::Tensor logits = model->forward(random_tokens(3, 10, 512, 1));
  EXPECT_EQ(logits.sizes(), (std::vector<int64_t>{3, 10, 512}));
  EXPECT_EQ(logits.scalar_type(), torch::kFloat32);
}

// Prompt in one forward, then single tokens and a chunk, batch 3: logits equal one full forward.
void check_cached_decoding(const std::string& name) {
  SCOPED_TRACE(name);
  torch::manual_seed(2);
  LmModel model(preset(name));
  torch::NoGradGuard no_grad;
  const int64_t N = 20;
  torch::Tensor tokens = random_tokens(3, N, model->config().vocab_size, 9);
  torch::Tensor full = model->forward(tokens);  // (3, N, V)
  DecodeState state = model->new_decode_state();
  std::vector<torch::Tensor> pieces;
  int64_t start = 0;
  for (int64_t len : {7, 1, 1, 1, 3, 1, 1, 1, 1, 1, 1, 1}) {
    pieces.push_back(model->forward(tokens.narrow(1, start, len), &state));
    start += len;
  }
  ASSERT_EQ(start, N);
  EXPECT_EQ(state.position, N);
  torch::Tensor cached = torch::cat(pieces, 1);
  const double worst = (cached - full).abs().max().item<double>();
  EXPECT_LE(worst, 1e-5) << "max |cached - full| = " << worst;
}

TEST(LmModel, CachedDecodingEqualsFullForwardLlama) {
  check_cached_decoding("tiny-llama");
}
TEST(LmModel, CachedDecodingEqualsFullForwardGpt2) {
  check_cached_decoding("tiny-gpt2");
}

TEST(LmModel, LongerThanContextIsAClearError) {
  LmModel model(preset("tiny-gpt2"));  // context 64
  torch::NoGradGuard no_grad;
  EXPECT_THROW(model->forward(random_tokens(1, 65, 512, 1)), Error);
  DecodeState state = model->new_decode_state();
  model->forward(random_tokens(1, 60, 512, 1), &state);
  try {
    model->forward(random_tokens(1, 5, 512, 2), &state);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("context of 64"), std::string::npos) << e.what();
  }
  EXPECT_EQ(state.position, 60);  // unchanged by the failed call
}

TEST(LmModel, TiedEmbeddingsShareStorage) {
  torch::manual_seed(4);
  LmModel model(preset("tiny-gpt2"));
  ASSERT_TRUE(model->config().tie_embeddings);
  EXPECT_EQ(model->head_weight().data_ptr(), model->wte().weight.data_ptr());
  // One tensor: no head parameter, the table lists wte once with tied_to.
  for (const auto& p : model->named_parameters()) EXPECT_NE(p.key(), "head.weight");
  int64_t wte_entries = 0;
  for (const ParamInfo& p : model->parameter_table()) {
    if (p.name == "wte.weight") {
      ++wte_entries;
      EXPECT_EQ(p.tied_to, "head.weight");
    }
  }
  EXPECT_EQ(wte_entries, 1);
  // A gradient step moves both views, and a token that is never input still gets a gradient (from
  // the head).
  const int64_t V = model->config().vocab_size;
  torch::Tensor tokens = torch::arange(0, 16, torch::kInt64).view({1, 16});  // ids 0..15 only
  torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.1));
  torch::Tensor before = model->wte().weight.detach().clone();
  torch::Tensor logits = model->forward(tokens);
  torch::Tensor loss =
      torch::cross_entropy_loss(logits.view({-1, V}), torch::roll(tokens, -1, 1).view({-1}));
  loss.backward();
  EXPECT_GT(model->wte().weight.grad()[V - 1].abs().sum().item<double>(), 0.0);
  sgd.step();
  EXPECT_FALSE(torch::equal(model->wte().weight, before));
  EXPECT_TRUE(torch::equal(model->head_weight(), model->wte().weight));
  EXPECT_EQ(model->head_weight().data_ptr(), model->wte().weight.data_ptr());
}

TEST(LmModel, UntiedHeadIsItsOwnTensor) {
  LmModel model(preset("tiny-llama"));
  EXPECT_NE(model->head_weight().data_ptr(), model->wte().weight.data_ptr());
}

TEST(LmModel, InitIsDeterministicAndFollowsTheRules) {
  for (const char* name : kTinyPresets) {
    SCOPED_TRACE(name);
    torch::manual_seed(42);
    LmModel a(preset(name));
    torch::manual_seed(42);
    LmModel b(preset(name));
    const ModelConfig& c = a->config();
    auto pa = a->named_parameters(), pb = b->named_parameters();
    ASSERT_EQ(pa.size(), pb.size());
    for (size_t i = 0; i < pa.size(); ++i) {
      const std::string& key = pa[i].key();
      const torch::Tensor& t = pa[i].value();
      EXPECT_TRUE(torch::equal(t, pb[i].value())) << key;
      const bool is_norm = key.find("norm") != std::string::npos;
      const bool is_bias =
          key.find(".b_") != std::string::npos || key.find(".bias") != std::string::npos;
      if (is_norm && !is_bias) {
        EXPECT_TRUE(torch::equal(t, torch::ones_like(t))) << key;
      } else if (is_bias) {
        EXPECT_TRUE(torch::equal(t, torch::zeros_like(t))) << key;
      } else if (t.numel() > 2000) {
        const bool residual = key.find("w_o") != std::string::npos ||
                              key.find("w_proj") != std::string::npos ||
                              key.find("w_down") != std::string::npos;
        const double expected = residual ? c.init_std / std::sqrt(2.0 * c.n_layers) : c.init_std;
        EXPECT_NEAR(t.std().item<double>(), expected, 0.1 * expected) << key;
      }
    }
  }
}

// Groups: decay for matrices (including an untied head), no decay for norms, biases, embeddings.
TEST(ParameterTable, KindsAndGroups) {
  for (const char* name : kTinyPresets) {
    SCOPED_TRACE(name);
    LmModel model(preset(name));
    for (const ParamInfo& p : model->parameter_table()) {
      SCOPED_TRACE(p.name);
      if (p.name == "wte.weight" || p.name == "wpe.weight") {
        EXPECT_EQ(p.kind, ParamKind::kEmbedding);
        EXPECT_EQ(p.group, ParamGroup::kNoDecay);
      } else if (p.name == "head.weight") {
        EXPECT_EQ(p.kind, ParamKind::kHead);
        EXPECT_EQ(p.group, ParamGroup::kDecay);
      } else if (p.name.find("norm") != std::string::npos) {
        EXPECT_EQ(p.kind, ParamKind::kNorm);
        EXPECT_EQ(p.group, ParamGroup::kNoDecay);
      } else {
        EXPECT_EQ(p.kind, p.name.find(".attn.") != std::string::npos ? ParamKind::kAttention
                                                                     : ParamKind::kFfn);
        EXPECT_EQ(p.group, p.shape.size() == 2 ? ParamGroup::kDecay : ParamGroup::kNoDecay);
      }
    }
  }
}

// The table of a shape-only (meta) model equals that of an instantiated one, and its sum is the sum
// of numel over the instantiated model's tensors.
TEST(ParameterTable, MetaModelEqualsInstantiatedModel) {
  for (const char* name : {"tiny-llama", "tiny-gpt2", "small-llama", "small-gpt2"}) {
    SCOPED_TRACE(name);
    const ModelConfig config = preset(name);
    LmModel real(config);
    LmModel meta(config, torch::kMeta);
    EXPECT_TRUE(meta->wte().weight.is_meta());
    const auto a = real->parameter_table(), b = meta->parameter_table();
    ASSERT_EQ(a.size(), b.size());
    int64_t table_sum = 0;
    for (size_t i = 0; i < a.size(); ++i) {
      EXPECT_EQ(a[i].name, b[i].name);
      EXPECT_EQ(a[i].shape, b[i].shape);
      EXPECT_EQ(a[i].kind, b[i].kind);
      EXPECT_EQ(a[i].group, b[i].group);
      table_sum += a[i].numel;
    }
    int64_t tensor_sum = 0;
    std::set<const void*> storages;
    for (const torch::Tensor& p : real->parameters()) {
      tensor_sum += p.numel();
      EXPECT_TRUE(storages.insert(p.data_ptr()).second) << "a tensor listed twice";
    }
    EXPECT_EQ(table_sum, tensor_sum);
    EXPECT_EQ(table_sum, meta->num_parameters());
  }
}

int64_t preset_count(const std::string& name) {
  LmModel meta(preset(name), torch::kMeta);
  int64_t total = 0;
  for (const ParamInfo& p : meta->parameter_table()) total += p.numel;
  EXPECT_EQ(total, meta->num_parameters());
  return total;
}

TEST(ParameterTable, PublishedShapesGiveExactCounts) {
  EXPECT_EQ(preset_count("gpt2-124m"), 124439808);
  EXPECT_EQ(preset_count("llama-162m"), 162220800);
  EXPECT_EQ(preset_count("gpt2-xl"), 1557611200);       // GPT-2 XL, "1.5B"
  EXPECT_EQ(preset_count("llama-3.2-3b"), 3212749824);  // Llama 3.2 3B, tied
  EXPECT_EQ(preset_count("small-llama"), 29893120);
  EXPECT_EQ(preset_count("small-gpt2"), 27448320);
}

TEST(ParameterTable, Gpt2ParameterNames) {
  LmModel model(preset("tiny-gpt2"), torch::kMeta);
  std::vector<std::string> names;
  for (const ParamInfo& p : model->parameter_table()) names.push_back(p.name);
  const std::vector<std::string> first_block = {
      "wte.weight",          "wpe.weight",          "blocks.0.norm1.weight",
      "blocks.0.norm1.bias", "blocks.0.attn.w_qkv", "blocks.0.attn.b_qkv",
      "blocks.0.attn.w_o",   "blocks.0.attn.b_o",   "blocks.0.norm2.weight",
      "blocks.0.norm2.bias", "blocks.0.mlp.w_fc",   "blocks.0.mlp.b_fc",
      "blocks.0.mlp.w_proj", "blocks.0.mlp.b_proj"};
  ASSERT_GE(names.size(), first_block.size());
  EXPECT_EQ(std::vector<std::string>(names.begin(), names.begin() + first_block.size()),
            first_block);
  EXPECT_EQ(names[names.size() - 2], "norm_f.weight");
  EXPECT_EQ(names.back(), "norm_f.bias");
}

// Every preset in configs/ builds on the meta device and runs a forward and a backward there: no
// tensor of the model, its layers or its forward is pinned to the CPU (a CPU tensor meeting a meta
// one raises a device mismatch). Shapes only, so the 3 B presets cost no memory.
TEST(LmModel, EveryPresetRunsForwardAndBackwardOnMeta) {
  int64_t presets = 0, per_head = 0;
  for (const auto& entry : std::filesystem::directory_iterator(test::source_path("configs"))) {
    if (entry.path().extension() != ".toml") continue;
    SCOPED_TRACE(entry.path().filename().string());
    const ModelConfig config = load_run_config(entry.path().string()).model;
    if (config.mixer == "cem_attention" && config.cem.dlr == CemDiagonal::kPerHead) ++per_head;
    LmModel model(config, torch::kMeta);
    const int64_t N = std::min<int64_t>(config.context, 8);
    const torch::Tensor tokens =
        torch::empty({2, N}, torch::TensorOptions().dtype(torch::kInt64).device(torch::kMeta));
    const torch::Tensor logits = model->forward(tokens);
    EXPECT_TRUE(logits.is_meta());
    EXPECT_EQ(logits.sizes(), (std::vector<int64_t>{2, N, config.vocab_size}));
    logits.sum().backward();
    for (const auto& item : model->named_parameters()) {
      if (!item.value().requires_grad()) continue;
      ASSERT_TRUE(item.value().grad().defined()) << item.key();
      EXPECT_TRUE(item.value().grad().is_meta()) << item.key();
    }
    ++presets;
  }
  EXPECT_GE(presets, 30);
  EXPECT_GE(per_head, 3) << "the cem-full presets (per-head D+LR) are among them";
}

// Ids on another device than the model's are an error, never read through the wrong pointer (meta
// ids on a CPU model gave finite, made-up logits).
TEST(LmModel, IdsOnAnotherDeviceAreAnError) {
  LmModel model(test::tiny_model(11, 8, 6));
  const torch::Tensor meta_ids =
      torch::zeros({1, 4}, torch::TensorOptions().dtype(torch::kInt64).device(torch::kMeta));
  try {
    model->forward(meta_ids);
    FAIL() << "meta ids on a CPU model were accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("model input is on meta but the model is on cpu"),
              std::string::npos)
        << e.what();
  }
  LmModel meta(test::tiny_model(11, 8, 6), torch::kMeta);
  EXPECT_THROW(meta->forward(torch::zeros({1, 4}, torch::kInt64)), Error);
}

// Layer overrides choose the FFN per layer.
TEST(LmModel, LayerOverridesPickKindsPerLayer) {
  ModelConfig c = preset("tiny-llama");
  c.layer_overrides = {{1, "", "gelu_mlp"}};
  LmModel model(c, torch::kMeta);
  std::set<std::string> names;
  for (const ParamInfo& p : model->parameter_table()) names.insert(p.name);
  EXPECT_TRUE(names.count("blocks.0.mlp.w_gate"));
  EXPECT_TRUE(names.count("blocks.1.mlp.w_fc"));
  EXPECT_FALSE(names.count("blocks.1.mlp.w_gate"));
}

// ffn = "none": each block is z + mixer(norm1(z)) alone. Its parameters are the full model's without
// norm2 and mlp; with the full model's FFN output weights zeroed (so that FFN adds exact zeros) and
// every other weight shared, the logits are bitwise those of the full model; it stays causal, and
// its FLOPs count no FFN.
TEST(LmModel, FfnNoneIsAttentionOnly) {
  ModelConfig full_config = preset("tiny-llama"), none_config = full_config;
  none_config.ffn = kNoFfn;
  torch::manual_seed(3);
  LmModel full(full_config);
  torch::manual_seed(3);
  LmModel none(none_config);
  std::set<std::string> expected, got;
  for (const ParamInfo& p : full->parameter_table()) {
    if (p.name.find(".norm2.") == std::string::npos && p.name.find(".mlp.") == std::string::npos)
      expected.insert(p.name);
  }
  for (const ParamInfo& p : none->parameter_table()) got.insert(p.name);
  EXPECT_EQ(got, expected);
  EXPECT_LT(got.size(), full->parameter_table().size());

  const torch::Tensor tokens = random_tokens(2, 16, full_config.vocab_size, 7);
  torch::NoGradGuard no_grad;
  auto full_params = full->named_parameters();
  for (const auto& item : none->named_parameters()) full_params[item.key()].copy_(item.value());
  EXPECT_FALSE(torch::equal(full->forward(tokens), none->forward(tokens)))
      << "the FFN contributes before its output weights are zeroed (the test can fail)";
  for (int64_t l = 0; l < full_config.n_layers; ++l)
    full_params["blocks." + std::to_string(l) + ".mlp.w_down"].zero_();
  EXPECT_TRUE(torch::equal(full->forward(tokens), none->forward(tokens)));

  check_causality(none_config, "ffn none", torch::kFloat64);
  const Flops flops = model_flops(*none, 2, 16), full_flops = model_flops(*full, 2, 16);
  EXPECT_EQ(flops.ffns, 0.0);
  EXPECT_EQ(flops.mixers, full_flops.mixers);
  EXPECT_FALSE(none->block(0).has_ffn());
  EXPECT_TRUE(full->block(0).has_ffn());
}

// "none" in one layer's override drops that layer's FFN only; an unknown name lists "none".
TEST(LmModel, FfnNoneInALayerOverride) {
  ModelConfig c = preset("tiny-llama");
  c.layer_overrides = {{1, "", kNoFfn}};
  LmModel model(c, torch::kMeta);
  std::set<std::string> names;
  for (const ParamInfo& p : model->parameter_table()) names.insert(p.name);
  EXPECT_TRUE(names.count("blocks.0.mlp.w_gate"));
  EXPECT_TRUE(names.count("blocks.0.norm2.weight"));
  EXPECT_FALSE(names.count("blocks.1.mlp.w_gate"));
  EXPECT_FALSE(names.count("blocks.1.norm2.weight"));
  c.ffn = "nope";
  try {
    c.validate();
    FAIL() << "ffn = nope was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("(\"none\": no FFN sub-layer); valid kinds: gelu_mlp"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace cemfrac
