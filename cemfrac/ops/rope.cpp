// apply_rope(): the operator cemfrac::rope (ops/library.h) over kernels::rope_cpu, its ATen twin,
// Meta and Autograd kernels (see rope.h).
#include "cemfrac/ops/rope.h"

#include <ATen/ATen.h>
#include <torch/autograd.h>
#include <torch/library.h>

#include "cemfrac/kernels/kernels.h"
#include "cemfrac/ops/library.h"

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

using RopeSig = at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&, bool);

// The shapes the operator takes: x (B, h, N, d_h), d_h even, cos and sin (N, d_h/2), one dtype.
void check_rope_input(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                      const char* where) {
  TORCH_CHECK(x.dim() == 4 && x.size(3) % 2 == 0, where,
              ": x must be (B, h, N, d_h) with d_h even, got ", x.sizes());
  TORCH_CHECK(cos.dim() == 2 && cos.size(0) == x.size(2) && cos.size(1) * 2 == x.size(3) &&
                  sin.sizes() == cos.sizes(),
              where, ": cos and sin must be (N, d_h/2) for x ", x.sizes(), ", got ", cos.sizes(),
              " and ", sin.sizes());
  TORCH_CHECK(cos.scalar_type() == x.scalar_type() && sin.scalar_type() == x.scalar_type(), where,
              ": x, cos and sin must have one dtype");
}

at::Tensor rope_twin(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                     bool inverse) {
  check_rope_input(x, cos, sin, "cemfrac::rope");
  return apply_rope_reference(x, cos, sin, inverse);
}

// One pass over x (B, h, N, d_h), any strides (copied first unless the last one is 1): y has x's
// layout (empty_like keeps the strides of a dense tensor), so a rotated transpose view stays a view
// for the caller.
at::Tensor rope_cpu(const at::Tensor& x_in, const at::Tensor& cos, const at::Tensor& sin,
                    bool inverse) {
  check_rope_input(x_in, cos, sin, "cemfrac::rope");
  if (x_in.scalar_type() != at::kFloat && x_in.scalar_type() != at::kDouble) {
    return apply_rope_reference(x_in, cos, sin, inverse);
  }
  const at::Tensor x = x_in.stride(3) == 1 ? x_in : x_in.contiguous();
  at::Tensor y = at::empty_like(x);
  kernels::rope_cpu(x, cos.contiguous(), sin.contiguous(), inverse, y);
  return y;
}

at::Tensor rope_meta(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, bool) {
  check_rope_input(x, cos, sin, "cemfrac::rope");
  return at::empty_like(x);
}

// y = R x is a rotation per pair of channels, so the gradient is the inverse rotation R^T g: the
// same operator, so the backward is differentiable again (double backward, create_graph).
class RopeFunction : public torch::autograd::Function<RopeFunction> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                            const at::Tensor& cos, const at::Tensor& sin, bool inverse) {
    static const auto rope_op = ops::op<RopeSig>("rope");
    ctx->save_for_backward({cos, sin});
    ctx->saved_data["inverse"] = inverse;
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    return rope_op.call(x, cos, sin, inverse);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    static const auto rope_op = ops::op<RopeSig>("rope");
    const auto saved = ctx->get_saved_variables();
    const bool inverse = ctx->saved_data["inverse"].toBool();
    // y = R x  ->  dx = R^T dy: the same rotation with the angles negated.
    return {rope_op.call(grads[0], saved[0], saved[1], !inverse), at::Tensor(), at::Tensor(),
            at::Tensor()};
  }
};

at::Tensor rope_autograd(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                         bool inverse) {
  if (at::GradMode::is_enabled() && (cos.requires_grad() || sin.requires_grad())) {
    // Gradients for the tables too: the twin in tensor ops, differentiated by autograd.
    check_rope_input(x, cos, sin, "cemfrac::rope");
    return apply_rope_reference(x, cos, sin, inverse);
  }
  if (at::GradMode::is_enabled() && x.requires_grad()) {
    return RopeFunction::apply(x, cos, sin, inverse);
  }
  static const auto rope_op = ops::op<RopeSig>("rope");
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  return rope_op.call(x, cos, sin, inverse);
}

}  // namespace

at::Tensor apply_rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                      bool inverse) {
  // Shapes the operator does not take (broadcast tables, mixed dtypes): the reference.
  const bool op_shapes = x.dim() == 4 && x.size(3) % 2 == 0 &&
                         cos.scalar_type() == x.scalar_type() &&
                         sin.scalar_type() == x.scalar_type() && cos.dim() == 2 &&
                         cos.size(0) == x.size(2) && cos.size(1) * 2 == x.size(3) &&
                         sin.sizes() == cos.sizes();
  if (!op_shapes) return apply_rope_reference(x, cos, sin, inverse);
  static const auto rope_op = ops::op<RopeSig>("rope");
  return rope_op.call(x, cos, sin, inverse);
}

extern const bool kRopeKernels = true;  // ops/library.cpp's link anchor

}  // namespace cemfrac

TORCH_LIBRARY_IMPL(cemfrac, CPU, m) {
  m.impl("rope", &cemfrac::rope_cpu);
}

TORCH_LIBRARY_IMPL(cemfrac, Meta, m) {
  m.impl("rope", &cemfrac::rope_meta);
}

TORCH_LIBRARY_IMPL(cemfrac, CompositeExplicitAutograd, m) {
  m.impl("rope", &cemfrac::rope_twin);
}

TORCH_LIBRARY_IMPL(cemfrac, Autograd, m) {
  m.impl("rope", &cemfrac::rope_autograd);
}
