// Mixer, FFN and norm kinds by name (model/layer_factory.h builds the modules from a ModelConfig).
// Adding a kind: see CONTRIBUTING.md, "How to add a mixer or FFN kind".
#pragma once
#include <string>
#include <vector>

namespace cemfrac {

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

}  // namespace cemfrac
