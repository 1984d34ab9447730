// apply_rope(): the fused Function over kernels::rope_cpu and its reference twin (see rope.h).
#include "cemfrac/ops/rope.h"

#include <ATen/ATen.h>
#include <torch/autograd.h>

#include "cemfrac/kernels/kernels.h"

namespace cemfrac {

at::Tensor apply_rope_reference(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                                bool inverse) {
  const int64_t half = x.size(-1) / 2;
  const at::Tensor s = inverse ? -sin : sin;
  at::Tensor x1 = x.narrow(-1, 0, half);     // (B, h, N, d_h/2)
  at::Tensor x2 = x.narrow(-1, half, half);  // (B, h, N, d_h/2)
  return at::cat({x1 * cos - x2 * s, x2 * cos + x1 * s}, -1);
}

namespace {

// One pass over x (B, h, N, d_h), any strides (copied first unless the last one is 1): y has x's
// layout (empty_like keeps the strides of a dense tensor), so a rotated transpose view stays a view
// for the caller.
at::Tensor fused_rope(const at::Tensor& x_in, const at::Tensor& cos, const at::Tensor& sin,
                      bool inverse) {
  const at::Tensor x = x_in.stride(3) == 1 ? x_in : x_in.contiguous();
  at::Tensor y = at::empty_like(x);
  kernels::rope_cpu(x, cos.contiguous(), sin.contiguous(), inverse, y);
  return y;
}

// y = R x is a rotation per pair of channels, so the gradient is the inverse rotation R^T g; the
// backward calls the same Function, so it is differentiable again (double backward, create_graph).
class RopeFunction : public torch::autograd::Function<RopeFunction> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                            const at::Tensor& cos, const at::Tensor& sin, bool inverse) {
    ctx->save_for_backward({cos, sin});
    ctx->saved_data["inverse"] = inverse;
    return fused_rope(x.detach(), cos, sin, inverse);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const bool inverse = ctx->saved_data["inverse"].toBool();
    // y = R x  ->  dx = R^T dy: the same rotation with the angles negated.
    return {apply_rope(grads[0], saved[0], saved[1], !inverse), at::Tensor(), at::Tensor(),
            at::Tensor()};
  }
};

}  // namespace

at::Tensor apply_rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                      bool inverse) {
  const bool fused = x.dim() == 4 && x.device().is_cpu() && x.size(3) % 2 == 0 &&
                     (x.scalar_type() == at::kFloat || x.scalar_type() == at::kDouble) &&
                     cos.scalar_type() == x.scalar_type() && sin.scalar_type() == x.scalar_type() &&
                     cos.dim() == 2 && cos.size(0) == x.size(2) && cos.size(1) * 2 == x.size(3) &&
                     sin.sizes() == cos.sizes() && !cos.requires_grad() && !sin.requires_grad();
  if (!fused) return apply_rope_reference(x, cos, sin, inverse);
  return RopeFunction::apply(x, cos, sin, inverse);
}

}  // namespace cemfrac
