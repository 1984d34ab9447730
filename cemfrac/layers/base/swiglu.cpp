#include "cemfrac/layers/base/swiglu.h"

#include <torch/torch.h>

namespace cemfrac {

SwiGluImpl::SwiGluImpl(const FfnOptions& o) {
  const int64_t D = o.d_model(), M = o.d_ff();
  w_gate = add_parameter("w_gate", init_normal({M, D}, o.init_std(), o.device()), ParamKind::kFfn,
                         ParamGroup::kDecay);
  w_up = add_parameter("w_up", init_normal({M, D}, o.init_std(), o.device()), ParamKind::kFfn,
                       ParamGroup::kDecay);
  w_down = add_parameter("w_down", init_normal({D, M}, o.out_init_std(), o.device()),
                         ParamKind::kFfn, ParamGroup::kDecay);
}

torch::Tensor SwiGluImpl::forward(const torch::Tensor& x) {
  torch::Tensor gate = torch::silu(torch::linear(x, w_gate));  // (B, N, M)
  torch::Tensor up = torch::linear(x, w_up);                   // (B, N, M)
  return torch::linear(gate * up, w_down);                     // (B, N, D)
}

}  // namespace cemfrac
