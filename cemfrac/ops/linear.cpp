#include "cemfrac/ops/linear.h"

#include <ATen/ATen.h>
#include <torch/types.h>

#include <vector>

namespace cemfrac {

at::Tensor linear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b) {
  if (w.dim() == 2 && x.dim() >= 1 && x.size(-1) == w.size(1) && x.numel() == w.size(1) &&
      x.device().is_cpu() && w.device().is_cpu() && x.scalar_type() == w.scalar_type() &&
      (!b.defined() || (b.dim() == 1 && b.size(0) == w.size(0)))) {
    std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
    shape.back() = w.size(0);
    const at::Tensor v = x.reshape({w.size(1)});
    const at::Tensor y = b.defined() ? at::addmv(b, w, v) : at::mv(w, v);
    return y.view(shape);
  }
  return torch::linear(x, w, b);
}

}  // namespace cemfrac
