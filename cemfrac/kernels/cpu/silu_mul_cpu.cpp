// The SiLU gate y = silu(a) b in one pass forward and one backward (kernels.h has the formulas),
// behind ops/silu_mul.cpp's fused Function. ATen runs it as silu, then mul, and their three
// backward kernels, each a pass over the (B, N, M) hidden activations; here each direction reads
// its inputs once and writes its outputs once.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "cemfrac/kernels/cpu/vec_exp.h"
#include "cemfrac/kernels/kernels.h"

namespace cemfrac::kernels {
namespace {

// Elements go to threads in whole groups of 8, so that every element but the tensor's last few
// takes the 8-wide loop whatever the thread count: the bits do not depend on how many threads run.
constexpr int64_t kGroup = 8;
constexpr int64_t kGrainGroups = 2048;

// fn(begin, end) over [0, n) in pieces whose boundaries are multiples of kGroup.
template <typename Fn>
void parallel_groups(int64_t n, const Fn& fn) {
  at::parallel_for(0, (n + kGroup - 1) / kGroup, kGrainGroups, [&](int64_t g0, int64_t g1) {
    fn(g0 * kGroup, std::min(n, g1 * kGroup));
  });
}

template <typename scalar_t>
inline scalar_t sigmoid(scalar_t a) {
  return scalar_t(1) / (scalar_t(1) + std::exp(-a));
}

template <typename scalar_t>
void forward_scalar(const scalar_t* a, const scalar_t* b, scalar_t* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = (a[i] * sigmoid(a[i])) * b[i];
}

template <typename scalar_t>
void backward_scalar(const scalar_t* a, const scalar_t* b, const scalar_t* g, scalar_t* da,
                     scalar_t* db, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const scalar_t s = sigmoid(a[i]);
    db[i] = g[i] * (a[i] * s);
    da[i] = g[i] * b[i] * (s * (scalar_t(1) + a[i] * (scalar_t(1) - s)));
  }
}

#if defined(__x86_64__) && defined(__GNUC__)
#define CEMFRAC_SILU_AVX2 1

__attribute__((target("avx2,fma"))) inline __m256 sigmoid_ps(__m256 a) {
  const __m256 one = _mm256_set1_ps(1.0f);
  return _mm256_div_ps(one, _mm256_add_ps(one, exp_ps(_mm256_sub_ps(_mm256_setzero_ps(), a))));
}

__attribute__((target("avx2,fma"))) void forward_avx2(const float* a, const float* b, float* y,
                                                      int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 va = _mm256_loadu_ps(a + i);
    _mm256_storeu_ps(y + i,
                     _mm256_mul_ps(_mm256_mul_ps(va, sigmoid_ps(va)), _mm256_loadu_ps(b + i)));
  }
  forward_scalar(a + i, b + i, y + i, n - i);
}

__attribute__((target("avx2,fma"))) void backward_avx2(const float* a, const float* b,
                                                       const float* g, float* da, float* db,
                                                       int64_t n) {
  const __m256 one = _mm256_set1_ps(1.0f);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 va = _mm256_loadu_ps(a + i), vg = _mm256_loadu_ps(g + i);
    const __m256 s = sigmoid_ps(va);
    _mm256_storeu_ps(db + i, _mm256_mul_ps(vg, _mm256_mul_ps(va, s)));
    const __m256 ds = _mm256_mul_ps(s, _mm256_add_ps(one, _mm256_mul_ps(va, _mm256_sub_ps(one, s))));
    _mm256_storeu_ps(da + i, _mm256_mul_ps(_mm256_mul_ps(vg, _mm256_loadu_ps(b + i)), ds));
  }
  backward_scalar(a + i, b + i, g + i, da + i, db + i, n - i);
}

bool silu_avx2() {
  static const bool ok = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return ok;
}
#endif

// One thread's piece: the 8-wide loop for float32 where the CPU has it, the scalar loop otherwise.
template <typename scalar_t>
void forward_piece(const scalar_t* a, const scalar_t* b, scalar_t* y, int64_t n) {
#ifdef CEMFRAC_SILU_AVX2
  if constexpr (std::is_same_v<scalar_t, float>) {
    if (silu_avx2()) return forward_avx2(a, b, y, n);
  }
#endif
  forward_scalar(a, b, y, n);
}

template <typename scalar_t>
void backward_piece(const scalar_t* a, const scalar_t* b, const scalar_t* g, scalar_t* da,
                    scalar_t* db, int64_t n) {
#ifdef CEMFRAC_SILU_AVX2
  if constexpr (std::is_same_v<scalar_t, float>) {
    if (silu_avx2()) return backward_avx2(a, b, g, da, db, n);
  }
#endif
  backward_scalar(a, b, g, da, db, n);
}

void check(const at::Tensor& t, const at::Tensor& like, const char* what) {
  TORCH_INTERNAL_ASSERT(t.is_contiguous() && t.sizes() == like.sizes() &&
                            t.scalar_type() == like.scalar_type(),
                        "silu_mul_cpu: bad layout of ", what);
}

}  // namespace

void silu_mul_forward_cpu(const at::Tensor& a, const at::Tensor& b, const at::Tensor& y) {
  check(a, a, "a");
  check(b, a, "b");
  check(y, a, "y");
  AT_DISPATCH_FLOATING_TYPES(a.scalar_type(), "silu_mul_forward", [&] {
    const scalar_t* ap = a.data_ptr<scalar_t>();
    const scalar_t* bp = b.data_ptr<scalar_t>();
    scalar_t* yp = y.data_ptr<scalar_t>();
    parallel_groups(a.numel(), [&](int64_t begin, int64_t end) {
      forward_piece(ap + begin, bp + begin, yp + begin, end - begin);
    });
  });
}

void silu_mul_backward_cpu(const at::Tensor& a, const at::Tensor& b, const at::Tensor& g,
                           const at::Tensor& da, const at::Tensor& db) {
  check(a, a, "a");
  check(b, a, "b");
  check(g, a, "g");
  check(da, a, "da");
  check(db, a, "db");
  AT_DISPATCH_FLOATING_TYPES(a.scalar_type(), "silu_mul_backward", [&] {
    const scalar_t* ap = a.data_ptr<scalar_t>();
    const scalar_t* bp = b.data_ptr<scalar_t>();
    const scalar_t* gp = g.data_ptr<scalar_t>();
    scalar_t* dap = da.data_ptr<scalar_t>();
    scalar_t* dbp = db.data_ptr<scalar_t>();
    parallel_groups(a.numel(), [&](int64_t begin, int64_t end) {
      backward_piece(ap + begin, bp + begin, gp + begin, dap + begin, dbp + begin, end - begin);
    });
  });
}

}  // namespace cemfrac::kernels
