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

// `path` is a checkpoint directory or a run directory (its newest complete checkpoint). Tensors
// named "cls.<x>" (a fine-tuning head) go to LoadedModel::head; every other tensor must be the
// model's. `overrides` ("model.cem.steps=4", as --set) change architecture fields that no
// parameter's shape depends on, before the model is built: only the fields marked
// OnCheckpoint::kMayChange in their visit_fields() (e.g. model.cem.steps: evaluating a T = 2 model
// at T = 4, test-time scaling), read as the run config reads --set. Any other key is a one-line
// error naming it. The model is built on `device` and the checkpoint's tensors are copied there (a
// checkpoint holds host tensors, so one saved from any device loads on any other; on kMeta only
// shapes are checked). How messages name the path and the overrides: the CLI's flags, or Python's
// cemfrac.load.
struct LoadLabels {
  std::string path = "--checkpoint";
  std::string overrides = "--set";
};
LoadedModel load_model(const std::string& path, const std::vector<std::string>& overrides = {},
                       torch::Device device = torch::kCPU, const LoadLabels& labels = {});

// train.init_from: a new run that starts from a checkpoint's weights. Every parameter of `model`
// whose name the checkpoint (a checkpoint or run directory, read as load_model reads it) also has
// is copied from it, inside sub-layers of the same kind (layer l's attention when both models have
// the same mixer there, its FFN likewise; norms when the norm kind is the same; embeddings and head
// always); a name with another shape there is a one-line error naming both shapes; parameters
// the checkpoint lacks keep their fresh initialisation (e.g. a CoFrGeNet-F FFN started beside a
// GPT-2's embeddings and attention); checkpoint tensors the model lacks, fine-tuning heads and
// state buffers (ladder ranges, recorded afresh) are left out. The tokenizers must be the same (the
// embedding rows are its ids): `tokenizer` is the run's data tokenizer (null = not checked). Fails
// when no tensor at all fits. On the meta device only names and shapes are checked.
struct InitFromReport {
  std::string checkpoint;           // resolved
  std::vector<std::string> loaded;  // copied from the checkpoint
  std::vector<std::string> fresh;   // the model's, not in the checkpoint
  std::vector<std::string> unused;  // the checkpoint's, not in the model
};
InitFromReport init_from_checkpoint(LmModelImpl& model, const std::string& path,
                                    const Tokenizer* tokenizer);

// The checkpoint's config.json with `overrides` applied (the checks of load_model); exposed for
// tests.
ModelConfig apply_model_overrides(const nlohmann::json& config_json,
                                  const std::vector<std::string>& overrides,
                                  const std::string& source, const std::string& flag = "--set");

}  // namespace cemfrac
