// FFN "swiglu" (Shazeer 2020; Llama): y = w_down(silu(w_gate x) * (w_up x)); Llama has no biases,
// model.bias = true adds them (zero-initialised). Checkpoint keys under blocks.<l>.mlp.: w_gate (M,
// D), w_up (M, D), w_down (D, M) (residual projection: std / sqrt(2L)); with bias b_gate (M), b_up
// (M), b_down (D).
#pragma once
#include <torch/types.h>

#include "cemfrac/layers/base/gelu_mlp.h"  // FfnOptions
#include "cemfrac/layers/mixer.h"

namespace cemfrac {

class SwiGluImpl : public FfnImpl {
 public:
  explicit SwiGluImpl(const FfnOptions& options);
  torch::Tensor forward(const torch::Tensor& x) override;
  double forward_flops_per_token() const override;

  torch::Tensor w_gate, b_gate, w_up, b_up, w_down,
      b_down;  // biases undefined without options.bias()
};

}  // namespace cemfrac
