// Kind names: plain switches over the kinds, grep-able, independent of link order, and the compiler
// warns about a kind without a case. The modules are built from a ModelConfig in
// model/layer_factory.cpp.
#include "cemfrac/layers/registry.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "cemfrac/core/check.h"

namespace cemfrac {

const char* to_string(MixerKind kind) {
  switch (kind) {
    case MixerKind::kMha: return "mha";
    case MixerKind::kCemAttention: return "cem_attention";
    case MixerKind::kCAttnU: return "cattn_u";
    case MixerKind::kCAttnM: return "cattn_m";
    case MixerKind::kSynthesizerDense: return "synthesizer_dense";
    case MixerKind::kSparseAttention: return "sparse_attention";
    case MixerKind::kSentinel: break;
  }
  return "?";
}

const char* to_string(FfnKind kind) {
  switch (kind) {
    case FfnKind::kGeluMlp: return "gelu_mlp";
    case FfnKind::kSwiGlu: return "swiglu";
    case FfnKind::kCemMlp: return "cem_mlp";
    case FfnKind::kCffn: return "cffn";
    case FfnKind::kSentinel: break;
  }
  return "?";
}

namespace {

template <typename Kind>
std::vector<std::string> names_of() {
  std::vector<std::string> names;
  for (int i = 0; i < static_cast<int>(Kind::kSentinel); ++i) names.push_back(to_string(Kind(i)));
  return names;
}

template <typename Kind>
Kind parse_kind(const std::string& name, const std::string& what, const char* noun) {
  for (int i = 0; i < static_cast<int>(Kind::kSentinel); ++i) {
    if (name == to_string(Kind(i))) return Kind(i);
  }
  fail("{} = \"{}\": unknown {} kind; valid kinds: {}", what, name, noun,
       fmt::join(names_of<Kind>(), ", "));
}

}  // namespace

MixerKind parse_mixer_kind(const std::string& name, const std::string& what) {
  return parse_kind<MixerKind>(name, what, "mixer");
}
FfnKind parse_ffn_kind(const std::string& name, const std::string& what) {
  return parse_kind<FfnKind>(name, what, "FFN");
}

std::optional<FfnKind> parse_block_ffn(const std::string& name, const std::string& what) {
  if (name == kNoFfn) return std::nullopt;
  for (int i = 0; i < static_cast<int>(FfnKind::kSentinel); ++i) {
    if (name == to_string(FfnKind(i))) return FfnKind(i);
  }
  fail("{} = \"{}\": unknown FFN kind (\"{}\": no FFN sub-layer); valid kinds: {}", what, name,
       kNoFfn, fmt::join(names_of<FfnKind>(), ", "));
}

std::vector<std::string> mixer_kind_names() {
  return names_of<MixerKind>();
}
std::vector<std::string> ffn_kind_names() {
  return names_of<FfnKind>();
}

}  // namespace cemfrac
