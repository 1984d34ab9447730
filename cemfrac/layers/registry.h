// Mixer, FFN and norm kinds by name (model/layer_factory.h builds the modules from a ModelConfig).
// Adding a kind: see CONTRIBUTING.md, "How to add a mixer or FFN kind".
#pragma once
#include <array>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "cemfrac/core/fields.h"

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
// The norm is one per model (model.norm), so it is an enum-valued config field (core/fields.h);
// mixer and FFN kinds are names, since a layer override's "" means the model-wide kind.
enum class NormKind { kLayerNorm, kRmsNorm };
template <>
struct EnumNames<NormKind> {
  static constexpr std::array<std::pair<NormKind, const char*>, 2> kNames = {
      {{NormKind::kLayerNorm, "layernorm"}, {NormKind::kRmsNorm, "rmsnorm"}}};
};

const char* to_string(MixerKind kind);
const char* to_string(FfnKind kind);

// Name -> kind; an unknown name throws cemfrac::Error listing the valid names. `what` names the
// setting in the message (e.g. "model.mixer").
MixerKind parse_mixer_kind(const std::string& name, const std::string& what = "mixer");
FfnKind parse_ffn_kind(const std::string& name, const std::string& what = "ffn");
// A block's FFN sub-layer by name, where "none" (kNoFfn) means the block has none: the block is
// z += mixer(norm1(z)) alone, without norm2 (an attention-only model, docs/config.md). Null for
// "none"; an unknown name throws cemfrac::Error naming "none" and listing the kinds.
inline constexpr const char* kNoFfn = "none";
std::optional<FfnKind> parse_block_ffn(const std::string& name, const std::string& what = "ffn");

std::vector<std::string> mixer_kind_names();
std::vector<std::string> ffn_kind_names();

}  // namespace cemfrac
