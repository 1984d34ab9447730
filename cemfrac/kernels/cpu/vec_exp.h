// exp over eight float32 lanes with AVX2 + FMA, shared by the CPU kernels that need it (the
// attention softmax rows, the SiLU gate). Callers check the CPU first (__builtin_cpu_supports).
#pragma once
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

namespace cemfrac::kernels {

// exp(x), float32 lanes (Cephes' expf: x = n ln2 + r, |r| <= ln2/2, a degree-6 polynomial for e^r,
// then 2^n through the exponent bits; about 1 ulp). Inputs below ln(FLT_MIN) give FLT_MIN-scale
// results instead of denormals or 0; NaN stays NaN (max_ps returns its second operand on NaN).
__attribute__((target("avx2,fma"))) inline __m256 exp_ps(__m256 x) {
  x = _mm256_max_ps(_mm256_set1_ps(-87.33654f), x);
  x = _mm256_min_ps(_mm256_set1_ps(88.3762626647949f), x);
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  const __m256 y = _mm256_add_ps(_mm256_fmadd_ps(_mm256_mul_ps(p, r), r, r), _mm256_set1_ps(1.0f));
  const __m256i e =
      _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(y, _mm256_castsi256_ps(e));
}

}  // namespace cemfrac::kernels

#endif
