// The per-ladder math of the CUDA ladder kernels (continuant_cuda.cu), written once for the device
// and the host: nvcc compiles it into the kernels, and tests/ops/continuant_cuda_math_test.cpp runs
// the same functions on the CPU against kernels/cpu/continuant_cpu.cpp, so the GPU code path is
// checked bit for bit on machines without a GPU. Notation as in continuant_cpu.cpp: K_{-1} = 0,
// K_0 = 1, K_j = a_{d-j+1} K_{j-1} + K_{j-2}; K̂_d = sgn(K_d) max(|K_d|, eps) with sgn(+-0) = +1;
// r = 1 / K̂_d; f = K_{d-1} r; grad a_k = g (-1)^k (K_{d-k} r)^2.
#pragma once
#include <cmath>
#include <cstdint>

#ifdef __CUDACC__
#define CEMFRAC_HD __host__ __device__
#else
#define CEMFRAC_HD
#endif

namespace cemfrac::kernels::cuda::math {

// Explicitly rounded operations: on the device, intrinsics that nvcc never contracts into a fused
// multiply-add; on the host, plain IEEE operations (the files that include this are built with
// -ffp-contract=off, as continuant_cpu.cpp is). Either way the arithmetic is the CPU kernel's,
// operation for operation, and the reciprocal is correctly rounded.
#ifdef __CUDA_ARCH__
CEMFRAC_HD inline float mul_rn(float x, float y) {
  return __fmul_rn(x, y);
}
CEMFRAC_HD inline double mul_rn(double x, double y) {
  return __dmul_rn(x, y);
}
CEMFRAC_HD inline float add_rn(float x, float y) {
  return __fadd_rn(x, y);
}
CEMFRAC_HD inline double add_rn(double x, double y) {
  return __dadd_rn(x, y);
}
CEMFRAC_HD inline float recip_rn(float x) {
  return __frcp_rn(x);
}
CEMFRAC_HD inline double recip_rn(double x) {
  return __drcp_rn(x);
}
#else
inline float mul_rn(float x, float y) {
  return x * y;
}
inline double mul_rn(double x, double y) {
  return x * y;
}
inline float add_rn(float x, float y) {
  return x + y;
}
inline double add_rn(double x, double y) {
  return x + y;
}
inline float recip_rn(float x) {
  return 1.0f / x;
}
inline double recip_rn(double x) {
  return 1.0 / x;
}
#endif

template <typename T>
CEMFRAC_HD inline bool finite(T x) {
  return std::isfinite(x);
}

// K̂_d with std::max / std::min semantics (a NaN K_d stays NaN), as guard_scalar on the CPU.
template <typename T>
CEMFRAC_HD inline T guard(T kd, T eps) {
  if (kd >= T(0)) return kd < eps ? eps : kd;
  return -eps < kd ? -eps : kd;
}

// ---- Slow path: continuants as m * 2^e (double mantissa, 64-bit exponent) ----------------------
// For ladders whose K_d or K_{d-1} overflowed T, and exact-mode ladders inside the clamp. The tails
// are recomputed per depth (O(d^2) for this ladder only) instead of being stored: a thread has no
// dynamically sized scratch, and the path is rare.

struct Scaled {
  double m = 0;  // 0, or 0.5 <= |m| < 1 (NaN / inf carried through)
  long long e = 0;
};

// Every non-template function here is inline: the .cu kernels and the host test
// (tests/ops/continuant_cuda_math_test.cpp) both include this header and link into one binary.
CEMFRAC_HD inline Scaled make_scaled(double x) {
  if (!std::isfinite(x) || x == 0) return {x, 0};
  int e = 0;
  const double m = std::frexp(x, &e);
  return {m, e};
}

CEMFRAC_HD inline double ldexp_saturating(double m, long long e) {
  if (m == 0 || !std::isfinite(m)) return m;
  if (e > 4000) e = 4000;  // beyond double's range either way
  if (e < -4000) e = -4000;
  return std::ldexp(m, static_cast<int>(e));
}

// a * x + y for scaled x, y.
CEMFRAC_HD inline Scaled scaled_madd(double a, const Scaled& x, const Scaled& y) {
  long long base = x.m == 0 ? y.e : (y.m == 0 ? x.e : (x.e > y.e ? x.e : y.e));
  const double v = a * ldexp_saturating(x.m, x.e - base) + ldexp_saturating(y.m, y.e - base);
  Scaled out = make_scaled(v);
  out.e += base;
  return out;
}

// Tail continuant K_j of the ladder at `a` (depth levels `stride` apart), scaled.
template <typename T>
CEMFRAC_HD Scaled tail(const T* a, int64_t stride, int64_t d, int64_t j) {
  Scaled before{0, 0};
  Scaled cur = make_scaled(1);
  for (int64_t i = 1; i <= j; ++i) {
    const Scaled next = scaled_madd(static_cast<double>(a[(d - i) * stride]), cur, before);
    before = cur;
    cur = next;
  }
  return cur;
}

// One ladder on the slow path; writes whichever of f, r, grad_a are non-null. `clamp`: the fast
// path's decision |K_d| < eps when its K_d was finite (1 or 0), -1 to decide here.
template <typename T>
CEMFRAC_HD void ladder_slow(const T* a, int64_t stride, int64_t d, T eps_t, bool exact, int clamp,
                            T* f, T* r, T g, T* grad_a) {
  const double eps = eps_t;
  const Scaled kd = tail(a, stride, d, d);
  const Scaled kd1 = tail(a, stride, d, d - 1);
  const double kd_abs = std::fabs(ldexp_saturating(kd.m, kd.e));
  const bool clamped = clamp >= 0 ? clamp == 1 : kd_abs < eps;  // false for NaN
  Scaled kh = kd;
  if (clamped) kh = make_scaled(std::signbit(kd.m) && kd.m != 0 ? -eps : eps);
  const Scaled rs{1.0 / kh.m, -kh.e};
  if (f != nullptr) *f = static_cast<T>(ldexp_saturating(kd1.m * rs.m, kd1.e + rs.e));
  if (r != nullptr) *r = static_cast<T>(ldexp_saturating(rs.m, rs.e));
  if (grad_a == nullptr) return;
  const double gd = g;
  if (exact && clamped) {
    // Inside the clamp K̂_d is constant: df/da_1 = 0, df/da_k = r K(a_2..a_{k-1}) K_{d-k}, k >= 2.
    grad_a[0] = T(0);
    Scaled head_prev{0, 0};
    Scaled head = make_scaled(1);
    for (int64_t k = 2; k <= d; ++k) {
      const Scaled t = tail(a, stride, d, d - k);
      const double v = ldexp_saturating(rs.m * head.m * t.m, rs.e + head.e + t.e);
      grad_a[(k - 1) * stride] = static_cast<T>(v * gd);
      const Scaled next = scaled_madd(static_cast<double>(a[(k - 1) * stride]), head, head_prev);
      head_prev = head;
      head = next;
    }
    return;
  }
  for (int64_t k = 1; k <= d; ++k) {
    const Scaled t = tail(a, stride, d, d - k);
    const double q = t.m * rs.m;
    double w = ldexp_saturating(q * q, 2 * (t.e + rs.e));
    if (k & 1) w = -w;
    grad_a[(k - 1) * stride] = static_cast<T>(w * gd);
  }
}

// ---- One ladder, fast path with the slow path as fallback --------------------------------------
// ap points at a_1 of the ladder, depth levels L apart; kp (may be null) receives K_{d-k} at
// [(k-1) L]. Writes f and r.
template <typename T>
CEMFRAC_HD inline void forward_one(const T* ap, int64_t L, int64_t d, T eps, T* kp, T* f, T* r) {
  T prev = T(0), cur = T(1);  // K_{-1}, K_0
  for (int64_t k = d; k >= 1; --k) {
    if (kp != nullptr) kp[(k - 1) * L] = cur;  // K_{d-k}
    const T next = add_rn(mul_rn(ap[(k - 1) * L], cur), prev);
    prev = cur;
    cur = next;
  }
  T recip = recip_rn(guard(cur, eps));
  T fv = mul_rn(prev, recip);
  if (!(finite(cur) && finite(prev)))
    ladder_slow<T>(ap, L, d, eps, false, -1, &fv, &recip, T(0), nullptr);
  *f = fv;
  *r = recip;
}

// ks (may be null: recompute) the saved K_{d-k}; writes grad a_k at ga[(k-1) L].
template <typename T>
CEMFRAC_HD inline void backward_one(const T* ap, const T* ks, int64_t L, int64_t d, T rv, T g,
                                    T eps, bool exact, T* ga) {
  T prev = T(0), cur = T(1);
  for (int64_t k = d; k >= 1; --k) {
    const T kk = ks != nullptr ? ks[(k - 1) * L] : cur;  // K_{d-k}
    const T q = mul_rn(kk, rv);
    const T qq = mul_rn(q, q);
    ga[(k - 1) * L] = mul_rn((k & 1) ? -qq : qq, g);
    if (ks == nullptr) {
      const T next = add_rn(mul_rn(ap[(k - 1) * L], cur), prev);
      prev = cur;
      cur = next;
    }
  }
  if (ks != nullptr) {  // K_d = a_1 K_{d-1} + K_{d-2}, the forward's last step
    prev = ks[0];
    cur = add_rn(mul_rn(ap[0], ks[0]), d >= 2 ? ks[L] : T(0));
  }
  const bool bad = !(finite(cur) && finite(prev));
  const bool clamped = exact && std::fabs(cur) < eps;
  if (bad || clamped) ladder_slow<T>(ap, L, d, eps, exact, bad ? -1 : 1, nullptr, nullptr, g, ga);
}

}  // namespace cemfrac::kernels::cuda::math
