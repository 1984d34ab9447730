// silu_mul(): the operator cemfrac::silu_mul (ops/library.h) over kernels::silu_mul_*_cpu, its
// ATen twin, Meta and Autograd kernels (see silu_mul.h).
#include "cemfrac/ops/silu_mul.h"

#include <ATen/ATen.h>
#include <torch/autograd.h>
#include <torch/library.h>

#include <tuple>

#include "cemfrac/kernels/kernels.h"
#include "cemfrac/ops/library.h"

namespace cemfrac {

at::Tensor silu_mul_reference(const at::Tensor& a, const at::Tensor& b) { return at::silu(a) * b; }

namespace {

using GateSig = at::Tensor(const at::Tensor&, const at::Tensor&);
using BackwardSig = std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&,
                                                       const at::Tensor&);

void check_gate_input(const at::Tensor& a, const at::Tensor& b, const char* where) {
  TORCH_CHECK(a.sizes() == b.sizes(), where, ": a and b must have one shape, got ", a.sizes(),
              " and ", b.sizes());
  TORCH_CHECK(a.scalar_type() == b.scalar_type(), where, ": a and b dtypes differ (",
              a.scalar_type(), ", ", b.scalar_type(), ")");
}

bool has_kernel_dtype(const at::Tensor& a) {
  return a.scalar_type() == at::kFloat || a.scalar_type() == at::kDouble;
}

// The gradient (kernels.h) in differentiable tensor ops, s = sigmoid(a):
//   da = g b s (1 + a (1 - s)),  db = g (a s)
std::tuple<at::Tensor, at::Tensor> silu_mul_backward_closed_form(const at::Tensor& g,
                                                                 const at::Tensor& a,
                                                                 const at::Tensor& b) {
  const at::Tensor s = at::sigmoid(a);
  return {g * b * (s * (1 + a * (1 - s))), g * (a * s)};
}

at::Tensor silu_mul_twin(const at::Tensor& a, const at::Tensor& b) {
  check_gate_input(a, b, "cemfrac::silu_mul");
  return silu_mul_reference(a, b);
}

std::tuple<at::Tensor, at::Tensor> silu_mul_backward_twin(const at::Tensor& g, const at::Tensor& a,
                                                          const at::Tensor& b) {
  return silu_mul_backward_closed_form(g, a, b);
}

at::Tensor silu_mul_cpu(const at::Tensor& a_in, const at::Tensor& b_in) {
  check_gate_input(a_in, b_in, "cemfrac::silu_mul");
  if (!has_kernel_dtype(a_in) || a_in.numel() == 0) return silu_mul_reference(a_in, b_in);
  const at::Tensor a = a_in.contiguous(), b = b_in.contiguous();
  at::Tensor y = at::empty_like(a, at::MemoryFormat::Contiguous);
  kernels::silu_mul_forward_cpu(a, b, y);
  return y;
}

std::tuple<at::Tensor, at::Tensor> silu_mul_backward_cpu(const at::Tensor& g_in,
                                                         const at::Tensor& a_in,
                                                         const at::Tensor& b_in) {
  if (!has_kernel_dtype(a_in) || a_in.numel() == 0 || g_in.sizes() != a_in.sizes()) {
    return silu_mul_backward_closed_form(g_in, a_in, b_in);
  }
  const at::Tensor a = a_in.contiguous(), b = b_in.contiguous(), g = g_in.contiguous();
  at::Tensor da = at::empty_like(a), db = at::empty_like(a);
  kernels::silu_mul_backward_cpu(a, b, g, da, db);
  return {da, db};
}

at::Tensor silu_mul_meta(const at::Tensor& a, const at::Tensor& b) {
  check_gate_input(a, b, "cemfrac::silu_mul");
  return at::empty(a.sizes(), a.options());
}

std::tuple<at::Tensor, at::Tensor> silu_mul_backward_meta(const at::Tensor&, const at::Tensor& a,
                                                          const at::Tensor& b) {
  return {at::empty(a.sizes(), a.options()), at::empty(b.sizes(), b.options())};
}

class SiluMulFunction : public torch::autograd::Function<SiluMulFunction> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& a,
                            const at::Tensor& b) {
    static const auto gate_op = ops::op<GateSig>("silu_mul");
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    ctx->save_for_backward({a, b});  // the inputs themselves: create_graph needs them
    return gate_op.call(a, b);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    static const auto backward_op = ops::op<BackwardSig>("silu_mul_backward");
    if (!grads[0].defined()) return {at::Tensor(), at::Tensor()};
    const auto saved = ctx->get_saved_variables();
    auto [da, db] = backward_op.call(grads[0], saved[0], saved[1]);
    return {da, db};
  }
};

at::Tensor silu_mul_autograd(const at::Tensor& a, const at::Tensor& b) {
  if (at::GradMode::is_enabled() && (a.requires_grad() || b.requires_grad())) {
    return SiluMulFunction::apply(a, b);
  }
  static const auto gate_op = ops::op<GateSig>("silu_mul");
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  return gate_op.call(a, b);
}

std::tuple<at::Tensor, at::Tensor> silu_mul_backward_autograd(const at::Tensor& g,
                                                              const at::Tensor& a,
                                                              const at::Tensor& b) {
  if (at::GradMode::is_enabled() && (g.requires_grad() || a.requires_grad() || b.requires_grad())) {
    return silu_mul_backward_closed_form(g, a, b);
  }
  static const auto backward_op = ops::op<BackwardSig>("silu_mul_backward");
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  return backward_op.call(g, a, b);
}

}  // namespace

at::Tensor silu_mul(const at::Tensor& a, const at::Tensor& b) {
  // Broadcasting or mixed dtypes: the reference (the operator takes one shape and dtype).
  if (a.sizes() != b.sizes() || a.scalar_type() != b.scalar_type()) {
    return silu_mul_reference(a, b);
  }
  static const auto gate_op = ops::op<GateSig>("silu_mul");
  return gate_op.call(a, b);
}

extern const bool kSiluMulKernels = true;  // ops/library.cpp's link anchor

}  // namespace cemfrac

TORCH_LIBRARY_IMPL(cemfrac, CPU, m) {
  m.impl("silu_mul", &cemfrac::silu_mul_cpu);
  m.impl("silu_mul_backward", &cemfrac::silu_mul_backward_cpu);
}

TORCH_LIBRARY_IMPL(cemfrac, Meta, m) {
  m.impl("silu_mul", &cemfrac::silu_mul_meta);
  m.impl("silu_mul_backward", &cemfrac::silu_mul_backward_meta);
}

TORCH_LIBRARY_IMPL(cemfrac, CompositeExplicitAutograd, m) {
  m.impl("silu_mul", &cemfrac::silu_mul_twin);
  m.impl("silu_mul_backward", &cemfrac::silu_mul_backward_twin);
}

TORCH_LIBRARY_IMPL(cemfrac, Autograd, m) {
  m.impl("silu_mul", &cemfrac::silu_mul_autograd);
  m.impl("silu_mul_backward", &cemfrac::silu_mul_backward_autograd);
}
