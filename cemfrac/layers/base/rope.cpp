#include "cemfrac/layers/base/rope.h"

#include <torch/torch.h>

#include <sstream>

#include "cemfrac/core/check.h"

namespace cemfrac {

RotaryEmbedding::RotaryEmbedding(int64_t head_dim, int64_t context, double theta)
    : head_dim_(head_dim), context_(context), theta_(theta) {
  CEMFRAC_CHECK(head_dim % 2 == 0, "RoPE needs an even head width, got d_h = {}", head_dim);
}

std::pair<torch::Tensor, torch::Tensor> RotaryEmbedding::tables(int64_t offset, int64_t n,
                                                                const torch::TensorOptions& options) {
  TORCH_INTERNAL_ASSERT(offset >= 0 && offset + n <= context_, "RoPE positions beyond the context");
  std::ostringstream key;
  key << options.dtype() << "/" << options.device();
  auto it = cache_.find(key.str());
  if (it == cache_.end()) {
    torch::NoGradGuard no_grad;
    const int64_t half = head_dim_ / 2;
    auto f64 = torch::TensorOptions().dtype(torch::kFloat64);
    // w_i = theta^(-2i / d_h), i = 0..d_h/2-1; angle(p, i) = p * w_i.
    torch::Tensor freq = torch::pow(theta_, -torch::arange(0, half, f64) * 2.0 / head_dim_);
    torch::Tensor angle = torch::outer(torch::arange(0, context_, f64), freq);  // (context, d_h/2)
    it = cache_.emplace(key.str(), std::make_pair(angle.cos().to(options), angle.sin().to(options)))
             .first;
  }
  return {it->second.first.narrow(0, offset, n), it->second.second.narrow(0, offset, n)};
}

torch::Tensor apply_rope(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin) {
  const int64_t half = x.size(-1) / 2;
  torch::Tensor x1 = x.narrow(-1, 0, half);     // (B, h, N, d_h/2)
  torch::Tensor x2 = x.narrow(-1, half, half);  // (B, h, N, d_h/2)
  return torch::cat({x1 * cos - x2 * sin, x2 * cos + x1 * sin}, -1);
}

}  // namespace cemfrac
