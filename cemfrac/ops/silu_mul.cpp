// silu_mul(): the fused Function over kernels::silu_mul_*_cpu and its reference twin (see
// silu_mul.h).
#include "cemfrac/ops/silu_mul.h"

#include <ATen/ATen.h>
#include <torch/autograd.h>

#include "cemfrac/kernels/kernels.h"

namespace cemfrac {

at::Tensor silu_mul_reference(const at::Tensor& a, const at::Tensor& b) { return at::silu(a) * b; }

namespace {

class SiluMulFunction : public torch::autograd::Function<SiluMulFunction> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& a_in,
                            const at::Tensor& b_in) {
    const at::Tensor a = a_in.detach().contiguous(), b = b_in.detach().contiguous();
    at::Tensor y = at::empty_like(a, at::MemoryFormat::Contiguous);
    kernels::silu_mul_forward_cpu(a, b, y);
    ctx->save_for_backward({a_in, b_in});  // the inputs themselves: create_graph needs them
    return y;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &a = saved[0], &b = saved[1];
    if (at::GradMode::is_enabled()) {
      // create_graph: the same gradient (kernels.h) in differentiable tensor ops.
      const at::Tensor s = at::sigmoid(a);
      return {grads[0] * b * (s * (1 + a * (1 - s))), grads[0] * (a * s)};
    }
    const at::Tensor ac = a.contiguous(), bc = b.contiguous();
    const at::Tensor g = grads[0].contiguous();
    at::Tensor da = at::empty_like(ac), db = at::empty_like(ac);
    kernels::silu_mul_backward_cpu(ac, bc, g, da, db);
    return {da, db};
  }
};

}  // namespace

at::Tensor silu_mul(const at::Tensor& a, const at::Tensor& b) {
  const bool fused = a.device().is_cpu() && b.device().is_cpu() && a.sizes() == b.sizes() &&
                     (a.scalar_type() == at::kFloat || a.scalar_type() == at::kDouble) &&
                     b.scalar_type() == a.scalar_type() && a.numel() > 0;
  if (!fused) return silu_mul_reference(a, b);
  return SiluMulFunction::apply(a, b);
}

}  // namespace cemfrac
