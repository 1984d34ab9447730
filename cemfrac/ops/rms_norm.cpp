// rms_norm(): the fused Function over kernels::rms_norm_*_cpu and its reference twin (see
// rms_norm.h).
#include "cemfrac/ops/rms_norm.h"

#include <ATen/ATen.h>
#include <torch/autograd.h>

#include "cemfrac/kernels/kernels.h"

namespace cemfrac {

at::Tensor rms_norm_reference(const at::Tensor& x, const at::Tensor& weight, double eps) {
  const at::Tensor inv_rms = at::rsqrt(x.square().mean(-1, /*keepdim=*/true) + eps);  // (..., 1)
  return x * inv_rms * weight;
}

namespace {

class RmsNormFunction : public torch::autograd::Function<RmsNormFunction> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x_in,
                            const at::Tensor& weight, double eps) {
    const int64_t D = x_in.size(-1);
    const at::Tensor x = x_in.detach().contiguous();
    const at::Tensor w = weight.detach().contiguous();
    const at::Tensor x2 = x.view({-1, D});
    at::Tensor y = at::empty_like(x2);
    at::Tensor r = at::empty({x2.size(0)}, x.options());
    kernels::rms_norm_forward_cpu(x2, w, eps, y, r);
    ctx->save_for_backward({x_in, weight, r});  // the inputs themselves: create_graph needs them
    ctx->saved_data["eps"] = eps;
    return y.view(x_in.sizes());
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &weight = saved[1], &r = saved[2];
    const int64_t D = x.size(-1);
    if (at::GradMode::is_enabled()) {
      // create_graph: the same gradient (kernels.h) in differentiable tensor ops of x, the weight
      // and the incoming gradient, so that a second derivative flows through all three.
      const double eps = ctx->saved_data["eps"].toDouble();
      const at::Tensor rr = at::rsqrt(x.square().mean(-1, /*keepdim=*/true) + eps);
      const at::Tensor xh = x * rr, gxh = grads[0] * weight;
      const at::Tensor gx = rr * (gxh - xh * (gxh * xh).mean(-1, /*keepdim=*/true));
      const at::Tensor gw = (grads[0] * xh).reshape({-1, D}).sum(0);
      return {gx, gw, at::Tensor()};
    }
    const at::Tensor x2 = x.contiguous().view({-1, D});
    const at::Tensor gy = grads[0].contiguous().view({-1, D});
    at::Tensor gx = at::empty_like(x2);
    at::Tensor gw = at::empty({D}, x.options());
    kernels::rms_norm_backward_cpu(x2, weight.contiguous(), r, gy, gx, gw);
    return {gx.view(x.sizes()), gw, at::Tensor()};
  }
};

}  // namespace

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  const bool fused = x.dim() >= 1 && x.numel() > 0 && x.device().is_cpu() &&
                     (x.scalar_type() == at::kFloat || x.scalar_type() == at::kDouble) &&
                     weight.scalar_type() == x.scalar_type() && weight.dim() == 1 &&
                     weight.size(0) == x.size(-1) && weight.device().is_cpu();
  if (!fused) return rms_norm_reference(x, weight, eps);
  return RmsNormFunction::apply(x, weight, eps);
}

}  // namespace cemfrac
