// CEM kinds inside whole models: the presets' parameter counts (CEM spec §4.2 / §7 property
// 12), the parameter table (one entry per tied tensor, kinds and optimizer groups), cached decoding
// of a whole model at T = 1, 2, 4 (property 9), config checks, and the checkpoint overrides of
// test-time scaling (--set model.cem.steps=4).
#include <gtest/gtest.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <cmath>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cemfrac/core/check.h"
#include "cemfrac/layers/cem/cem_attention.h"
#include "cemfrac/data/tokenizer.h"
#include "cemfrac/model/lm_model.h"
#include "cemfrac/train/checkpoint.h"
#include "cemfrac/train/model_loader.h"
#include "cemfrac/train/run_config.h"
#include "tests/model_test_util.h"
#include "tests/test_util.h"

namespace cemfrac {
namespace {

ModelConfig preset(const std::string& name) {
  return load_run_config(test::source_path("configs/" + name + ".toml")).model;
}

int64_t meta_total(const ModelConfig& c) {
  LmModel meta(c, torch::kMeta);
  int64_t total = 0;
  for (const ParamInfo& p : meta->parameter_table()) total += p.numel;
  EXPECT_EQ(total, meta->num_parameters());
  return total;
}

// Property 12 at the 162M shape: the §4.2 formula, term by term.
TEST(CemModel, PresetParameterCounts162m) {
  const int64_t D = 768, L = 12, H = 12, M = 2048, V = 50304, r = 16;
  const int64_t shared = 2 * V * D + D + L * 2 * D;  // embeddings, final norm, block norms
  EXPECT_EQ(meta_total(preset("llama-162m")), 162220800);
  EXPECT_EQ(meta_total(preset("llama-162m")), shared + L * (4 * D * D + 3 * D * M));
  EXPECT_EQ(meta_total(preset("cem-attn-only-162m")), shared + L * (2 * D * D + 3 * D * M));
  EXPECT_EQ(meta_total(preset("cem-mlp-only-162m")), shared + L * (4 * D * D + 2 * D * M));
  EXPECT_EQ(meta_total(preset("cem-both-162m")), 129190656);
  EXPECT_EQ(meta_total(preset("cem-both-162m")), shared + L * (2 * D * D + 2 * D * M));
  // cem-full: + per-head D+LR (H D) + two preconditioners 2 (D + 2 D r); eta is fixed with P.
  EXPECT_EQ(meta_total(preset("cem-full-162m")),
            shared + L * (2 * D * D + 2 * D * M + H * D + 2 * (D + 2 * D * r)));
  // Learnable eta: + 2 per layer.
  ModelConfig eta = preset("cem-both-162m");
  eta.cem.freeze_eta = false;
  EXPECT_EQ(meta_total(eta), 129190656 + 2 * L);
  // Shared diagonal: + D per layer; PSD preconditioner: D + D r each.
  ModelConfig variant = preset("cem-full-162m");
  variant.cem.dlr = CemDiagonal::kShared;
  variant.cem.precond_psd = true;
  EXPECT_EQ(meta_total(variant), shared + L * (2 * D * D + 2 * D * M + D + 2 * (D + D * r)));
}

// Property 13 at the model: each tied tensor is one entry (one checkpoint key), with its kind and
// optimizer group; no value or output projection exists.
TEST(CemModel, ParameterTableHasOneEntryPerTensor) {
  ModelConfig c = preset("tiny-cem-full");
  LmModel model(c);
  std::map<std::string, ParamInfo> table;
  for (const ParamInfo& p : model->parameter_table()) {
    if (p.name.rfind("blocks.0.", 0) == 0) table[p.name.substr(9)] = p;
  }
  struct Want {
    const char* name;
    ParamKind kind;
    ParamGroup group;
    std::vector<int64_t> shape;
  };
  const int64_t D = c.d_model, H = c.n_heads, M = c.d_ff, r = c.cem.precond_rank;
  const std::vector<Want> want = {
      {"norm1.weight", ParamKind::kNorm, ParamGroup::kNoDecay, {D}},
      {"attn.w_q", ParamKind::kAttention, ParamGroup::kDecay, {D, D}},
      {"attn.w_k", ParamKind::kAttention, ParamGroup::kDecay, {D, D}},
      {"attn.delta", ParamKind::kAttention, ParamGroup::kNoDecay, {H, D}},
      {"attn.precond.p", ParamKind::kAttention, ParamGroup::kNoDecay, {D}},
      {"attn.precond.u", ParamKind::kAttention, ParamGroup::kDecay, {D, r}},
      {"attn.precond.v", ParamKind::kAttention, ParamGroup::kDecay, {D, r}},
      {"norm2.weight", ParamKind::kNorm, ParamGroup::kNoDecay, {D}},
      {"mlp.w_u", ParamKind::kFfn, ParamGroup::kDecay, {M, D}},
      {"mlp.w_g", ParamKind::kFfn, ParamGroup::kDecay, {M, D}},
      {"mlp.precond.p", ParamKind::kFfn, ParamGroup::kNoDecay, {D}},
      {"mlp.precond.u", ParamKind::kFfn, ParamGroup::kDecay, {D, r}},
      {"mlp.precond.v", ParamKind::kFfn, ParamGroup::kDecay, {D, r}},
  };
  ASSERT_EQ(table.size(), want.size());
  for (const Want& w : want) {
    SCOPED_TRACE(w.name);
    ASSERT_EQ(table.count(w.name), 1u);
    EXPECT_EQ(table[w.name].kind, w.kind);
    EXPECT_EQ(table[w.name].group, w.group);
    EXPECT_EQ(table[w.name].shape, w.shape);
  }
  ModelConfig eta = preset("tiny-cem-both");
  eta.cem.freeze_eta = false;
  LmModel with_eta(eta);
  bool found = false;
  for (const ParamInfo& p : with_eta->parameter_table()) {
    if (p.name == "blocks.1.mlp.eta_raw") {
      found = true;
      EXPECT_EQ(p.group, ParamGroup::kNoDecay);
      EXPECT_EQ(p.numel, 1);
    }
  }
  EXPECT_TRUE(found);
}

// cem.eta_init sets every learnable eta at init (attention and MLP, every layer), up to eta_raw's
// float32 rounding; 1 is the default.
TEST(CemModel, EtaInitSetsEveryLearnableEta) {
  for (double init : {1.0, 0.5, 0.125, 3.0}) {
    SCOPED_TRACE(init);
    ModelConfig c = preset("tiny-cem-both");
    c.cem.freeze_eta = false;
    c.cem.eta_init = init;
    LmModel model(c);
    int seen = 0;
    for (const auto& p : model->named_parameters()) {
      if (p.key().size() < 7 || p.key().substr(p.key().size() - 7) != "eta_raw") continue;
      ++seen;
      const double raw = p.value().item<double>();
      const double eta = std::log1p(std::exp(raw));
      // eta_raw is softplus^-1(init) rounded to float32 (relative 2^-24), which moves softplus by
      // at most |raw| 2^-24 sigmoid(raw); doubled for the float64 arithmetic around it.
      const double bound = 2 * std::abs(raw) * std::ldexp(1.0, -24) / (1 + std::exp(-raw));
      EXPECT_NEAR(eta, init, bound);
    }
    EXPECT_EQ(seen, 2 * c.n_layers);
  }
}

// Property 9 for a whole model: token-by-token decoding reproduces the full-sequence logits at
// T = 1, 2, 4 (float64 to 1e-10, float32 to 1e-5), with the K-only cache.
TEST(CemModel, DecodingEqualsFullForward) {
  for (const char* name : {"tiny-cem-full", "tiny-cem-both"}) {
    for (int64_t T : {1, 2, 4}) {
      for (torch::Dtype dtype : {torch::kFloat64, torch::kFloat32}) {
        SCOPED_TRACE(std::string(name) + " T=" + std::to_string(T) +
                     (dtype == torch::kFloat64 ? " f64" : " f32"));
        ModelConfig c = preset(name);
        c.cem.steps = T;
        c.context = 16;
        torch::manual_seed(5);
        LmModel model(c);
        model->to(dtype);
        {
          torch::NoGradGuard no_grad;  // move zero-initialised tensors (V, delta) off zero
          for (auto& p : model->parameters()) p.add_(torch::randn_like(p) * 0.05);
        }
        torch::NoGradGuard no_grad;
        const torch::Tensor tokens = torch::randint(c.vocab_size, {2, 12}, torch::kInt64);
        const torch::Tensor full = model->forward(tokens);
        DecodeState state = model->new_decode_state();
        std::vector<torch::Tensor> parts;
        parts.push_back(model->forward(tokens.narrow(1, 0, 3), &state));
        for (int64_t n = 3; n < 12; ++n)
          parts.push_back(model->forward(tokens.narrow(1, n, 1), &state));
        const double err = (torch::cat(parts, 1) - full).abs().max().item<double>();
        EXPECT_LT(err, dtype == torch::kFloat64 ? 1e-10 : 1e-5);
        const auto& s = static_cast<const CemAttentionState&>(*state.layers[0]);
        EXPECT_EQ(s.k.values().sizes(), (std::vector<int64_t>{2, c.n_heads, 12, c.head_dim()}));
        EXPECT_FALSE(s.v.defined());  // K only: the values are the keys
      }
    }
  }
}

std::string problem_of(const ModelConfig& c) {
  try {
    c.validate();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(CemModel, ConfigErrorsNameTheKeyAndTheValue) {
  ModelConfig c = preset("tiny-cem-both");
  EXPECT_EQ(problem_of(c), "");
  auto with = [&](auto edit) {
    ModelConfig x = c;
    edit(x);
    return problem_of(x);
  };
  EXPECT_NE(with([](ModelConfig& x) { x.cem.steps = 0; }).find("cem.steps = 0: must be in 1..64"),
            std::string::npos);
  // Names are read once, where the config is read (config.json here): an unknown one is refused
  // there, naming the key, the value and the valid names.
  auto read_with = [&](const char* key, const char* value) {
    nlohmann::json j = to_json(c);
    j["cem"][key] = value;
    try {
      model_config_from_json(j, "config.json");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(
      read_with("dlr", "diag").find("cem.dlr = \"diag\": unknown; valid: none, per_head, shared"),
      std::string::npos);
  EXPECT_NE(read_with("rope_mode", "rotary").find("valid: exact, naive, none"), std::string::npos);
  EXPECT_NE(with([](ModelConfig& x) { x.cem.dlr_distance = true; }).find("cem.dlr_distance"),
            std::string::npos);
  EXPECT_NE(with([](ModelConfig& x) { x.cem.precond_rank = 0; }).find("cem.precond_rank = 0"),
            std::string::npos);
  EXPECT_NE(with([](ModelConfig& x) {
              x.cem.attention = CemAttentionKernel::kLinear;
              x.cem.dlr = CemDiagonal::kShared;
            }).find("cem.attention = \"linear\" has no D+LR form"),
            std::string::npos);
  EXPECT_NE(read_with("attention", "relu")
                .find("cem.attention = \"relu\": unknown; valid: softmax, linear"),
            std::string::npos);
  EXPECT_NE(read_with("mlp_form", "c").find("cem.mlp_form = \"c\""), std::string::npos);
  EXPECT_NE(read_with("recursion_keys", "h")
                .find("cem.recursion_keys = \"h\": unknown; valid: fixed, iterate"),
            std::string::npos);
  EXPECT_NE(read_with("prox", "on").find("cem.prox = \"on\": unknown; valid: none, learned, fixed"),
            std::string::npos);
  EXPECT_NE(
      read_with("step_norm", "layer").find("cem.step_norm = \"layer\": unknown; valid: none, rms"),
      std::string::npos);
  EXPECT_NE(with([](ModelConfig& x) { x.n_kv_heads = 2; }).find("n_kv_heads = 2: cem_attention"),
            std::string::npos);
  // eta_init: a positive finite number, and only where eta is learnable.
  auto learnable = [&](double init) {
    return with([init](ModelConfig& x) {
      x.cem.freeze_eta = false;
      x.cem.eta_init = init;
    });
  };
  EXPECT_EQ(learnable(0.5), "");
  EXPECT_NE(learnable(0.0).find("cem.eta_init = 0: must be a finite number > 0"), std::string::npos);
  EXPECT_NE(learnable(-1.0).find("cem.eta_init = -1"), std::string::npos);
  EXPECT_NE(learnable(std::numeric_limits<double>::infinity()).find("cem.eta_init = inf"),
            std::string::npos);
  EXPECT_NE(with([](ModelConfig& x) { x.cem.eta_init = 0.5; })
                .find("cem.eta_init = 0.5 has no effect: eta is fixed at 1 (freeze_eta = true)"),
            std::string::npos);
  EXPECT_NE(with([](ModelConfig& x) {
              x.cem.freeze_eta = false;
              x.cem.precond = true;
              x.cem.eta_init = 0.5;
            }).find("(precond = true)"),
            std::string::npos);
  // Through the run config and its TOML/--set path: the nested table's key.
  const std::string path = test::source_path("configs/tiny-cem-both.toml");
  try {
    load_run_config(path, {"model.cem.steps=0"});
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cem.steps = 0"), std::string::npos) << e.what();
  }
  EXPECT_EQ(load_run_config(path, {"model.cem.steps=3"}).model.cem.steps, 3);
}

// Test-time scaling: a checkpoint's config may change T (and the other shape-free fields), nothing
// else; the parameters of the overridden model are those of the original.
TEST(CemModel, CheckpointOverridesChangeOnlyShapeFreeFields) {
  const ModelConfig c = preset("tiny-cem-full");
  const nlohmann::json j = to_json(c);
  const ModelConfig t4 =
      apply_model_overrides(j, {"model.cem.steps=4", "model.cem.rope_mode=none"}, "x");
  EXPECT_EQ(t4.cem.steps, 4);
  EXPECT_EQ(t4.cem.rope_mode, CemRopeMode::kNone);
  LmModel a(c, torch::kMeta), b(t4, torch::kMeta);
  const auto ta = a->parameter_table(), tb = b->parameter_table();
  ASSERT_EQ(ta.size(), tb.size());
  for (size_t i = 0; i < ta.size(); ++i) {
    EXPECT_EQ(ta[i].name, tb[i].name);
    EXPECT_EQ(ta[i].shape, tb[i].shape);
  }
  auto error = [&](const std::string& set) {
    try {
      apply_model_overrides(j, {set}, "ckpt/config.json");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(
      error("model.cem.dlr=shared").find("--set model.cem.dlr=shared: a checkpoint's architecture"),
      std::string::npos);
  EXPECT_NE(error("model.cem.precond_rank=4")
                .find("model.cem.{steps, rope_mode, dlr_distance, mlp_form, recursion, "
                      "recursion_keys, step_norm}"),
            std::string::npos);
  EXPECT_NE(error("model.d_model=32").find("--set model.d_model=32"), std::string::npos);
  EXPECT_NE(error("model.cem.steps=0").find("cem.steps = 0: must be in 1..64"), std::string::npos);
  EXPECT_NE(error("model.cem.steps=two").find("cem.steps"), std::string::npos);
}

// A checkpoint of a T = 2 model (byte tokenizer), evaluated and sampled at other T through the CLI:
// the test-time scaling the paper proposes. In process, load_model with the override gives exactly
// the T = 4 model with the checkpoint's weights.
TEST(CemModel, EvalAndGenerateAtAnotherT) {
  ModelConfig c = preset("tiny-cem-full");
  c.vocab_size = 256 + 8;  // the byte tokenizer's ids
  c.context = 32;
  torch::manual_seed(11);
  LmModel model(c);
  {
    torch::NoGradGuard no_grad;
    for (auto& p : model->parameters()) p.add_(torch::randn_like(p) * 0.05);
  }
  ASSERT_LE(make_tokenizer("byte")->vocab_size(), c.vocab_size);
  const std::string dir = test::save_byte_checkpoint(model, "cem_tts");
  const std::string run = test::temp_dir("cem_tts_text");

  // In process: the override builds the T = 4 model around the same weights.
  LoadedModel t4 = load_model(dir, {"model.cem.steps=4"});
  EXPECT_EQ(t4.model->config().cem.steps, 4);
  ModelConfig c4 = c;
  c4.cem.steps = 4;
  LmModel direct(c4);
  {
    torch::NoGradGuard no_grad;
    auto dst = direct->named_parameters();
    for (const auto& p : model->named_parameters()) dst[p.key()].copy_(p.value());
  }
  torch::NoGradGuard no_grad;
  const torch::Tensor tokens = torch::randint(256, {1, 20}, torch::kInt64);
  EXPECT_TRUE(torch::allclose(t4.model->forward(tokens), direct->forward(tokens), 0, 1e-6));
  EXPECT_FALSE(torch::allclose(t4.model->forward(tokens), model->forward(tokens), 0, 1e-4));

  // Through the CLI.
  const std::string text = run + "/text.txt";
  test::write_file(text, "The jury said it did find that the election was conducted.\n");
  auto eval_loss = [&](std::vector<std::string> extra) {
    std::vector<std::string> args = {"eval", "--checkpoint", dir, "--text", text, "--json"};
    args.insert(args.end(), extra.begin(), extra.end());
    const test::RunResult r = test::run_cemfrac(args);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return nlohmann::json::parse(r.out)["mean_loss"].get<double>();
  };
  const double at2 = eval_loss({}), at2_again = eval_loss({"--set", "model.cem.steps=2"});
  const double at4 = eval_loss({"--set", "model.cem.steps=4"});
  EXPECT_EQ(at2, at2_again);
  EXPECT_NE(at2, at4);
  // The energy diagnostic: every CEM sub-layer, T + 1 values (before and after each step).
  const test::RunResult traced =
      test::run_cemfrac({"eval", "--checkpoint", dir, "--text", text, "--json", "--cem-energy",
                         "--set", "model.cem.steps=3"});
  ASSERT_EQ(traced.exit_code, 0) << traced.err;
  const nlohmann::json energy = nlohmann::json::parse(traced.out)["cem_energy"];
  EXPECT_EQ(energy.size(), 2u * c.n_layers);
  for (const char* name : {"blocks.0.attn", "blocks.0.mlp", "blocks.1.attn", "blocks.1.mlp"}) {
    ASSERT_TRUE(energy.contains(name)) << energy.dump();
    EXPECT_EQ(energy[name].size(), 4u) << name;
  }
  const test::RunResult gen =
      test::run_cemfrac({"generate", "--checkpoint", dir, "--prompt", "The", "--max-new-tokens",
                         "8", "--temperature", "0", "--set", "model.cem.steps=4"});
  EXPECT_EQ(gen.exit_code, 0) << gen.err;
  test::expect_one_line_error(test::run_cemfrac({"eval", "--checkpoint", dir, "--text", text,
                                                 "--set", "model.cem.dlr=shared"}),
                              "--set model.cem.dlr=shared: a checkpoint's architecture is fixed");
  test::expect_one_line_error(
      test::run_cemfrac({"generate", "--checkpoint", dir, "--set", "model.cem.steps=0"}),
      "cem.steps = 0: must be in 1..64");
}

}  // namespace
}  // namespace cemfrac
