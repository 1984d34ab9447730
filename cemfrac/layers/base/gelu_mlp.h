// FFN "gelu_mlp" (GPT-2): y = c_proj(gelu_tanh(c_fc(x))). Checkpoint keys under blocks.<l>.mlp.:
//   w_fc (M, D), b_fc (M) when bias, w_proj (D, M) (residual projection: std / sqrt(2L)), b_proj
//   (D).
#pragma once
#include <torch/arg.h>
#include <torch/types.h>

#include "cemfrac/layers/mixer.h"

namespace cemfrac {

struct FfnOptions {
  FfnOptions(int64_t d_model, int64_t d_ff) : d_model_(d_model), d_ff_(d_ff) {}
  TORCH_ARG(int64_t, d_model);
  TORCH_ARG(int64_t, d_ff);
  TORCH_ARG(bool, bias) = false;
  TORCH_ARG(double, init_std) = 0.02;
  TORCH_ARG(double, out_init_std) = 0.02;  // of the projection back to D
  TORCH_ARG(torch::Device, device) = torch::kCPU;
};

class GeluMlpImpl : public FfnImpl {
 public:
  explicit GeluMlpImpl(const FfnOptions& options);
  torch::Tensor forward(const torch::Tensor& x) override;
  double forward_flops_per_token() const override;

  torch::Tensor w_fc, b_fc, w_proj, b_proj;
};

}  // namespace cemfrac
