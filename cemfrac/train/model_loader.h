// Loading a trained model for eval and generate: the checkpoint's config.json is the only source of
// truth for the architecture; its weights are loaded by name (missing, extra and mis-shaped tensors
// are one-line errors) and the tokenizer saved beside them is loaded too.
#pragma once
#include <map>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "cemfrac/data/tokenizer.h"
#include "cemfrac/model/lm_model.h"

namespace cemfrac {

struct LoadedModel {
  std::string checkpoint;                // the resolved checkpoint directory
  LmModel model{nullptr};                // in eval mode
  std::unique_ptr<Tokenizer> tokenizer;  // null when the checkpoint has none
  int64_t step = 0;                      // optimizer steps the checkpoint had taken
  // A fine-tuned checkpoint's classification head (tasks/finetune.h): its "cls.*" tensors, set
  // aside from the backbone; empty for a language-model checkpoint.
  std::map<std::string, torch::Tensor> head;
};

// `path` is a checkpoint directory or a run directory (its newest complete checkpoint). Tensors named
// "cls.<x>" (a fine-tuning head) go to LoadedModel::head; every other tensor must be the model's.
// `overrides` ("model.cem.steps=4", as --set) change architecture fields that no parameter's shape
// depends on, before the model is built: only the fields marked OnCheckpoint::kMayChange in their
// visit_fields() (e.g. model.cem.steps: evaluating a T = 2 model at T = 4, test-time scaling), read
// as the run config reads --set. Any other key is a one-line error naming it.
// The model is built on `device` and the checkpoint's tensors are copied there (a checkpoint holds
// host tensors, so one saved from any device loads on any other; on kMeta only shapes are checked).
LoadedModel load_model(const std::string& path, const std::vector<std::string>& overrides = {},
                       torch::Device device = torch::kCPU);

// The checkpoint's config.json with `overrides` applied (the checks of load_model); exposed for
// tests.
ModelConfig apply_model_overrides(const nlohmann::json& config_json,
                                  const std::vector<std::string>& overrides,
                                  const std::string& source);

}  // namespace cemfrac
