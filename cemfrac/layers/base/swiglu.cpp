#include "cemfrac/layers/base/swiglu.h"

#include <torch/types.h>

#include "cemfrac/ops/linear.h"
#include "cemfrac/ops/silu_mul.h"

namespace cemfrac {

SwiGluImpl::SwiGluImpl(const FfnOptions& o) {
  const int64_t D = o.d_model(), M = o.d_ff();
  auto bias = [&](const char* name, int64_t n) {
    return add_parameter(name, init_constant({n}, 0.0, o.device()), ParamKind::kFfn,
                         ParamGroup::kNoDecay);
  };
  w_gate = add_parameter("w_gate", init_normal({M, D}, o.init_std(), o.device()), ParamKind::kFfn,
                         ParamGroup::kDecay);
  if (o.bias()) b_gate = bias("b_gate", M);
  w_up = add_parameter("w_up", init_normal({M, D}, o.init_std(), o.device()), ParamKind::kFfn,
                       ParamGroup::kDecay);
  if (o.bias()) b_up = bias("b_up", M);
  w_down = add_parameter("w_down", init_normal({D, M}, o.out_init_std(), o.device()),
                         ParamKind::kFfn, ParamGroup::kDecay);
  if (o.bias()) b_down = bias("b_down", D);
}

torch::Tensor SwiGluImpl::forward(const torch::Tensor& x) {
  torch::Tensor gate = cemfrac::linear(x, w_gate, b_gate);  // (B, N, M)
  torch::Tensor up = cemfrac::linear(x, w_up, b_up);        // (B, N, M)
  // silu(gate) * up, forward and backward in one pass each (ops/silu_mul.h).
  return cemfrac::linear(silu_mul(gate, up), w_down, b_down);  // (B, N, D)
}

// w_gate, w_up and w_down: 2 D M each.
double SwiGluImpl::forward_flops_per_token() const {
  return 2.0 * double(w_gate.numel() + w_up.numel() + w_down.numel());
}

}  // namespace cemfrac
