// Fused optimizer kernels: the AdamW update in one pass over (p, g, m, v) and the sum of squares
// that gradient clipping needs, without temporaries. torch::optim::AdamW spends about ten passes
// over memory and several allocations per parameter on the same update; clipping through
// .to(kFloat64) copies every gradient. On a 30M-parameter model both are memory-bound phases of
// every step.
//
// Built without the precompiled header and with -fno-math-errno (cemfrac/CMakeLists.txt), so the
// compiler can vectorise sqrt.
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "cemfrac/kernels/kernels.h"

namespace cemfrac::kernels {
namespace {

constexpr int64_t kGrain = 1 << 15;     // elements per at::parallel_for task (AdamW)
constexpr int64_t kSumChunk = 1 << 14;  // elements per partial sum (fixed: thread-independent)

template <typename T>
void adamw_loop(T* __restrict p, const T* __restrict g, T* __restrict m, T* __restrict v, int64_t n,
                T decay, T beta1, T one_minus_beta1, T beta2, T one_minus_beta2, T inv_sqrt_bc2,
                T eps, T step_size) {
  for (int64_t i = 0; i < n; ++i) {
    const T grad = g[i];
    const T mi = m[i] * beta1 + grad * one_minus_beta1;
    const T vi = v[i] * beta2 + grad * grad * one_minus_beta2;
    m[i] = mi;
    v[i] = vi;
    const T denom = std::sqrt(vi) * inv_sqrt_bc2 + eps;
    p[i] = p[i] * decay - step_size * mi / denom;
  }
}

template <typename T>
double sum_squares_chunk(const T* x, int64_t n) {
  // Four independent accumulators: vectorisable without reassociation flags.
  double s[4] = {0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    for (int j = 0; j < 4; ++j)
      s[j] += static_cast<double>(x[i + j]) * static_cast<double>(x[i + j]);
  }
  for (; i < n; ++i) s[0] += static_cast<double>(x[i]) * static_cast<double>(x[i]);
  return (s[0] + s[1]) + (s[2] + s[3]);
}

}  // namespace

void adamw_step_cpu(const at::Tensor& p, const at::Tensor& g, const at::Tensor& m,
                    const at::Tensor& v, int64_t step, double lr, double beta1, double beta2,
                    double eps, double weight_decay) {
  TORCH_INTERNAL_ASSERT(p.is_contiguous() && g.is_contiguous() && m.is_contiguous() &&
                        v.is_contiguous());
  TORCH_INTERNAL_ASSERT(g.scalar_type() == p.scalar_type() && m.scalar_type() == p.scalar_type() &&
                        v.scalar_type() == p.scalar_type());
  TORCH_INTERNAL_ASSERT(g.numel() == p.numel() && m.numel() == p.numel() && v.numel() == p.numel());
  TORCH_INTERNAL_ASSERT(step >= 1);
  const double bc1 = 1.0 - std::pow(beta1, static_cast<double>(step));
  const double bc2 = 1.0 - std::pow(beta2, static_cast<double>(step));
  AT_DISPATCH_FLOATING_TYPES(p.scalar_type(), "adamw_step_cpu", [&] {
    scalar_t* pp = p.data_ptr<scalar_t>();
    const scalar_t* gp = g.data_ptr<scalar_t>();
    scalar_t* mp = m.data_ptr<scalar_t>();
    scalar_t* vp = v.data_ptr<scalar_t>();
    at::parallel_for(0, p.numel(), kGrain, [&](int64_t begin, int64_t end) {
      adamw_loop<scalar_t>(pp + begin, gp + begin, mp + begin, vp + begin, end - begin,
                           static_cast<scalar_t>(1.0 - lr * weight_decay),
                           static_cast<scalar_t>(beta1), static_cast<scalar_t>(1.0 - beta1),
                           static_cast<scalar_t>(beta2), static_cast<scalar_t>(1.0 - beta2),
                           static_cast<scalar_t>(1.0 / std::sqrt(bc2)), static_cast<scalar_t>(eps),
                           static_cast<scalar_t>(lr / bc1));
    });
  });
}

double sum_squares_cpu(const at::Tensor& x) {
  TORCH_INTERNAL_ASSERT(x.is_contiguous());
  const int64_t n = x.numel();
  const int64_t chunks = (n + kSumChunk - 1) / kSumChunk;
  std::vector<double> partial(static_cast<size_t>(chunks), 0.0);
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "sum_squares_cpu", [&] {
    const scalar_t* data = x.data_ptr<scalar_t>();
    at::parallel_for(0, chunks, 1, [&](int64_t begin, int64_t end) {
      for (int64_t c = begin; c < end; ++c) {
        const int64_t first = c * kSumChunk;
        partial[c] = sum_squares_chunk(data + first, std::min(kSumChunk, n - first));
      }
    });
  });
  double total = 0;
  for (double s : partial) total += s;  // in chunk order: the same bits for any thread count
  return total;
}

}  // namespace cemfrac::kernels
