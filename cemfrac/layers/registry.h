// Mixer, FFN and norm kinds by name, and the one place that builds them from a ModelConfig.
// Adding a kind: see CONTRIBUTING.md, "How to add a mixer or FFN kind".
#pragma once
#include <torch/types.h>

#include <memory>
#include <string>
#include <vector>

#include "cemfrac/layers/mixer.h"

namespace cemfrac {

struct ModelConfig;

enum class MixerKind {
  kMha,
  kCemAttention,
  kCAttnU,
  kCAttnM,
  kSynthesizerDense,
  kSparseAttention,
  kSentinel
};
enum class FfnKind { kGeluMlp, kSwiGlu, kCemMlp, kCffn, kSentinel };
enum class NormKind { kLayerNorm, kRmsNorm, kSentinel };

const char* to_string(MixerKind kind);
const char* to_string(FfnKind kind);
const char* to_string(NormKind kind);

// Name -> kind; an unknown name throws cemfrac::Error listing the valid names. `what` names the
// setting in the message (e.g. "model.mixer").
MixerKind parse_mixer_kind(const std::string& name, const std::string& what = "mixer");
FfnKind parse_ffn_kind(const std::string& name, const std::string& what = "ffn");
NormKind parse_norm_kind(const std::string& name, const std::string& what = "norm");

std::vector<std::string> mixer_kind_names();
std::vector<std::string> ffn_kind_names();
std::vector<std::string> norm_kind_names();

// The modules of layer `layer` (its mixer_of / ffn_of kind), parameters created on `device` (use
// torch::kMeta for shape-only models). The config must be valid.
std::shared_ptr<MixerImpl> make_mixer(const ModelConfig& config, int64_t layer, torch::Device device);
std::shared_ptr<FfnImpl> make_ffn(const ModelConfig& config, int64_t layer, torch::Device device);
std::shared_ptr<NormImpl> make_norm(const ModelConfig& config, torch::Device device);

}  // namespace cemfrac
