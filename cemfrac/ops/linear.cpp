#include "cemfrac/ops/linear.h"

#include <ATen/ATen.h>
#include <torch/types.h>

#include <vector>

#include "cemfrac/kernels/kernels.h"

namespace cemfrac {

at::Tensor linear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b) {
  const bool plain = w.dim() == 2 && x.dim() >= 1 && x.size(-1) == w.size(1) &&
                     x.device().is_cpu() && w.device().is_cpu() &&
                     x.scalar_type() == w.scalar_type() &&
                     (!b.defined() || (b.dim() == 1 && b.size(0) == w.size(0) &&
                                       b.scalar_type() == w.scalar_type() && b.device().is_cpu()));
  if (plain && w.size(1) > 0) {
    const int64_t in = w.size(1), out = w.size(0), rows = x.numel() / in;
    std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
    shape.back() = out;
    if (rows == 1) {  // gemv, differentiable
      const at::Tensor v = x.reshape({in});
      const at::Tensor y = b.defined() ? at::addmv(b, w, v) : at::mv(w, v);
      return y.view(shape);
    }
    const bool needs_grad = at::GradMode::is_enabled() && (x.requires_grad() || w.requires_grad() ||
                                                           (b.defined() && b.requires_grad()));
    if (rows >= 2 && rows <= kernels::kSkinnyMaxRows && !needs_grad &&
        (x.scalar_type() == at::kFloat || x.scalar_type() == at::kDouble)) {
      const at::Tensor y = at::empty({rows, out}, x.options());
      kernels::skinny_linear_cpu(x.reshape({rows, in}).contiguous(), w.contiguous(),
                                 b.defined() ? b.contiguous() : b, y);
      return y.view(shape);
    }
  }
  return torch::linear(x, w, b);
}

}  // namespace cemfrac
