// Rotary position embedding on the CPU: the one-pass loop behind ops/rope.cpp's fused Function.
// Each element is computed as the reference (ops/rope.cpp, apply_rope_reference) computes it, so
// the two agree bitwise. (Moved from layers/base/rope.cpp unchanged, so results are bitwise those
// of before.)
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>

#include "cemfrac/kernels/kernels.h"

namespace cemfrac::kernels {
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

}  // namespace

void rope_cpu(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, bool inverse,
              const at::Tensor& y) {
  TORCH_INTERNAL_ASSERT(x.dim() == 4 && x.stride(3) == 1 && y.sizes() == x.sizes() &&
                            y.stride(3) == 1 && cos.is_contiguous() && sin.is_contiguous(),
                        "rope_cpu: bad layout");
  const int64_t B = x.size(0), h = x.size(1), N = x.size(2), half = x.size(3) / 2;
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
}

}  // namespace cemfrac::kernels
