#include "cemfrac/layers/base/layer_norm.h"

#include <torch/types.h>

namespace cemfrac {

LayerNormImpl::LayerNormImpl(int64_t d_model, double eps, bool with_bias, torch::Device device)
    : d_model_(d_model), eps_(eps) {
  weight = add_parameter("weight", init_constant({d_model}, 1.0, device), ParamKind::kNorm,
                         ParamGroup::kNoDecay);
  if (with_bias) {
    bias = add_parameter("bias", init_constant({d_model}, 0.0, device), ParamKind::kNorm,
                         ParamGroup::kNoDecay);
  }
}

torch::Tensor LayerNormImpl::forward(const torch::Tensor& x) {
  return torch::layer_norm(x, {d_model_}, weight, bias, eps_);
}

}  // namespace cemfrac
