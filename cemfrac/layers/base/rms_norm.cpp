#include "cemfrac/layers/base/rms_norm.h"

#include <torch/types.h>

namespace cemfrac {

RmsNormImpl::RmsNormImpl(int64_t d_model, double eps, torch::Device device) : eps_(eps) {
  weight = add_parameter("weight", init_constant({d_model}, 1.0, device), ParamKind::kNorm,
                         ParamGroup::kNoDecay);
}

torch::Tensor RmsNormImpl::forward(const torch::Tensor& x) {
  torch::Tensor inv_rms = torch::rsqrt(x.square().mean(-1, /*keepdim=*/true) + eps_);  // (B, N, 1)
  return x * inv_rms * weight;
}

}  // namespace cemfrac
