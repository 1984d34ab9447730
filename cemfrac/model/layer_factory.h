// The one place that builds mixer, FFN and norm modules from a ModelConfig: each kind's case
// converts the config fields into that module's options (the one Config -> Options conversion). The
// kinds and their names live in layers/registry.h; adding a kind: CONTRIBUTING.md, "How to add a
// mixer or FFN kind".
#pragma once
#include <torch/types.h>

#include <memory>

#include "cemfrac/layers/mixer.h"
#include "cemfrac/model/model_config.h"

namespace cemfrac {

// The modules of layer `layer` (its mixer_of / ffn_of kind), parameters created on `device` (use
// torch::kMeta for shape-only models). The config must be valid.
std::shared_ptr<MixerImpl> make_mixer(const ModelConfig& config, int64_t layer,
                                      torch::Device device);
std::shared_ptr<FfnImpl> make_ffn(const ModelConfig& config, int64_t layer, torch::Device device);
std::shared_ptr<NormImpl> make_norm(const ModelConfig& config, torch::Device device);

}  // namespace cemfrac
