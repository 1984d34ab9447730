#include "cemfrac/layers/base/rope.h"

#include <ATen/Parallel.h>
#include <torch/autograd.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <algorithm>
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
  if (scaling.type == "llama3") {
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
  } else {
    TORCH_INTERNAL_ASSERT(scaling.type == "none", "unknown RoPE scaling ", scaling.type);
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

torch::Tensor apply_rope_reference(const torch::Tensor& x, const torch::Tensor& cos,
                                   const torch::Tensor& sin, bool inverse) {
  const int64_t half = x.size(-1) / 2;
  const torch::Tensor s = inverse ? -sin : sin;
  torch::Tensor x1 = x.narrow(-1, 0, half);     // (B, h, N, d_h/2)
  torch::Tensor x2 = x.narrow(-1, half, half);  // (B, h, N, d_h/2)
  return torch::cat({x1 * cos - x2 * s, x2 * cos + x1 * s}, -1);
}

namespace {

// One row: y1 = x1 c - x2 s, y2 = x2 c + x1 s over the two halves (s negated when inverse).
// Restrict pointers (x and y never overlap) let the compiler vectorise both loops.
template <typename scalar_t>
inline void rotate_row(const scalar_t* __restrict x, scalar_t* __restrict y,
                       const scalar_t* __restrict c, const scalar_t* __restrict s, int64_t half,
                       bool inverse) {
  const scalar_t* __restrict x2 = x + half;
  scalar_t* __restrict y2 = y + half;
  if (inverse) {
    for (int64_t i = 0; i < half; ++i) {
      y[i] = x[i] * c[i] - x2[i] * -s[i];
      y2[i] = x2[i] * c[i] + x[i] * -s[i];
    }
  } else {
    for (int64_t i = 0; i < half; ++i) {
      y[i] = x[i] * c[i] - x2[i] * s[i];
      y2[i] = x2[i] * c[i] + x[i] * s[i];
    }
  }
}

// One pass over x (B, h, N, d_h), any strides (copied first unless the last one is 1): y has x's
// layout (empty_like keeps the strides of a dense tensor), so a rotated transpose view stays a view
// for the caller. Each element is computed as the reference computes it (x1 c - x2 s, x2 c + x1 s;
// s = -sin when inverse), so the two agree bitwise.
torch::Tensor rope_kernel(const torch::Tensor& x_in, const torch::Tensor& cos_in,
                          const torch::Tensor& sin_in, bool inverse) {
  const torch::Tensor x = x_in.stride(3) == 1 ? x_in : x_in.contiguous();
  const int64_t B = x.size(0), h = x.size(1), N = x.size(2), half = x.size(3) / 2;
  const torch::Tensor cos = cos_in.contiguous(), sin = sin_in.contiguous();
  torch::Tensor y = at::empty_like(x);
  const int64_t xs0 = x.stride(0), xs1 = x.stride(1), xs2 = x.stride(2);
  const int64_t ys0 = y.stride(0), ys1 = y.stride(1), ys2 = y.stride(2);
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "apply_rope", [&] {
    const scalar_t* xp = x.data_ptr<scalar_t>();
    scalar_t* yp = y.data_ptr<scalar_t>();
    const scalar_t* cp = cos.data_ptr<scalar_t>();
    const scalar_t* sp = sin.data_ptr<scalar_t>();
    const int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(1, 2 * half));
    // Rows in memory order: heads innermost when they are closer in memory than positions (the
    // merged-heads layout (B, N, h, d_h) that split_heads and the attention output give), positions
    // innermost otherwise; either way consecutive rows share or walk the cos/sin table in order.
    const bool heads_inner = xs1 <= xs2;
    const int64_t inner = heads_inner ? h : N;
    at::parallel_for(0, B * h * N, grain, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        const int64_t b = r / (N * h), i_in = r % inner,
                      i_out = (r / inner) % (heads_inner ? N : h);
        const int64_t k = heads_inner ? i_in : i_out, n = heads_inner ? i_out : i_in;
        rotate_row<scalar_t>(xp + b * xs0 + k * xs1 + n * xs2, yp + b * ys0 + k * ys1 + n * ys2,
                             cp + n * half, sp + n * half, half, inverse);
      }
    });
  });
  return y;
}

// y = R x is a rotation per pair of channels, so the gradient is the inverse rotation R^T g; the
// backward calls the same Function, so it is differentiable again (double backward, create_graph).
class RopeFunction : public torch::autograd::Function<RopeFunction> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                               const torch::Tensor& cos, const torch::Tensor& sin, bool inverse) {
    ctx->save_for_backward({cos, sin});
    ctx->saved_data["inverse"] = inverse;
    return rope_kernel(x.detach(), cos, sin, inverse);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const bool inverse = ctx->saved_data["inverse"].toBool();
    return {apply_rope(grads[0], saved[0], saved[1], !inverse), torch::Tensor(), torch::Tensor(),
            torch::Tensor()};
  }
};

}  // namespace

torch::Tensor apply_rope(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin,
                         bool inverse) {
  const bool fused = x.dim() == 4 && x.device().is_cpu() && x.size(3) % 2 == 0 &&
                     (x.scalar_type() == torch::kFloat32 || x.scalar_type() == torch::kFloat64) &&
                     cos.scalar_type() == x.scalar_type() && sin.scalar_type() == x.scalar_type() &&
                     cos.dim() == 2 && cos.size(0) == x.size(2) && cos.size(1) * 2 == x.size(3) &&
                     sin.sizes() == cos.sizes() && !cos.requires_grad() && !sin.requires_grad();
  if (!fused) return apply_rope_reference(x, cos, sin, inverse);
  return RopeFunction::apply(x, cos, sin, inverse);
}

}  // namespace cemfrac
