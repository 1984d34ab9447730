#include "cemfrac/layers/base/rope.h"

#include <torch/types.h>
#include <torch/utils.h>

#include <cmath>
#include <sstream>

#include "cemfrac/core/check.h"

namespace cemfrac {

std::vector<double> rope_frequencies(int64_t head_dim, double theta, const RopeScaling& scaling) {
  const int64_t half = head_dim / 2;
  std::vector<double> freq(half);
  for (int64_t i = 0; i < half; ++i) {
    freq[i] = std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(head_dim));
  }
  if (scaling.type == RopeScalingType::kLlama3) {
    const double context = static_cast<double>(scaling.original_context);
    const double short_wavelength = context / scaling.high_freq_factor;
    const double long_wavelength = context / scaling.low_freq_factor;
    for (double& w : freq) {
      const double wavelength = 2.0 * M_PI / w;
      if (wavelength < short_wavelength) continue;
      if (wavelength > long_wavelength) {
        w /= scaling.factor;
        continue;
      }
      const double s = (context / wavelength - scaling.low_freq_factor) /
                       (scaling.high_freq_factor - scaling.low_freq_factor);
      w = (1.0 - s) * w / scaling.factor + s * w;
    }
  }
  return freq;
}

RotaryEmbedding::RotaryEmbedding(int64_t head_dim, int64_t context, double theta,
                                 const RopeScaling& scaling)
    : head_dim_(head_dim), context_(context), theta_(theta), scaling_(scaling) {
  CEMFRAC_CHECK(head_dim % 2 == 0, "RoPE needs an even head width, got d_h = {}", head_dim);
}

std::pair<torch::Tensor, torch::Tensor> RotaryEmbedding::tables(
    int64_t offset, int64_t n, const torch::TensorOptions& options) {
  TORCH_INTERNAL_ASSERT(offset >= 0 && offset + n <= context_, "RoPE positions beyond the context");
  std::ostringstream key;
  key << options.dtype() << "/" << options.device();
  auto it = cache_.find(key.str());
  if (it == cache_.end()) {
    torch::NoGradGuard no_grad;
    auto f64 = torch::TensorOptions().dtype(torch::kFloat64);
    // angle(p, i) = p * w_i.
    torch::Tensor freq = torch::tensor(rope_frequencies(head_dim_, theta_, scaling_), f64);
    torch::Tensor angle = torch::outer(torch::arange(0, context_, f64), freq);  // (context, d_h/2)
    it = cache_.emplace(key.str(), std::make_pair(angle.cos().to(options), angle.sin().to(options)))
             .first;
  }
  return {it->second.first.narrow(0, offset, n), it->second.second.narrow(0, offset, n)};
}

}  // namespace cemfrac
