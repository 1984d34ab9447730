// RMSNorm on the CPU: one pass per row for the forward, one for the backward, behind
// ops/rms_norm.cpp's fused Function (kernels.h states the formulas). The row sums are taken in
// float64, so a float32 row differs from the ATen reference only by that reference's own rounding.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "cemfrac/kernels/kernels.h"

namespace cemfrac::kernels {
namespace {

// Rows per block of the weight gradient's partial sums: fixed, so the sum does not depend on how
// at::parallel_for splits the rows among threads.
constexpr int64_t kRowBlock = 32;

// sum_i a_i b_i in float64 over four interleaved accumulators (independent chains, so the adds
// pipeline), combined in a fixed order.
template <typename scalar_t>
inline double dot4(const scalar_t* __restrict a, const scalar_t* __restrict b, int64_t n) {
  double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    s0 += double(a[i]) * double(b[i]);
    s1 += double(a[i + 1]) * double(b[i + 1]);
    s2 += double(a[i + 2]) * double(b[i + 2]);
    s3 += double(a[i + 3]) * double(b[i + 3]);
  }
  for (; i < n; ++i) s0 += double(a[i]) * double(b[i]);
  return (s0 + s1) + (s2 + s3);
}

}  // namespace

void rms_norm_forward_cpu(const at::Tensor& x, const at::Tensor& w, double eps,
                          const at::Tensor& y, const at::Tensor& r) {
  TORCH_INTERNAL_ASSERT(x.dim() == 2 && x.is_contiguous() && w.is_contiguous() &&
                            w.numel() == x.size(1) && y.is_contiguous() &&
                            y.sizes() == x.sizes() && r.is_contiguous() && r.numel() == x.size(0),
                        "rms_norm_forward_cpu: bad layout");
  const int64_t R = x.size(0), D = x.size(1);
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "rms_norm_forward", [&] {
    const scalar_t* __restrict xp = x.data_ptr<scalar_t>();
    const scalar_t* __restrict wp = w.data_ptr<scalar_t>();
    scalar_t* __restrict yp = y.data_ptr<scalar_t>();
    scalar_t* __restrict rp = r.data_ptr<scalar_t>();
    const int64_t grain = std::max<int64_t>(1, 32768 / std::max<int64_t>(1, D));
    at::parallel_for(0, R, grain, [&](int64_t begin, int64_t end) {
      for (int64_t n = begin; n < end; ++n) {
        const scalar_t* __restrict xr = xp + n * D;
        scalar_t* __restrict yr = yp + n * D;
        const double ss = dot4(xr, xr, D);
        const scalar_t rn = scalar_t(1.0 / std::sqrt(ss / double(D) + eps));
        rp[n] = rn;
        for (int64_t i = 0; i < D; ++i) yr[i] = (xr[i] * rn) * wp[i];
      }
    });
  });
}

void rms_norm_backward_cpu(const at::Tensor& x, const at::Tensor& w, const at::Tensor& r,
                           const at::Tensor& gy, const at::Tensor& gx, const at::Tensor& gw) {
  TORCH_INTERNAL_ASSERT(x.dim() == 2 && x.is_contiguous() && w.is_contiguous() &&
                            w.numel() == x.size(1) && r.is_contiguous() &&
                            r.numel() == x.size(0) && gy.is_contiguous() &&
                            gy.sizes() == x.sizes() && gx.is_contiguous() &&
                            gx.sizes() == x.sizes() && gw.is_contiguous() &&
                            gw.numel() == x.size(1),
                        "rms_norm_backward_cpu: bad layout");
  const int64_t R = x.size(0), D = x.size(1);
  const int64_t blocks = (R + kRowBlock - 1) / kRowBlock;
  // partial[b][i] = sum over the rows of block b of gy_ni xh_ni, in float64.
  std::vector<double> partial(size_t(std::max<int64_t>(blocks, 1) * D), 0.0);
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "rms_norm_backward", [&] {
    const scalar_t* __restrict xp = x.data_ptr<scalar_t>();
    const scalar_t* __restrict wp = w.data_ptr<scalar_t>();
    const scalar_t* __restrict rp = r.data_ptr<scalar_t>();
    const scalar_t* __restrict gyp = gy.data_ptr<scalar_t>();
    scalar_t* __restrict gxp = gx.data_ptr<scalar_t>();
    const int64_t grain = std::max<int64_t>(1, 8192 / std::max<int64_t>(1, D * kRowBlock));
    at::parallel_for(0, blocks, grain, [&](int64_t b0, int64_t b1) {
      for (int64_t b = b0; b < b1; ++b) {
        double* __restrict pw = partial.data() + b * D;
        for (int64_t n = b * kRowBlock; n < std::min(R, (b + 1) * kRowBlock); ++n) {
          const scalar_t* __restrict xr = xp + n * D;
          const scalar_t* __restrict gr = gyp + n * D;
          scalar_t* __restrict gxr = gxp + n * D;
          const scalar_t rn = rp[n];
          // gxh = gy w into the output row first (gx is overwritten below), then <gxh, xh>.
          for (int64_t i = 0; i < D; ++i) {
            gxr[i] = gr[i] * wp[i];
            pw[i] += double(gr[i]) * double(xr[i] * rn);
          }
          const scalar_t c = scalar_t(dot4(gxr, xr, D) * double(rn) / double(D));
          for (int64_t i = 0; i < D; ++i) gxr[i] = rn * (gxr[i] - (xr[i] * rn) * c);
        }
      }
    });
    scalar_t* __restrict gwp = gw.data_ptr<scalar_t>();
    for (int64_t i = 0; i < D; ++i) {
      double s = 0;
      for (int64_t b = 0; b < blocks; ++b) s += partial[size_t(b * D + i)];
      gwp[i] = scalar_t(s);
    }
  });
}

}  // namespace cemfrac::kernels
