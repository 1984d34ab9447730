// cemfrac::linear(): the operator cemfrac::linear (ops/library.h). CPU: gemv for one row, the
// skinny kernel for 2..8 rows without autograd, torch::linear otherwise; every other device:
// torch::linear; Meta: the shape. Its Autograd kernel differentiates the same choice in ATen ops
// (see linear.h).
#include "cemfrac/ops/linear.h"

#include <ATen/ATen.h>
#include <torch/autograd.h>
#include <torch/library.h>
#include <torch/types.h>

#include <vector>

#include "cemfrac/kernels/kernels.h"
#include "cemfrac/ops/library.h"

namespace cemfrac {
namespace {

using LinearSig = at::Tensor(const at::Tensor&, const at::Tensor&, const c10::optional<at::Tensor>&);

at::Tensor bias_or_undefined(const c10::optional<at::Tensor>& b) {
  return b.has_value() ? *b : at::Tensor();
}

// x (..., in), w (out, in), b (out) or none, one dtype: the cases the fast paths take.
bool plain(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b) {
  return w.dim() == 2 && x.dim() >= 1 && x.size(-1) == w.size(1) && w.size(1) > 0 &&
         x.scalar_type() == w.scalar_type() &&
         (!b.defined() || (b.dim() == 1 && b.size(0) == w.size(0) &&
                           b.scalar_type() == w.scalar_type()));
}

std::vector<int64_t> output_shape(const at::Tensor& x, const at::Tensor& w) {
  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
  shape.back() = w.size(0);
  return shape;
}

// One row: BLAS gemv (at::mv / at::addmv), which streams W once; differentiable.
at::Tensor one_row(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b) {
  const at::Tensor v = x.reshape({w.size(1)});
  const at::Tensor y = b.defined() ? at::addmv(b, w, v) : at::mv(w, v);
  return y.view(output_shape(x, w));
}

at::Tensor linear_twin(const at::Tensor& x, const at::Tensor& w,
                       const c10::optional<at::Tensor>& b) {
  return at::linear(x, w, bias_or_undefined(b));
}

at::Tensor linear_cpu(const at::Tensor& x, const at::Tensor& w,
                      const c10::optional<at::Tensor>& b_opt) {
  const at::Tensor b = bias_or_undefined(b_opt);
  if (plain(x, w, b)) {
    const int64_t in = w.size(1), out = w.size(0), rows = x.numel() / in;
    if (rows == 1) return one_row(x, w, b);
    if (rows >= 2 && rows <= kernels::kSkinnyMaxRows &&
        (x.scalar_type() == at::kFloat || x.scalar_type() == at::kDouble)) {
      const at::Tensor y = at::empty({rows, out}, x.options());
      kernels::skinny_linear_cpu(x.reshape({rows, in}).contiguous(), w.contiguous(),
                                 b.defined() ? b.contiguous() : b, y);
      return y.view(output_shape(x, w));
    }
  }
  return at::linear(x, w, b);
}

at::Tensor linear_meta(const at::Tensor& x, const at::Tensor& w,
                       const c10::optional<at::Tensor>& b) {
  TORCH_CHECK(w.dim() == 2 && x.dim() >= 1 && x.size(-1) == w.size(1),
              "cemfrac::linear: x (..., in) and weight (out, in) do not match: ", x.sizes(), ", ",
              w.sizes());
  (void)b;
  return at::empty(output_shape(x, w), x.options());
}

// With a gradient needed: one row through gemv, anything else through torch::linear, both
// differentiated by autograd (the skinny kernel has no backward: gradients of a few rows are
// what sgemm is for).
at::Tensor linear_autograd(const at::Tensor& x, const at::Tensor& w,
                           const c10::optional<at::Tensor>& b_opt) {
  const at::Tensor b = bias_or_undefined(b_opt);
  const bool needs_grad = at::GradMode::is_enabled() &&
                          (x.requires_grad() || w.requires_grad() || (b.defined() && b.requires_grad()));
  if (needs_grad) {
    if (plain(x, w, b) && x.numel() == w.size(1)) return one_row(x, w, b);
    return at::linear(x, w, b);
  }
  static const auto linear_op = ops::op<LinearSig>("linear");
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  return linear_op.call(x, w, b_opt);
}

}  // namespace

at::Tensor linear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b) {
  static const auto linear_op = ops::op<LinearSig>("linear");
  return linear_op.call(x, w, b.defined() ? c10::optional<at::Tensor>(b) : c10::nullopt);
}

extern const bool kLinearKernels = true;  // ops/library.cpp's link anchor

}  // namespace cemfrac

TORCH_LIBRARY_IMPL(cemfrac, CPU, m) {
  m.impl("linear", &cemfrac::linear_cpu);
}

TORCH_LIBRARY_IMPL(cemfrac, Meta, m) {
  m.impl("linear", &cemfrac::linear_meta);
}

TORCH_LIBRARY_IMPL(cemfrac, CompositeExplicitAutograd, m) {
  m.impl("linear", &cemfrac::linear_twin);
}

TORCH_LIBRARY_IMPL(cemfrac, Autograd, m) {
  m.impl("linear", &cemfrac::linear_autograd);
}
