// LayerNorm (Ba et al. 2016; GPT-2): y = (x - mean) / sqrt(var + eps) * weight (+ bias).
#pragma once
#include <torch/types.h>

#include "cemfrac/layers/mixer.h"

namespace cemfrac {

class LayerNormImpl : public NormImpl {
 public:
  LayerNormImpl(int64_t d_model, double eps, bool bias, torch::Device device);
  torch::Tensor forward(const torch::Tensor& x) override;

  torch::Tensor weight;  // (D,) "weight", 1
  torch::Tensor bias;    // (D,) "bias", 0; undefined when bias=false

 private:
  int64_t d_model_;
  double eps_;
};

}  // namespace cemfrac
