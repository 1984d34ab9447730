// RMSNorm (Zhang & Sennrich 2019; Llama): y = x / sqrt(mean(x^2) + eps) * weight. No bias.
#pragma once
#include <torch/types.h>

#include "cemfrac/layers/mixer.h"

namespace cemfrac {

class RmsNormImpl : public NormImpl {
 public:
  RmsNormImpl(int64_t d_model, double eps, torch::Device device);
  torch::Tensor forward(const torch::Tensor& x) override;

  torch::Tensor weight;  // (D,) "weight", initialised to 1

 private:
  double eps_;
};

}  // namespace cemfrac
