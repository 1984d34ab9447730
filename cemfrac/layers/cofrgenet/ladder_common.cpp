#include "cemfrac/layers/cofrgenet/ladder_common.h"

#include <torch/types.h>
#include <torch/utils.h>

#include <limits>

#include "cemfrac/layers/cofrgenet/cofrgenet_config.h"
#include "cemfrac/layers/cofrgenet/dyadic.h"

namespace cemfrac {

LadderOptions ladder_options(const CofrConfig& c) {
  return LadderOptions()
      .continuant(ContinuantOptions().eps(c.eps).impl(c.impl).backward(c.backward))
      .truncate(c.truncate)
      .eval_clip(c.eval_clip);
}

int64_t range_window_start(int64_t total_steps) {
  const int64_t window = std::max<int64_t>(1, (total_steps + 99) / 100);
  return std::max<int64_t>(0, total_steps - window);
}

void LadderRuntime::on_train_step(const TrainProgress& progress, torch::Tensor& z_min,
                                  torch::Tensor& z_max) {
  active_depth_ = options_.truncate() && progress.dyadic
                      ? dyadic_active_depth(progress.step, progress.total_steps, depth_)
                      : depth_;
  recording_ = true;
  if (progress.step == range_window_start(progress.total_steps) && !z_min.is_meta()) {
    torch::NoGradGuard no_grad;
    z_min.fill_(std::numeric_limits<float>::infinity());
    z_max.fill_(-std::numeric_limits<float>::infinity());
  }
}

torch::Tensor LadderRuntime::evaluate(const torch::Tensor& a) const {
  const int64_t m = std::min(active_depth_, a.size(-2));
  if (m <= 0) {
    std::vector<int64_t> shape = a.sizes().vec();
    shape.erase(shape.end() - 2);
    return torch::zeros(shape, a.options());  // stage 0: no fraction yet
  }
  const torch::Tensor active = m < a.size(-2) ? a.narrow(-2, 0, m) : a;
  return continuant(active, options_.continuant());
}

torch::Tensor LadderRuntime::range(const torch::Tensor& z, bool training,
                                   const torch::Tensor& z_min, const torch::Tensor& z_max) const {
  if (training) {
    if (recording_) {
      torch::NoGradGuard no_grad;
      // Reduce z to the buffers' shape: over its leading dimensions and where the buffer has
      // size 1.
      torch::Tensor lo = z.detach().to(z_min.scalar_type()), hi = lo;
      const int64_t lead = z.dim() - z_min.dim();
      for (int64_t dim = z.dim() - 1; dim >= 0; --dim) {
        const bool reduce = dim < lead || (z_min.size(dim - lead) == 1 && z.size(dim) != 1);
        if (!reduce) continue;
        lo = std::get<0>(lo.min(dim, /*keepdim=*/dim >= lead));
        hi = std::get<0>(hi.max(dim, /*keepdim=*/dim >= lead));
      }
      // Buffers are views of the layer's state: update in place.
      torch::Tensor mn = z_min, mx = z_max;
      mn.copy_(torch::min(mn, lo));
      mx.copy_(torch::max(mx, hi));
    }
    return z;
  }
  if (!options_.eval_clip()) return z;
  const torch::Tensor lo = z_min.to(z.scalar_type()), hi = z_max.to(z.scalar_type());
  // A ladder without a recorded range (z_min = +inf > z_max = -inf) is not clipped.
  return torch::where(lo <= hi, torch::max(torch::min(z, hi), lo), z);
}

torch::Tensor initial_range_min(torch::IntArrayRef shape, torch::Device device) {
  return init_constant(shape, std::numeric_limits<double>::infinity(), device);
}

torch::Tensor initial_range_max(torch::IntArrayRef shape, torch::Device device) {
  return init_constant(shape, -std::numeric_limits<double>::infinity(), device);
}

torch::Tensor causal_logit_mask(int64_t length, torch::Device device) {
  torch::Tensor mask = torch::zeros({length, length}, torch::TensorOptions().device(device));
  if (mask.is_meta()) return mask;
  return mask.masked_fill(
      torch::ones({length, length}, torch::TensorOptions().dtype(torch::kBool).device(device))
          .triu(1),
      -std::numeric_limits<double>::infinity());
}

}  // namespace cemfrac
