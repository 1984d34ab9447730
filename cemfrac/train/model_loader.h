// Loading a trained model for eval and generate: the checkpoint's config.json is the only source of
// truth for the architecture; its weights are loaded by name (missing, extra and mis-shaped tensors
// are one-line errors) and the tokenizer saved beside them is loaded too.
#pragma once
#include <memory>
#include <string>

#include "cemfrac/data/tokenizer.h"
#include "cemfrac/model/lm_model.h"

namespace cemfrac {

struct LoadedModel {
  std::string checkpoint;                // the resolved checkpoint directory
  LmModel model{nullptr};                // in eval mode
  std::unique_ptr<Tokenizer> tokenizer;  // null when the checkpoint has none
  int64_t step = 0;                      // optimizer steps the checkpoint had taken
};

// `path` is a checkpoint directory or a run directory (its newest complete checkpoint).
LoadedModel load_model(const std::string& path);

}  // namespace cemfrac
