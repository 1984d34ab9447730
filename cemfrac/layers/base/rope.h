// Rotary position embedding (Su et al. 2021), in the half-split ("rotate half") layout Llama uses:
// a head vector x = [x1, x2] (each d_h/2 wide) at position p becomes
//     [x1 * cos(p w) - x2 * sin(p w),  x2 * cos(p w) + x1 * sin(p w)],   w_i = theta^(-2i / d_h).
// Here: the frequencies and the cos/sin tables. The rotation itself is an op (cemfrac/ops/rope.h,
// apply_rope, with its fused kernel and reference twin).
#pragma once
#include <torch/types.h>

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "cemfrac/layers/base/rope_scaling.h"

namespace cemfrac {

// The rotary frequencies w_i = theta^(-2i / d_h), i = 0..d_h/2-1, after `scaling` (rope_scaling.h).
std::vector<double> rope_frequencies(int64_t head_dim, double theta,
                                     const RopeScaling& scaling = {});

class RotaryEmbedding {
 public:
  RotaryEmbedding(int64_t head_dim, int64_t context, double theta, const RopeScaling& scaling = {});

  // cos and sin of positions offset..offset+n-1, each (n, d_h / 2), in `options`' dtype and device.
  // The tables for all `context` positions are computed once per dtype/device (in float64, then
  // rounded) and sliced here.
  std::pair<torch::Tensor, torch::Tensor> tables(int64_t offset, int64_t n,
                                                 const torch::TensorOptions& options);

  int64_t head_dim() const { return head_dim_; }

 private:
  int64_t head_dim_;
  int64_t context_;
  double theta_;
  RopeScaling scaling_;
  std::map<std::string, std::pair<torch::Tensor, torch::Tensor>> cache_;  // by dtype + device
};

}  // namespace cemfrac
