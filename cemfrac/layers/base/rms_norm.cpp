#include "cemfrac/layers/base/rms_norm.h"

#include <torch/types.h>

#include "cemfrac/ops/rms_norm.h"

namespace cemfrac {

RmsNormImpl::RmsNormImpl(int64_t d_model, double eps, torch::Device device) : eps_(eps) {
  weight = add_parameter("weight", init_constant({d_model}, 1.0, device), ParamKind::kNorm,
                         ParamGroup::kNoDecay);
}

torch::Tensor RmsNormImpl::forward(const torch::Tensor& x) {
  return rms_norm(x, weight, eps_);  // fused forward and backward (ops/rms_norm.h)
}

}  // namespace cemfrac
