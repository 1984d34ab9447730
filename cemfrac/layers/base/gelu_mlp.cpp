#include "cemfrac/layers/base/gelu_mlp.h"
#include "cemfrac/ops/linear.h"

#include <torch/types.h>

namespace cemfrac {

GeluMlpImpl::GeluMlpImpl(const FfnOptions& o) {
  const int64_t D = o.d_model(), M = o.d_ff();
  w_fc = add_parameter("w_fc", init_normal({M, D}, o.init_std(), o.device()), ParamKind::kFfn,
                       ParamGroup::kDecay);
  if (o.bias()) {
    b_fc = add_parameter("b_fc", init_constant({M}, 0.0, o.device()), ParamKind::kFfn,
                         ParamGroup::kNoDecay);
  }
  w_proj = add_parameter("w_proj", init_normal({D, M}, o.out_init_std(), o.device()),
                         ParamKind::kFfn, ParamGroup::kDecay);
  if (o.bias()) {
    b_proj = add_parameter("b_proj", init_constant({D}, 0.0, o.device()), ParamKind::kFfn,
                           ParamGroup::kNoDecay);
  }
}

torch::Tensor GeluMlpImpl::forward(const torch::Tensor& x) {
  torch::Tensor h = cemfrac::linear(x, w_fc, b_fc);  // (B, N, M)
  h = torch::gelu(h, "tanh");                        // GPT-2's tanh approximation
  return cemfrac::linear(h, w_proj, b_proj);         // (B, N, D)
}

// c_fc and c_proj: 2 D M each.
double GeluMlpImpl::forward_flops_per_token() const {
  return 2.0 * double(w_fc.numel()) + 2.0 * double(w_proj.numel());
}

}  // namespace cemfrac
