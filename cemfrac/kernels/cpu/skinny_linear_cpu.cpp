// y (R, O) = x (R, I) Wᵀ + b for a few rows R (kernels.h): every row of W is streamed once and
// multiplied with all R inputs while it is in registers. float32 runs eight lanes at a time with
// AVX2 + FMA where the CPU has them; double and other CPUs take the scalar loop.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <type_traits>

#include "cemfrac/kernels/kernels.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#endif

namespace cemfrac::kernels {
namespace {

// Output features per task: enough work per task to amortise the fork, whatever I is.
int64_t grain(int64_t in) {
  return std::max<int64_t>(1, 32768 / std::max<int64_t>(1, in));
}

template <typename scalar_t, int R>
void rows_scalar(const scalar_t* x, const scalar_t* w, const scalar_t* b, scalar_t* y, int64_t in,
                 int64_t out, int64_t o0, int64_t o1) {
  for (int64_t o = o0; o < o1; ++o) {
    const scalar_t* wr = w + o * in;
    scalar_t acc[R] = {};
    for (int64_t k = 0; k < in; ++k) {
      const scalar_t wk = wr[k];
      for (int r = 0; r < R; ++r) acc[r] += x[r * in + k] * wk;
    }
    for (int r = 0; r < R; ++r) y[r * out + o] = b ? acc[r] + b[o] : acc[r];
  }
}

#if defined(__x86_64__) && defined(__GNUC__)
#define CEMFRAC_SKINNY_AVX2 1

__attribute__((target("avx2,fma"))) inline float hsum(__m256 v) {
  const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(t, _mm_shuffle_ps(t, t, 0x55)));
}

template <int R>
__attribute__((target("avx2,fma"))) void rows_avx2(const float* x, const float* w, const float* b,
                                                   float* y, int64_t in, int64_t out, int64_t o0,
                                                   int64_t o1) {
  for (int64_t o = o0; o < o1; ++o) {
    const float* wr = w + o * in;
    __m256 acc[R];
    for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
    int64_t k = 0;
    for (; k + 8 <= in; k += 8) {
      const __m256 wv = _mm256_loadu_ps(wr + k);
      for (int r = 0; r < R; ++r)
        acc[r] = _mm256_fmadd_ps(_mm256_loadu_ps(x + r * in + k), wv, acc[r]);
    }
    for (int r = 0; r < R; ++r) {
      float s = hsum(acc[r]);
      for (int64_t j = k; j < in; ++j) s += x[r * in + j] * wr[j];
      y[r * out + o] = b ? s + b[o] : s;
    }
  }
}

bool skinny_avx2() {
  static const bool ok = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return ok;
}
#endif

template <typename scalar_t, int R>
void run(const scalar_t* x, const scalar_t* w, const scalar_t* b, scalar_t* y, int64_t in,
         int64_t out) {
  at::parallel_for(0, out, grain(in), [&](int64_t o0, int64_t o1) {
#ifdef CEMFRAC_SKINNY_AVX2
    if constexpr (std::is_same_v<scalar_t, float>) {
      if (skinny_avx2()) return rows_avx2<R>(x, w, b, y, in, out, o0, o1);
    }
#endif
    rows_scalar<scalar_t, R>(x, w, b, y, in, out, o0, o1);
  });
}

template <typename scalar_t>
void dispatch_rows(int64_t rows, const scalar_t* x, const scalar_t* w, const scalar_t* b,
                   scalar_t* y, int64_t in, int64_t out) {
  switch (rows) {
    case 2: return run<scalar_t, 2>(x, w, b, y, in, out);
    case 3: return run<scalar_t, 3>(x, w, b, y, in, out);
    case 4: return run<scalar_t, 4>(x, w, b, y, in, out);
    case 5: return run<scalar_t, 5>(x, w, b, y, in, out);
    case 6: return run<scalar_t, 6>(x, w, b, y, in, out);
    case 7: return run<scalar_t, 7>(x, w, b, y, in, out);
    case 8: return run<scalar_t, 8>(x, w, b, y, in, out);
    default: TORCH_INTERNAL_ASSERT(false, "skinny_linear_cpu: ", rows, " rows");
  }
}

}  // namespace

void skinny_linear_cpu(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b,
                       const at::Tensor& y) {
  const int64_t rows = x.size(0), in = x.size(1), out = w.size(0);
  TORCH_INTERNAL_ASSERT(
      x.dim() == 2 && w.dim() == 2 && y.dim() == 2 && x.is_contiguous() && w.is_contiguous() &&
          y.is_contiguous() && w.size(1) == in && y.size(0) == rows && y.size(1) == out &&
          w.scalar_type() == x.scalar_type() && y.scalar_type() == x.scalar_type() &&
          (!b.defined() ||
           (b.is_contiguous() && b.numel() == out && b.scalar_type() == x.scalar_type())),
      "skinny_linear_cpu: bad layout");
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "skinny_linear", [&] {
    dispatch_rows<scalar_t>(rows, x.data_ptr<scalar_t>(), w.data_ptr<scalar_t>(),
                            b.defined() ? b.data_ptr<scalar_t>() : nullptr, y.data_ptr<scalar_t>(),
                            in, out);
  });
}

}  // namespace cemfrac::kernels
