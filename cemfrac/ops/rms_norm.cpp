// rms_norm(): the operator cemfrac::rms_norm (ops/library.h) over kernels::rms_norm_*_cpu, its
// ATen twin, Meta and Autograd kernels (see rms_norm.h).
#include "cemfrac/ops/rms_norm.h"

#include <ATen/ATen.h>
#include <torch/autograd.h>
#include <torch/library.h>

#include <tuple>
#include <vector>

#include "cemfrac/kernels/kernels.h"
#include "cemfrac/ops/library.h"

namespace cemfrac {

at::Tensor rms_norm_reference(const at::Tensor& x, const at::Tensor& weight, double eps) {
  const at::Tensor inv_rms = at::rsqrt(x.square().mean(-1, /*keepdim=*/true) + eps);  // (..., 1)
  return x * inv_rms * weight;
}

namespace {

using ForwardSig = std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&, double);
using BackwardSig = std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&,
                                                       const at::Tensor&, const at::Tensor&,
                                                       double);
using NormSig = at::Tensor(const at::Tensor&, const at::Tensor&, double);

// The shapes the operator takes: x (..., D) with D >= 1 and at least one row, weight (D), one dtype.
void check_norm_input(const at::Tensor& x, const at::Tensor& weight, const char* where) {
  TORCH_CHECK(x.dim() >= 1 && x.numel() > 0, where, ": x must be a non-empty (..., D) tensor, got ",
              x.sizes());
  TORCH_CHECK(weight.dim() == 1 && weight.size(0) == x.size(-1), where,
              ": weight must be (D) with D = x.size(-1), got ", weight.sizes(), " for x ",
              x.sizes());
  TORCH_CHECK(weight.scalar_type() == x.scalar_type(), where, ": x and weight dtypes differ (",
              x.scalar_type(), ", ", weight.scalar_type(), ")");
}

std::vector<int64_t> row_shape(const at::Tensor& x) {
  return std::vector<int64_t>(x.sizes().begin(), x.sizes().end() - 1);
}

bool has_kernel_dtype(const at::Tensor& x) {
  return x.scalar_type() == at::kFloat || x.scalar_type() == at::kDouble;
}

// ---- The ATen twin --------------------------------------------------------------------------------

std::tuple<at::Tensor, at::Tensor> rms_norm_forward_twin(const at::Tensor& x,
                                                         const at::Tensor& weight, double eps) {
  check_norm_input(x, weight, "cemfrac::rms_norm_forward");
  const at::Tensor r = at::rsqrt(x.square().mean(-1, /*keepdim=*/true) + eps);
  return {(x * r * weight).contiguous(), r.squeeze(-1)};
}

at::Tensor rms_norm_twin(const at::Tensor& x, const at::Tensor& weight, double eps) {
  return std::get<0>(rms_norm_forward_twin(x, weight, eps));
}

// The gradient (kernels.h) in differentiable tensor ops of x, the weight and the incoming gradient:
// autograd differentiates it again (second derivatives). r is recomputed from x, never read.
//   gx = r (gy w - xh mean(gy w xh)),  xh = x r;   gw = sum_rows gy xh
std::tuple<at::Tensor, at::Tensor> rms_norm_backward_closed_form(const at::Tensor& grad_y,
                                                                 const at::Tensor& x,
                                                                 const at::Tensor& weight,
                                                                 double eps) {
  const int64_t D = x.size(-1);
  const at::Tensor rr = at::rsqrt(x.square().mean(-1, /*keepdim=*/true) + eps);
  const at::Tensor xh = x * rr, gxh = grad_y * weight;
  const at::Tensor gx = rr * (gxh - xh * (gxh * xh).mean(-1, /*keepdim=*/true));
  const at::Tensor gw = (grad_y * xh).reshape({-1, D}).sum(0);
  return {gx, gw};
}

std::tuple<at::Tensor, at::Tensor> rms_norm_backward_twin(const at::Tensor& grad_y,
                                                          const at::Tensor& x,
                                                          const at::Tensor& weight,
                                                          const at::Tensor& /*r*/, double eps) {
  return rms_norm_backward_closed_form(grad_y, x, weight, eps);
}

// ---- CPU: the one-pass kernels (float32/64; other dtypes take the twin) ----------------------

std::tuple<at::Tensor, at::Tensor> rms_norm_forward_cpu(const at::Tensor& x_in,
                                                        const at::Tensor& weight, double eps) {
  check_norm_input(x_in, weight, "cemfrac::rms_norm_forward");
  if (!has_kernel_dtype(x_in)) return rms_norm_forward_twin(x_in, weight, eps);
  const int64_t D = x_in.size(-1);
  const at::Tensor x = x_in.contiguous().view({-1, D});
  at::Tensor y = at::empty_like(x);
  at::Tensor r = at::empty({x.size(0)}, x.options());
  kernels::rms_norm_forward_cpu(x, weight.contiguous(), eps, y, r);
  return {y.view(x_in.sizes()), r.view(row_shape(x_in))};
}

at::Tensor rms_norm_cpu(const at::Tensor& x, const at::Tensor& weight, double eps) {
  return std::get<0>(rms_norm_forward_cpu(x, weight, eps));
}

std::tuple<at::Tensor, at::Tensor> rms_norm_backward_cpu(const at::Tensor& grad_y,
                                                         const at::Tensor& x_in,
                                                         const at::Tensor& weight,
                                                         const at::Tensor& r, double eps) {
  if (!has_kernel_dtype(x_in)) return rms_norm_backward_closed_form(grad_y, x_in, weight, eps);
  const int64_t D = x_in.size(-1);
  const at::Tensor x = x_in.contiguous().view({-1, D});
  const at::Tensor gy = grad_y.contiguous().view({-1, D});
  at::Tensor gx = at::empty_like(x);
  at::Tensor gw = at::empty({D}, x.options());
  kernels::rms_norm_backward_cpu(x, weight.contiguous(), r.contiguous().view({-1}), gy, gx, gw);
  return {gx.view(x_in.sizes()), gw};
}

// ---- Meta -------------------------------------------------------------------------------------

std::tuple<at::Tensor, at::Tensor> rms_norm_forward_meta(const at::Tensor& x,
                                                         const at::Tensor& weight, double) {
  check_norm_input(x, weight, "cemfrac::rms_norm_forward");
  return {at::empty(x.sizes(), x.options()), at::empty(row_shape(x), x.options())};
}

at::Tensor rms_norm_meta(const at::Tensor& x, const at::Tensor& weight, double eps) {
  return std::get<0>(rms_norm_forward_meta(x, weight, eps));
}

std::tuple<at::Tensor, at::Tensor> rms_norm_backward_meta(const at::Tensor&, const at::Tensor& x,
                                                          const at::Tensor& weight,
                                                          const at::Tensor&, double) {
  return {at::empty(x.sizes(), x.options()), at::empty(weight.sizes(), weight.options())};
}

// ---- Autograd ---------------------------------------------------------------------------------

class RmsNormFunction : public torch::autograd::Function<RmsNormFunction> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                            const at::Tensor& weight, double eps) {
    static const auto forward_op = ops::op<ForwardSig>("rms_norm_forward");
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    auto [y, r] = forward_op.call(x, weight, eps);
    ctx->save_for_backward({x, weight, r});  // the inputs themselves: create_graph needs them
    ctx->saved_data["eps"] = eps;
    return y;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    static const auto backward_op = ops::op<BackwardSig>("rms_norm_backward");
    if (!grads[0].defined()) return {at::Tensor(), at::Tensor(), at::Tensor()};
    const auto saved = ctx->get_saved_variables();
    auto [gx, gw] =
        backward_op.call(grads[0], saved[0], saved[1], saved[2], ctx->saved_data["eps"].toDouble());
    return {gx, gw, at::Tensor()};
  }
};

at::Tensor rms_norm_autograd(const at::Tensor& x, const at::Tensor& weight, double eps) {
  if (at::GradMode::is_enabled() && (x.requires_grad() || weight.requires_grad())) {
    return RmsNormFunction::apply(x, weight, eps);
  }
  static const auto norm_op = ops::op<NormSig>("rms_norm");
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  return norm_op.call(x, weight, eps);
}

// Under create_graph the closed form in tensor ops (autograd records it); else the device kernel.
std::tuple<at::Tensor, at::Tensor> rms_norm_backward_autograd(const at::Tensor& grad_y,
                                                              const at::Tensor& x,
                                                              const at::Tensor& weight,
                                                              const at::Tensor& r, double eps) {
  if (at::GradMode::is_enabled() &&
      (grad_y.requires_grad() || x.requires_grad() || weight.requires_grad())) {
    return rms_norm_backward_closed_form(grad_y, x, weight, eps);
  }
  static const auto backward_op = ops::op<BackwardSig>("rms_norm_backward");
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  return backward_op.call(grad_y, x, weight, r, eps);
}

}  // namespace

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  // Shapes the operator does not take (an empty x, a broadcast weight, mixed dtypes) run the twin
  // composed of tensor ops, as before.
  const bool op_shapes = x.dim() >= 1 && x.numel() > 0 && weight.dim() == 1 &&
                         weight.size(0) == x.size(-1) && weight.scalar_type() == x.scalar_type();
  if (!op_shapes) return rms_norm_reference(x, weight, eps);
  static const auto norm_op = ops::op<NormSig>("rms_norm");
  return norm_op.call(x, weight, eps);
}

extern const bool kRmsNormKernels = true;  // ops/library.cpp's link anchor

}  // namespace cemfrac

TORCH_LIBRARY_IMPL(cemfrac, CPU, m) {
  m.impl("rms_norm", &cemfrac::rms_norm_cpu);
  m.impl("rms_norm_forward", &cemfrac::rms_norm_forward_cpu);
  m.impl("rms_norm_backward", &cemfrac::rms_norm_backward_cpu);
}

TORCH_LIBRARY_IMPL(cemfrac, Meta, m) {
  m.impl("rms_norm", &cemfrac::rms_norm_meta);
  m.impl("rms_norm_forward", &cemfrac::rms_norm_forward_meta);
  m.impl("rms_norm_backward", &cemfrac::rms_norm_backward_meta);
}

TORCH_LIBRARY_IMPL(cemfrac, CompositeExplicitAutograd, m) {
  m.impl("rms_norm", &cemfrac::rms_norm_twin);
  m.impl("rms_norm_forward", &cemfrac::rms_norm_forward_twin);
  m.impl("rms_norm_backward", &cemfrac::rms_norm_backward_twin);
}

TORCH_LIBRARY_IMPL(cemfrac, Autograd, m) {
  m.impl("rms_norm", &cemfrac::rms_norm_autograd);
  m.impl("rms_norm_backward", &cemfrac::rms_norm_backward_autograd);
}
