// The transformers mapping without transformers (python/tests/test_hf_interop.py runs the real
// library): which presets export, the refusals, export -> import bitwise, and the CEM models that
// export as Llama computing the same logits in float64 (the tied tensors written out and eta folded
// in are the same function, not an approximation).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>

#include "cemfrac/interop/hf.h"
#include "cemfrac/model/lm_model.h"
#include "cemfrac/train/run_config.h"
#include "tests/test_util.h"

namespace cemfrac {
namespace {

ModelConfig preset(const std::string& name, const std::vector<std::string>& sets = {}) {
  return load_run_config(test::source_path("configs/" + name + ".toml"), sets).model;
}

TensorMap parameters(LmModel& model) {
  TensorMap out;
  for (const auto& p : model->named_parameters()) out[p.key()] = p.value().detach();
  return out;
}

// Every preset either exports (to the class its family expects) or is refused in one sentence.
TEST(HfExport, EveryPresetExportsOrIsRefusedInOneLine) {
  int exported = 0, refused = 0;
  for (const auto& entry : std::filesystem::directory_iterator(test::source_path("configs"))) {
    if (entry.path().extension() != ".toml") continue;
    const std::string name = entry.path().stem().string();
    SCOPED_TRACE(name);
    HfArch arch = HfArch::kLlama;
    const std::string problem = hf_export_problem(preset(name), &arch);
    EXPECT_EQ(problem.find('\n'), std::string::npos);
    if (problem.empty()) {
      ++exported;
      const bool gpt2_family = name.find("gpt2") != std::string::npos;
      EXPECT_EQ(arch, gpt2_family ? HfArch::kGpt2 : HfArch::kLlama);
    } else {
      ++refused;
    }
  }
  EXPECT_GE(exported, 6);  // gpt2 and llama at every scale
  EXPECT_GE(refused, 10);  // CEM with exact RoPE, CoFrGeNet, synthesizer, sparse attention
  EXPECT_EQ(hf_export_problem(preset("gpt2-124m")), "");
  EXPECT_EQ(hf_export_problem(preset("llama-3.2-3b")), "");
  EXPECT_NE(hf_export_problem(preset("cem-both-162m")).find("rope_mode = exact"),
            std::string::npos);
  EXPECT_NE(hf_export_problem(preset("gpt2-xl-cofrgenet-f")).find("cffn"), std::string::npos);
  EXPECT_NE(hf_export_problem(preset("tiny-llama", {"model.ffn=none"})).find("has no FFN"),
            std::string::npos);
  EXPECT_NE(hf_export_problem(
                preset("tiny-cem-both", {"model.cem.rope_mode=naive", "model.cem.dlr=shared"}))
                .find("cem.dlr"),
            std::string::npos);
  EXPECT_NE(hf_export_problem(
                preset("tiny-cem-both", {"model.cem.rope_mode=naive", "model.cem.precond=true"}))
                .find("precond"),
            std::string::npos);
  EXPECT_NE(hf_export_problem(preset("tiny-llama", {"model.norm=layernorm"})).find("rmsnorm"),
            std::string::npos);
  EXPECT_NE(hf_export_problem(preset("tiny-gpt2", {"model.positions=rope"})).find("learned"),
            std::string::npos);
}

// cemfrac -> transformers -> cemfrac gives every tensor back bit for bit, and the config back.
TEST(HfExport, ExportThenImportIsBitwise) {
  const std::vector<std::pair<std::string, std::vector<std::string>>> cases = {
      {"tiny-gpt2", {}},
      {"tiny-gpt2", {"model.tie_embeddings=false"}},
      {"tiny-llama", {}},
      {"tiny-llama", {"model.bias=true", "model.tie_embeddings=true"}},
      {"tiny-llama",
       {"model.rope_scaling.type=llama3", "model.rope_scaling.factor=4",
        "model.rope_scaling.original_context=16", "model.rope_theta=500000"}},
  };
  for (const auto& [name, sets] : cases) {
    SCOPED_TRACE(name + " " + (sets.empty() ? "" : sets[0]));
    torch::manual_seed(3);
    const ModelConfig config = preset(name, sets);
    LmModel model(config);
    if (config.bias) {  // biases start at 0, which import would drop: make them count
      torch::NoGradGuard g;
      for (auto& p : model->named_parameters())
        if (p.key().find(".b_") != std::string::npos) p.value().normal_();
    }
    const TensorMap ours = parameters(model);
    const HfImported back =
        from_hf(hf_config_json(config, nullptr), to_hf_tensors(config, ours), "test");
    ModelConfig want = config;
    if (want.n_kv_heads == want.n_heads) want.n_kv_heads = 0;
    EXPECT_EQ(to_json(back.config).dump(), to_json(want).dump());
    ASSERT_EQ(back.tensors.size(), ours.size());
    for (const auto& [n, t] : ours) {
      ASSERT_TRUE(back.tensors.count(n)) << n;
      EXPECT_TRUE(torch::equal(back.tensors.at(n), t)) << n;
    }
  }
}

// GPT-2 without biases exports zeros (GPT2LMHeadModel always has them) and imports as bias = false.
TEST(HfExport, AllZeroBiasesComeBackAsNoBias) {
  const ModelConfig config = preset("tiny-gpt2", {"model.bias=false"});
  LmModel model(config);
  const TensorMap hf = to_hf_tensors(config, parameters(model));
  EXPECT_TRUE(hf.count("transformer.h.0.attn.c_attn.bias"));
  const HfImported back = from_hf(hf_config_json(config, nullptr), hf, "test");
  EXPECT_FALSE(back.config.bias);
  ASSERT_EQ(back.notes.size(), 1u);
  EXPECT_NE(back.notes[0].find("bias = false"), std::string::npos);
}

// A CEM model exported as Llama is the same function: the imported Llama's float64 logits equal the
// CEM model's to float64 roundoff, for both MLP forms, learnable eta (folded into o and down) and a
// CEM layer beside an MHA one.
TEST(HfExport, CemAsLlamaIsExactInFloat64) {
  const std::vector<std::vector<std::string>> cases = {
      {"model.cem.rope_mode=naive", "model.cem.freeze_eta=false", "model.cem.eta_init=0.6"},
      {"model.cem.rope_mode=naive", "model.cem.mlp_form=b", "model.cem.freeze_eta=false",
       "model.cem.eta_init=1.7"},
      {"model.cem.rope_mode=naive", "model.cem.freeze_eta=true",
       "model.layer_overrides=[{layer=1, mixer=\"mha\", ffn=\"swiglu\"}]"},
  };
  for (const auto& sets : cases) {
    SCOPED_TRACE(sets.back());
    torch::manual_seed(7);
    const ModelConfig config = preset("tiny-cem-both", sets);
    LmModel cem(config);
    cem->to(torch::kFloat64);
    // float64 tensors through the float32 mapping: the mapping itself does not round.
    const HfImported llama =
        from_hf(hf_config_json(config, nullptr), to_hf_tensors(config, parameters(cem)), "test");
    EXPECT_EQ(llama.config.mixer, "mha");
    EXPECT_EQ(llama.config.ffn, "swiglu");
    LmModel twin(llama.config);
    twin->to(torch::kFloat64);
    {
      torch::NoGradGuard g;
      for (auto& p : twin->named_parameters()) p.value().copy_(llama.tensors.at(p.key()));
    }
    torch::NoGradGuard g;
    torch::manual_seed(9);
    const torch::Tensor tokens = torch::randint(config.vocab_size, {2, 24}, torch::kInt64);
    const torch::Tensor a = cem->forward(tokens), b = twin->forward(tokens);
    const double scale = a.abs().max().item<double>();
    EXPECT_LT((a - b).abs().max().item<double>(), 1e-12 * std::max(scale, 1.0));
    // ...and the test can fail: without the folded eta the logits differ.
    if (config.cem.learn_eta()) {
      torch::Tensor w = twin->named_parameters()["blocks.0.attn.w_o"];
      w.mul_(2);
      EXPECT_GT((cem->forward(tokens) - twin->forward(tokens)).abs().max().item<double>(), 1e-6);
    }
  }
}

}  // namespace
}  // namespace cemfrac
