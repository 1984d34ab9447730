// FFN "swiglu" (Shazeer 2020; Llama): y = w_down(silu(w_gate x) * (w_up x)), no biases.
// Checkpoint keys under blocks.<l>.mlp.: w_gate (M, D), w_up (M, D), w_down (D, M) (residual
// projection: std / sqrt(2L)).
#pragma once
#include <torch/types.h>

#include "cemfrac/layers/base/gelu_mlp.h"  // FfnOptions
#include "cemfrac/layers/mixer.h"

namespace cemfrac {

class SwiGluImpl : public FfnImpl {
 public:
  explicit SwiGluImpl(const FfnOptions& options);  // options.bias() is ignored: SwiGLU has none
  torch::Tensor forward(const torch::Tensor& x) override;

  torch::Tensor w_gate, w_up, w_down;
};

}  // namespace cemfrac
