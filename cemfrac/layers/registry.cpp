// Plain switches over the kinds: grep-able, independent of link order, and the compiler warns about a
// kind without a case.
#include "cemfrac/layers/registry.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cmath>

#include "cemfrac/core/check.h"
#include "cemfrac/layers/base/gelu_mlp.h"
#include "cemfrac/layers/base/layer_norm.h"
#include "cemfrac/layers/base/mha.h"
#include "cemfrac/layers/base/rms_norm.h"
#include "cemfrac/layers/base/swiglu.h"
#include "cemfrac/model/model_config.h"

namespace cemfrac {

const char* to_string(MixerKind kind) {
  switch (kind) {
    case MixerKind::kMha: return "mha";
    case MixerKind::kSentinel: break;
  }
  return "?";
}

const char* to_string(FfnKind kind) {
  switch (kind) {
    case FfnKind::kGeluMlp: return "gelu_mlp";
    case FfnKind::kSwiGlu: return "swiglu";
    case FfnKind::kSentinel: break;
  }
  return "?";
}

const char* to_string(NormKind kind) {
  switch (kind) {
    case NormKind::kLayerNorm: return "layernorm";
    case NormKind::kRmsNorm: return "rmsnorm";
    case NormKind::kSentinel: break;
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

// GPT-2: the projections that write into the residual stream start 1/sqrt(2L) smaller, so the
// stream's variance does not grow with depth.
double residual_init_std(const ModelConfig& c) {
  return c.init_std / std::sqrt(2.0 * static_cast<double>(c.n_layers));
}

}  // namespace

MixerKind parse_mixer_kind(const std::string& name, const std::string& what) {
  return parse_kind<MixerKind>(name, what, "mixer");
}
FfnKind parse_ffn_kind(const std::string& name, const std::string& what) {
  return parse_kind<FfnKind>(name, what, "FFN");
}
NormKind parse_norm_kind(const std::string& name, const std::string& what) {
  return parse_kind<NormKind>(name, what, "norm");
}

std::vector<std::string> mixer_kind_names() { return names_of<MixerKind>(); }
std::vector<std::string> ffn_kind_names() { return names_of<FfnKind>(); }
std::vector<std::string> norm_kind_names() { return names_of<NormKind>(); }

std::shared_ptr<MixerImpl> make_mixer(const ModelConfig& c, int64_t layer, torch::Device device) {
  switch (parse_mixer_kind(c.mixer_of(layer))) {
    case MixerKind::kMha:
      return std::make_shared<MhaImpl>(MhaOptions(c.d_model, c.n_heads)
                                           .n_kv_heads(c.kv_heads())
                                           .bias(c.bias)
                                           .rope(c.positions == "rope")
                                           .init_std(c.init_std)
                                           .out_init_std(residual_init_std(c))
                                           .device(device));
    case MixerKind::kSentinel: break;
  }
  TORCH_INTERNAL_ASSERT(false, "make_mixer: unhandled kind");
}

std::shared_ptr<FfnImpl> make_ffn(const ModelConfig& c, int64_t layer, torch::Device device) {
  const FfnOptions options = FfnOptions(c.d_model, c.d_ff)
                                 .bias(c.bias)
                                 .init_std(c.init_std)
                                 .out_init_std(residual_init_std(c))
                                 .device(device);
  switch (parse_ffn_kind(c.ffn_of(layer))) {
    case FfnKind::kGeluMlp: return std::make_shared<GeluMlpImpl>(options);
    case FfnKind::kSwiGlu: return std::make_shared<SwiGluImpl>(options);
    case FfnKind::kSentinel: break;
  }
  TORCH_INTERNAL_ASSERT(false, "make_ffn: unhandled kind");
}

std::shared_ptr<NormImpl> make_norm(const ModelConfig& c, torch::Device device) {
  switch (parse_norm_kind(c.norm)) {
    case NormKind::kLayerNorm: return std::make_shared<LayerNormImpl>(c.d_model, c.norm_eps, c.bias, device);
    case NormKind::kRmsNorm: return std::make_shared<RmsNormImpl>(c.d_model, c.norm_eps, device);
    case NormKind::kSentinel: break;
  }
  TORCH_INTERNAL_ASSERT(false, "make_norm: unhandled kind");
}

}  // namespace cemfrac
