// LayerObserver (cemfrac/layers/mixer.h) through LmModelImpl::set_observer: every CEM sub-layer of
// a model reports its energies under its module name, and attaching or detaching an observer does
// not change the logits (cemfrac eval --cem-energy reads the energies this way; cem_model_test
// checks the CLI's output).
#include <gtest/gtest.h>
#include <torch/types.h>

#include <map>
#include <string>
#include <vector>

#include "cemfrac/model/lm_model.h"
#include "cemfrac/train/run_config.h"
#include "tests/test_util.h"

namespace cemfrac {
namespace {

TEST(LayerObserver, CemSubLayersReportEnergiesByModuleName) {
  ModelConfig c = load_run_config(test::source_path("configs/tiny-cem-both.toml")).model;
  c.cem.steps = 2;
  torch::manual_seed(1);
  LmModel model(c);
  torch::NoGradGuard no_grad;
  const torch::Tensor tokens = torch::randint(c.vocab_size, {2, 8}, torch::kInt64);
  const torch::Tensor plain = model->forward(tokens);

  std::map<std::string, std::vector<int64_t>> seen;  // name -> shape
  model->set_observer([&](const std::string& name, const torch::Tensor& value) {
    seen[name] = value.sizes().vec();
  });
  const torch::Tensor observed = model->forward(tokens);
  for (int64_t l = 0; l < c.n_layers; ++l) {
    for (const char* sub : {"attn", "mlp"}) {
      for (int t = 0; t <= 2; ++t) {
        const std::string name =
            "blocks." + std::to_string(l) + "." + sub + ".energy." + std::to_string(t);
        ASSERT_TRUE(seen.count(name)) << name;
        EXPECT_EQ(seen[name], (std::vector<int64_t>{2, 8})) << name;
      }
    }
  }
  EXPECT_EQ(seen.size(), static_cast<size_t>(c.n_layers * 2 * 3));
  // The observed forward takes the direct loop: the same function to rounding.
  EXPECT_TRUE(torch::allclose(observed, plain, 1e-4, 1e-5));

  model->set_observer(nullptr);  // detached: nothing more is reported
  seen.clear();
  model->forward(tokens);
  EXPECT_TRUE(seen.empty());
}

}  // namespace
}  // namespace cemfrac
