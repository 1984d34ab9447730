// Fused CPU kernels for continued-fraction ladders: forward and backward (docs/layers/ladders.md).
//
// Legend.  R rows, d depth, L ladders per row; layout a[n][k-1][l], ladder index fastest, so every
// step of the recurrence below is one contiguous multiply-add over a run of ladders.
//   a_k     partial denominator k = 1..d of one ladder (a_1 outermost, a_d innermost)
//   K_j     tail continuant K(a_{d-j+1}, ..., a_d):  K_{-1} = 0,  K_0 = 1,
//           K_j = a_{d-j+1} K_{j-1} + K_{j-2}  (j = 1..d)   =>  K_d = K(a_1..a_d), K_{d-1} =
//           K(a_2..a_d)
//   K̂_d     guarded K_d:  K̂_d = sgn(K_d) max(|K_d|, eps),  sgn(0) = sgn(-0) = +1
//   r       1 / K̂_d, the one reciprocal per ladder; cached for the backward
//   f       K_{d-1} r = 1/(a_1 + 1/(a_2 + ... + 1/a_d))  (guarded)
//   g       dLoss/df;  q_k = K_{d-k} r
//   tile    kTile consecutive ladders of one row; blocks of tiles are the units of work
//   (run_parallel) chunk   kChunk consecutive ladders of a tile, whose whole recurrence runs in
//   vector registers
//
// Backward (Proposition 1, spec §2.4): df/da_k = (-1)^k (K_{d-k} / K_d)^2, evaluated with K̂_d, i.e.
//   grad a_k = g (-1)^k q_k^2.  The continuants are recomputed from a (never by running the
//   recurrence downwards, which is unstable), so the backward reads a, g, r and performs no
//   division.
//
// Numerics notes (each pinned by a test in tests/ops/):
// - Pole guard: the only clamp is on K_d, at eps (0.01 by default, ContinuantOptions::eps), in the
//   forward right before the one division; K_d = +-0 gives K̂_d = +eps. Inner tails are never
//   clamped: their zeros are removable singularities of f (K_j = 0 just makes K_{j+1} = K_{j-1}).
//   Pinned by ContinuantPoleGuard.* and ContinuantRemovablePole.* (continuant_test.cpp).
// - With the guard inactive (|K_d| >= eps) the result is bitwise the eps = 0 (unguarded) kernel:
//   ContinuantPoleGuard.InactiveGuardIsBitwiseUnguarded.
// - No fused multiply-add anywhere (this file is compiled with -ffp-contract=off and the AVX2 clone
//   enables AVX2 only, not FMA), so the vector body, the scalar tail, the AVX2 and the baseline
//   builds and the ATen twin's `a * K + K_prev` all round identically: thread count, tiling and ISA
//   never change a bit (ContinuantFusedVsReference.*, ContinuantDeterminism.*).
// - Overflow: |K_j| grows like prod(|a_k| + 1) and can exceed the dtype's range although f and its
//   gradient are representable (e.g. every a_k = 1e30 in float32). A ladder whose K_d or K_{d-1}
//   came out non-finite is re-run on a slow scalar path in long double with a separate binary
//   exponent per continuant (no overflow for any finite input), with the same formulas. The same
//   path computes the exact-mode gradient of ladders inside the clamp. NaN inputs give NaN for that
//   ladder only. Pinned by ContinuantPoleGuard.HugeInputsStayFinite / NonFiniteInputs.
// - Exact mode (ContinuantOptions::backward = kExact): inside the clamp K̂_d is constant, so
//   df/da_1 = 0 and df/da_k = r K(a_2..a_{k-1}) K_{d-k} for k >= 2 (cofactor rule on K_{d-1});
//   outside it equals Proposition 1. ContinuantGrad.ExactModeInsideClamp pins it.
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "cemfrac/core/check.h"
#include "cemfrac/kernels/kernels.h"

// Vectors are passed between always-inline helpers only; their ABI never matters.
#pragma GCC diagnostic ignored "-Wpsabi"

#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
#define CEMFRAC_LADDER_X86_DISPATCH 1
#define CEMFRAC_LADDER_INLINE __attribute__((always_inline)) inline
#else
#define CEMFRAC_LADDER_X86_DISPATCH 0
#define CEMFRAC_LADDER_INLINE inline
#endif

namespace cemfrac::kernels {
namespace {

// Ladders per tile: the unit of the slow-path bookkeeping and of the work blocks (run_parallel).
// Inside a tile the ladders are processed in register-resident chunks of kChunk (see the fast path
// below).
constexpr int64_t kTile = 512;

template <typename T>
struct LadderArgs {
  const T* a = nullptr;        // (R, d, L)
  const T* k_saved = nullptr;  // (R, d, L) K_{d-k} at [.][k-1][.], or null (recompute)
  const T* grad_f = nullptr;   // (R, L)
  const T* r = nullptr;        // (R, L) cached reciprocal (backward input)
  T* f = nullptr;              // (R, L)
  T* r_out = nullptr;          // (R, L) or null
  T* k_out = nullptr;          // (R, d, L) or null
  T* grad_a = nullptr;         // (R, d, L)
  int64_t rows = 0, depth = 0, ladders = 0, tiles_per_row = 0;
  T eps = 0;
  bool exact = false;
};

// ---------------------------------------------------------------------------------------------------
// Slow path: one ladder in long double, each continuant carried as m * 2^e with its own exponent.
// Used for ladders whose float/double continuants overflowed and for exact-mode ladders inside the
// clamp. Same formulas as the fast path; only the arithmetic is wider.

struct Scaled {
  long double m = 0;  // 0, or 0.5 <= |m| < 1 (non-finite m carries NaN/inf through)
  int64_t e = 0;
};

Scaled make_scaled(long double x) {
  if (!std::isfinite(x) || x == 0) return {x, 0};
  int e = 0;
  const long double m = std::frexp(x, &e);
  return {m, e};
}

long double ldexp_saturating(long double m, int64_t e) {
  if (m == 0 || !std::isfinite(m)) return m;
  e = std::clamp<int64_t>(e, -40000, 40000);  // beyond long double's range either way
  return std::ldexp(m, static_cast<int>(e));
}

// a * x + y for scaled x, y.
Scaled scaled_fma(long double a, const Scaled& x, const Scaled& y) {
  int64_t base = 0;
  if (x.m == 0) {
    base = y.e;
  } else if (y.m == 0) {
    base = x.e;
  } else {
    base = std::max(x.e, y.e);
  }
  // |a| < 2^1024 and |m| < 1, so the sum stays inside long double's range before renormalising.
  const long double v = a * ldexp_saturating(x.m, x.e - base) + ldexp_saturating(y.m, y.e - base);
  Scaled out = make_scaled(v);
  out.e += base;
  return out;
}

struct SlowScratch {
  std::vector<Scaled> tails;  // K_0 .. K_d
};

// a points at a_1 of this ladder; consecutive depth levels are `stride` apart. Writes whichever of
// f, r (forward) and grad_a (backward, needs g) are non-null. `clamp` is the fast path's decision
// |K_d| < eps when its K_d was finite (1 or 0), so both paths agree at the boundary; -1: decide
// here.
template <typename T>
void ladder_slow_path(const T* a, int64_t stride, int64_t d, T eps_t, bool exact, int clamp, T* f,
                      T* r, T g, T* grad_a, SlowScratch& scratch) {
  const long double eps = eps_t;
  auto a_at = [&](int64_t k) { return static_cast<long double>(a[(k - 1) * stride]); };
  // Scalar math: K_{-1} = 0, K_0 = 1, K_j = a_{d-j+1} K_{j-1} + K_{j-2}.
  auto& tails = scratch.tails;
  tails.assign(static_cast<size_t>(d + 1), Scaled{});
  Scaled before{0, 0};
  tails[0] = make_scaled(1);
  for (int64_t j = 1; j <= d; ++j) {
    tails[j] = scaled_fma(a_at(d - j + 1), tails[j - 1], j >= 2 ? tails[j - 2] : before);
  }
  const Scaled kd = tails[d];
  const Scaled kd1 = tails[d - 1];
  // Scalar math: K̂_d = sgn(K_d) max(|K_d|, eps) with sgn(0) = +1.
  const long double kd_abs = std::fabs(ldexp_saturating(kd.m, kd.e));
  const bool clamped = clamp >= 0 ? clamp == 1 : kd_abs < eps;  // false for NaN
  Scaled kh = kd;
  if (clamped) kh = make_scaled(std::signbit(kd.m) && kd.m != 0 ? -eps : eps);
  // r = 1 / K̂_d as (1/m) 2^-e; 1/m is in (1, 2], no need to renormalise.
  const Scaled rs{1.0L / kh.m, -kh.e};
  if (f != nullptr) *f = static_cast<T>(ldexp_saturating(kd1.m * rs.m, kd1.e + rs.e));
  if (r != nullptr) *r = static_cast<T>(ldexp_saturating(rs.m, rs.e));
  if (grad_a == nullptr) return;
  const long double gl = g;
  if (exact && clamped) {
    // Scalar math: inside the clamp f = K_{d-1} / K̂_d with K̂_d constant:
    //   df/da_1 = 0;  df/da_k = r K(a_2..a_{k-1}) K_{d-k}  (k >= 2; head continuants H below).
    grad_a[0] = static_cast<T>(0);
    Scaled head_prev{0, 0};        // H_{-1} = 0
    Scaled head = make_scaled(1);  // H_0 = K() = 1
    for (int64_t k = 2; k <= d; ++k) {
      // head = K(a_2..a_{k-1}) here.
      const Scaled& tail = tails[d - k];
      const long double v = ldexp_saturating(rs.m * head.m * tail.m, rs.e + head.e + tail.e);
      grad_a[(k - 1) * stride] = static_cast<T>(v * gl);
      const Scaled next = scaled_fma(a_at(k), head, head_prev);  // K(a_2..a_k)
      head_prev = head;
      head = next;
    }
    return;
  }
  // Scalar math: grad a_k = g (-1)^k (K_{d-k} r)^2.
  for (int64_t k = 1; k <= d; ++k) {
    const Scaled& tail = tails[d - k];
    const long double q = tail.m * rs.m;
    long double w = ldexp_saturating(q * q, 2 * (tail.e + rs.e));
    if (k & 1) w = -w;
    grad_a[(k - 1) * stride] = static_cast<T>(w * gl);
  }
}

// ---------------------------------------------------------------------------------------------------
// Fast path, one tile of n <= kTile ladders, in register-resident chunks.
//
// A chunk is kChunk consecutive ladders (two 32-byte vectors: 16 floats or 8 doubles). For each
// chunk the whole recurrence runs in registers: K_{j-1}, K_j never touch memory, every a_k is
// loaded once (the d depth rows are d sequential streams, 64 bytes per chunk each), and each output
// is stored once. GCC vector extensions make the code ISA-neutral: the baseline build lowers a
// 32-byte vector to two SSE2 registers, the AVX2 clone to one ymm register. Every lane of a vector
// operation is the same IEEE operation as the scalar tail's (`a * K + K_prev` etc.; no contraction,
// see the header), so a ladder's bits do not depend on whether it falls in a vector chunk or in the
// scalar tail.

template <typename T>
struct VecOf;
template <>
struct VecOf<float> {
  typedef float type __attribute__((vector_size(32)));
};
template <>
struct VecOf<double> {
  typedef double type __attribute__((vector_size(32)));
};

template <typename T>
using Vec = typename VecOf<T>::type;

template <typename T>
constexpr int64_t kLanes = static_cast<int64_t>(sizeof(Vec<T>) / sizeof(T));

constexpr int kUnroll = 2;  // vectors per chunk: two independent recurrences in flight

template <typename T>
constexpr int64_t kChunk = kUnroll* kLanes<T>;

template <typename T>
CEMFRAC_LADDER_INLINE Vec<T> vload(const T* p) {
  Vec<T> v;
  std::memcpy(&v, p, sizeof(v));  // unaligned load (movups / vmovups)
  return v;
}

template <typename T>
CEMFRAC_LADDER_INLINE void vstore(T* p, const Vec<T>& v) {
  std::memcpy(p, &v, sizeof(v));
}

template <typename T>
CEMFRAC_LADDER_INLINE Vec<T> splat(T x) {
  return Vec<T>{} + x;
}

// Lane mask (all ones / zero per lane) of "x is finite": !(|x| <= max) is NaN or inf.
template <typename T>
CEMFRAC_LADDER_INLINE auto finite_mask(const Vec<T>& x) {
  const Vec<T> big = splat<T>(std::numeric_limits<T>::max());
  return (x <= big) & (x >= -big);
}

// True if every lane of a lane mask is set.
template <typename M>
CEMFRAC_LADDER_INLINE bool all_lanes(const M& m) {
  uint64_t w[sizeof(M) / 8];
  std::memcpy(w, &m, sizeof(m));
  uint64_t acc = ~uint64_t{0};
  for (size_t j = 0; j < sizeof(M) / 8; ++j) acc &= w[j];
  return acc == ~uint64_t{0};
}

// True if some lane of a lane mask is set.
template <typename M>
CEMFRAC_LADDER_INLINE bool any_lane(const M& m) {
  uint64_t w[sizeof(M) / 8];
  std::memcpy(w, &m, sizeof(m));
  uint64_t acc = 0;
  for (size_t j = 0; j < sizeof(M) / 8; ++j) acc |= w[j];
  return acc != 0;
}

// Scalar math: K̂_d = K_d >= 0 ? max(K_d, eps) : min(K_d, -eps)  (std::max / std::min semantics:
// max(x, e) = x < e ? e : x, min(x, -e) = -e < x ? -e : x; NaN stays NaN).
template <typename T>
CEMFRAC_LADDER_INLINE T guard_scalar(T kd, T eps) {
  return kd >= T(0) ? std::max(kd, eps) : std::min(kd, -eps);
}

template <typename T>
CEMFRAC_LADDER_INLINE Vec<T> guard_vec(const Vec<T>& kd, const Vec<T>& eps) {
  const Vec<T> zero{};
  const Vec<T> up = kd < eps ? eps : kd;
  const Vec<T> down = -eps < kd ? -eps : kd;
  return kd >= zero ? up : down;
}

// One ladder of the forward, scalar, with the vector chunk's formulas. Returns false if K_d or
// K_{d-1} is non-finite (the caller then takes the slow path).
template <typename T>
CEMFRAC_LADDER_INLINE bool forward_ladder_scalar(const T* a, int64_t L, int64_t d, T eps, T* f,
                                                 T* r, T* k_out) {
  T prev = T(0), cur = T(1);  // K_{-1}, K_0
  for (int64_t k = d; k >= 1; --k) {
    if (k_out != nullptr) k_out[(k - 1) * L] = cur;
    const T next = a[(k - 1) * L] * cur + prev;
    prev = cur;
    cur = next;
  }
  const T recip = T(1) / guard_scalar(cur, eps);
  *f = prev * recip;
  if (r != nullptr) *r = recip;
  return std::isfinite(cur) && std::isfinite(prev);
}

template <typename T>
CEMFRAC_LADDER_INLINE void forward_tile(const LadderArgs<T>& p, int64_t row, int64_t l0, int64_t n,
                                        SlowScratch& scratch) {
  using V = Vec<T>;
  const int64_t d = p.depth;
  const int64_t L = p.ladders;
  const T* __restrict a = p.a + (row * d) * L + l0;
  T* __restrict f = p.f + row * L + l0;
  T* __restrict r_out = p.r_out != nullptr ? p.r_out + row * L + l0 : nullptr;
  T* __restrict k_out = p.k_out != nullptr ? p.k_out + (row * d) * L + l0 : nullptr;
  const T eps = p.eps;
  const V epsv = splat<T>(eps);
  const V one = splat<T>(T(1));
  constexpr int64_t W = kLanes<T>;
  int64_t i = 0;
  for (; i + kChunk<T> <= n; i += kChunk<T>) {
    // Scalar math: for k = d..1:  K_{d-k+1} = a_k K_{d-k} + K_{d-k-1}.
    V prev[kUnroll], cur[kUnroll];
    for (int u = 0; u < kUnroll; ++u) {
      prev[u] = V{};  // K_{-1}
      cur[u] = one;   // K_0
    }
    for (int64_t k = d; k >= 1; --k) {
      const T* ak = a + (k - 1) * L + i;
      for (int u = 0; u < kUnroll; ++u) {
        if (k_out != nullptr) vstore<T>(k_out + (k - 1) * L + i + u * W, cur[u]);  // K_{d-k}
        const V next = vload<T>(ak + u * W) * cur[u] + prev[u];
        prev[u] = cur[u];
        cur[u] = next;
      }
    }
    // Now cur = K_d, prev = K_{d-1}.  r = 1 / K̂_d (the one division);  f = K_{d-1} r.
    bool finite = true;
    for (int u = 0; u < kUnroll; ++u) {
      const V recip = one / guard_vec<T>(cur[u], epsv);
      vstore<T>(f + i + u * W, prev[u] * recip);
      if (r_out != nullptr) vstore<T>(r_out + i + u * W, recip);
      finite = finite && all_lanes(finite_mask<T>(cur[u]) & finite_mask<T>(prev[u]));
    }
    if (!finite) {
      for (int64_t j = i; j < i + kChunk<T>; ++j) {
        T fj, rj;
        if (forward_ladder_scalar<T>(a + j, L, d, eps, &fj, &rj, nullptr)) continue;
        ladder_slow_path<T>(a + j, L, d, eps, false, -1, f + j,
                            r_out != nullptr ? r_out + j : nullptr, T(0), nullptr, scratch);
      }
    }
  }
  for (; i < n; ++i) {
    if (forward_ladder_scalar<T>(a + i, L, d, eps, f + i, r_out != nullptr ? r_out + i : nullptr,
                                 k_out != nullptr ? k_out + i : nullptr)) {
      continue;
    }
    ladder_slow_path<T>(a + i, L, d, eps, false, -1, f + i, r_out != nullptr ? r_out + i : nullptr,
                        T(0), nullptr, scratch);
  }
}

// One ladder of the backward, scalar, with the vector chunk's formulas: writes grad a_k for k =
// d..1 and returns K_d, K_{d-1} (bitwise the forward's) for the caller's slow-path decision.
template <typename T>
CEMFRAC_LADDER_INLINE void backward_ladder_scalar(const T* a, const T* ks, int64_t L, int64_t d,
                                                  T r, T g, T* grad_a, T* kd_out, T* kd1_out) {
  // Forward being differentiated:  f = K_{d-1} r,  r = 1/K̂_d  ->  df/da_k = (-1)^k (K_{d-k} r)^2.
  T prev = T(0), cur = T(1);
  for (int64_t k = d; k >= 1; --k) {
    const T kk = ks != nullptr ? ks[(k - 1) * L] : cur;  // K_{d-k}
    const T q = kk * r;
    grad_a[(k - 1) * L] = (k & 1) ? -(q * q) * g : (q * q) * g;
    if (ks == nullptr) {
      const T next = a[(k - 1) * L] * cur + prev;
      prev = cur;
      cur = next;
    }
  }
  if (ks != nullptr) {
    // K_d = a_1 K_{d-1} + K_{d-2}, the forward's last step.
    prev = ks[0];
    cur = a[0] * ks[0] + (d >= 2 ? ks[L] : T(0));
  }
  *kd_out = cur;
  *kd1_out = prev;
}

// Longer than ~80 lines on purpose: the vector loop over one tile of ladders keeps the continuants
// of every depth in registers between the forward recomputation and the closed-form gradient;
// split into functions, they would go through memory (docs/results.md, the ladder kernel's floor).
template <typename T>
CEMFRAC_LADDER_INLINE void backward_tile(const LadderArgs<T>& p, int64_t row, int64_t l0, int64_t n,
                                         SlowScratch& scratch) {
  using V = Vec<T>;
  const int64_t d = p.depth;
  const int64_t L = p.ladders;
  const T* __restrict a = p.a + (row * d) * L + l0;
  const T* __restrict g = p.grad_f + row * L + l0;
  const T* __restrict r = p.r + row * L + l0;
  const T* __restrict ks = p.k_saved != nullptr ? p.k_saved + (row * d) * L + l0 : nullptr;
  T* __restrict grad_a = p.grad_a + (row * d) * L + l0;
  const T eps = p.eps;
  const V epsv = splat<T>(eps);
  constexpr int64_t W = kLanes<T>;
  // A ladder whose K_d or K_{d-1} is non-finite, or (exact mode) whose |K_d| < eps, is redone on
  // the slow path, which overwrites its gradients.
  auto fix = [&](int64_t j, T kd, T kd1) {
    const bool bad = !(std::isfinite(kd) && std::isfinite(kd1));
    const bool clamped = p.exact && std::abs(kd) < eps;
    if (!bad && !clamped) return;
    ladder_slow_path<T>(a + j, L, d, eps, p.exact, bad ? -1 : 1, nullptr, nullptr, g[j], grad_a + j,
                        scratch);
  };
  int64_t i = 0;
  for (; i + kChunk<T> <= n; i += kChunk<T>) {
    V rv[kUnroll], gv[kUnroll], prev[kUnroll], cur[kUnroll];
    for (int u = 0; u < kUnroll; ++u) {
      rv[u] = vload<T>(r + i + u * W);
      gv[u] = vload<T>(g + i + u * W);
    }
    if (ks == nullptr) {
      for (int u = 0; u < kUnroll; ++u) {
        prev[u] = V{};
        cur[u] = splat<T>(T(1));
      }
      // Scalar math: for k = d..1:  q = K_{d-k} r;  grad a_k = (-1)^k (q q) g;  then advance K as
      // in the forward (K_{d-k+1} = a_k K_{d-k} + K_{d-k-1}), so K_{d-k} is ready exactly when a_k
      // is read.
      for (int64_t k = d; k >= 1; --k) {
        const T* ak = a + (k - 1) * L + i;
        T* gk = grad_a + (k - 1) * L + i;
        for (int u = 0; u < kUnroll; ++u) {
          const V q = cur[u] * rv[u];
          const V w = (k & 1) ? -(q * q) * gv[u] : (q * q) * gv[u];
          vstore<T>(gk + u * W, w);
          const V next = vload<T>(ak + u * W) * cur[u] + prev[u];
          prev[u] = cur[u];
          cur[u] = next;
        }
      }
    } else {
      for (int64_t k = d; k >= 1; --k) {
        const T* kk = ks + (k - 1) * L + i;  // K_{d-k}
        T* gk = grad_a + (k - 1) * L + i;
        for (int u = 0; u < kUnroll; ++u) {
          const V q = vload<T>(kk + u * W) * rv[u];
          const V w = (k & 1) ? -(q * q) * gv[u] : (q * q) * gv[u];
          vstore<T>(gk + u * W, w);
        }
      }
      for (int u = 0; u < kUnroll; ++u) {
        prev[u] = vload<T>(ks + i + u * W);
        const V kd2 = d >= 2 ? vload<T>(ks + L + i + u * W) : V{};
        cur[u] = vload<T>(a + i + u * W) * prev[u] + kd2;
      }
    }
    // Now cur = K_d, prev = K_{d-1}: bitwise the forward's values.
    bool redo = false;
    for (int u = 0; u < kUnroll; ++u) {
      redo = redo || !all_lanes(finite_mask<T>(cur[u]) & finite_mask<T>(prev[u]));
      if (p.exact) redo = redo || any_lane((cur[u] < epsv) & (cur[u] > -epsv));
    }
    if (redo) {
      for (int u = 0; u < kUnroll; ++u) {
        for (int64_t j = 0; j < W; ++j) fix(i + u * W + j, cur[u][j], prev[u][j]);
      }
    }
  }
  for (; i < n; ++i) {
    T kd, kd1;
    backward_ladder_scalar<T>(a + i, ks != nullptr ? ks + i : nullptr, L, d, r[i], g[i], grad_a + i,
                              &kd, &kd1);
    fix(i, kd, kd1);
  }
}

// Runs tiles [t0, t1) of the flattened (row, tile) index.
template <typename T, bool kForward>
CEMFRAC_LADDER_INLINE void run_tiles(const LadderArgs<T>& p, int64_t t0, int64_t t1) {
  SlowScratch scratch;
  for (int64_t t = t0; t < t1; ++t) {
    const int64_t row = t / p.tiles_per_row;
    const int64_t l0 = (t % p.tiles_per_row) * kTile;
    const int64_t n = std::min(kTile, p.ladders - l0);
    if constexpr (kForward) {
      forward_tile<T>(p, row, l0, n, scratch);
    } else {
      backward_tile<T>(p, row, l0, n, scratch);
    }
  }
}

// Two builds of the same loops: the baseline (x86-64 SSE2 or the host's default) and, on x86, an
// AVX2 clone chosen at run time from CPUID, so the binary still runs on any x86-64.
template <typename T, bool kForward>
void run_tiles_baseline(const LadderArgs<T>& p, int64_t t0, int64_t t1) {
  run_tiles<T, kForward>(p, t0, t1);
}

#if CEMFRAC_LADDER_X86_DISPATCH
template <typename T, bool kForward>
__attribute__((target("avx2"))) void run_tiles_avx2(const LadderArgs<T>& p, int64_t t0,
                                                    int64_t t1) {
  run_tiles<T, kForward>(p, t0, t1);
}

bool cpu_has_avx2() {
  static const bool has = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") != 0;
  }();
  return has;
}
#else
bool cpu_has_avx2() {
  return false;
}
#endif

// -1 = auto (CPUID), 0 = baseline, 1 = avx2.
std::atomic<int> g_isa_override{-1};

bool use_avx2() {
  const int o = g_isa_override.load(std::memory_order_relaxed);
  if (o >= 0) return o == 1;
  return cpu_has_avx2();
}

template <typename T, bool kForward>
void run_parallel(const LadderArgs<T>& p) {
  const int64_t tiles = p.rows * p.tiles_per_row;
  if (tiles == 0) return;
  // Block: a unit of work should stream at least ~256 KiB of a (64 Ki elements of float) so that
  // claiming it stays well under its work; with a single block everything runs inline.
  const int64_t per_tile = std::max<int64_t>(1, std::min(kTile, p.ladders) * p.depth);
  const int64_t block = std::max<int64_t>(1, (int64_t{1} << 16) / per_tile);
  const int64_t blocks = (tiles + block - 1) / block;
  auto run = [&](int64_t t0, int64_t t1) {
#if CEMFRAC_LADDER_X86_DISPATCH
    if (use_avx2()) {
      run_tiles_avx2<T, kForward>(p, t0, t1);
      return;
    }
#endif
    run_tiles_baseline<T, kForward>(p, t0, t1);
  };
  const int64_t workers = std::min<int64_t>(blocks, at::get_num_threads());
  if (workers <= 1 || at::in_parallel_region()) {
    run(0, tiles);
    return;
  }
  // Dynamic schedule: each worker claims the next block until none is left. A static split (what
  // at::parallel_for does) waits for the slowest half, which on a shared machine is the half whose
  // thread was descheduled. Every tile is computed the same way whichever thread runs it, so the
  // result does not depend on the schedule.
  std::atomic<int64_t> next{0};
  at::parallel_for(0, workers, 1, [&](int64_t w0, int64_t w1) {
    for (int64_t w = w0; w < w1; ++w) {
      for (int64_t b = next.fetch_add(1, std::memory_order_relaxed); b < blocks;
           b = next.fetch_add(1, std::memory_order_relaxed)) {
        run(b * block, std::min(tiles, (b + 1) * block));
      }
    }
  });
}

void check_ladder_tensor(const at::Tensor& t, const at::Tensor& like, int64_t dim,
                         const char* name) {
  TORCH_INTERNAL_ASSERT(t.defined() && t.is_contiguous() && t.scalar_type() == like.scalar_type() &&
                            t.dim() == dim && t.device().is_cpu(),
                        "continuant kernel: bad tensor ", name);
}

}  // namespace

void continuant_forward_cpu(const at::Tensor& a, double eps, const at::Tensor& f,
                            const at::Tensor& r, const at::Tensor& k_saved) {
  check_ladder_tensor(a, a, 3, "a");
  check_ladder_tensor(f, a, 2, "f");
  if (r.defined()) check_ladder_tensor(r, a, 2, "r");
  if (k_saved.defined()) check_ladder_tensor(k_saved, a, 3, "k_saved");
  TORCH_INTERNAL_ASSERT(a.size(1) >= 1 && eps >= 0);
  AT_DISPATCH_FLOATING_TYPES(a.scalar_type(), "continuant_forward_cpu", [&] {
    LadderArgs<scalar_t> p;
    p.a = a.data_ptr<scalar_t>();
    p.f = f.data_ptr<scalar_t>();
    p.r_out = r.defined() ? r.data_ptr<scalar_t>() : nullptr;
    p.k_out = k_saved.defined() ? k_saved.data_ptr<scalar_t>() : nullptr;
    p.rows = a.size(0);
    p.depth = a.size(1);
    p.ladders = a.size(2);
    p.tiles_per_row = (p.ladders + kTile - 1) / kTile;
    p.eps = static_cast<scalar_t>(eps);
    run_parallel<scalar_t, true>(p);
  });
}

void continuant_backward_cpu(const at::Tensor& a, const at::Tensor& r, const at::Tensor& k_saved,
                             const at::Tensor& grad_f, double eps, bool exact,
                             const at::Tensor& grad_a) {
  check_ladder_tensor(a, a, 3, "a");
  check_ladder_tensor(r, a, 2, "r");
  check_ladder_tensor(grad_f, a, 2, "grad_f");
  check_ladder_tensor(grad_a, a, 3, "grad_a");
  if (k_saved.defined()) check_ladder_tensor(k_saved, a, 3, "k_saved");
  TORCH_INTERNAL_ASSERT(a.size(1) >= 1 && eps >= 0);
  AT_DISPATCH_FLOATING_TYPES(a.scalar_type(), "continuant_backward_cpu", [&] {
    LadderArgs<scalar_t> p;
    p.a = a.data_ptr<scalar_t>();
    p.r = r.data_ptr<scalar_t>();
    p.k_saved = k_saved.defined() ? k_saved.data_ptr<scalar_t>() : nullptr;
    p.grad_f = grad_f.data_ptr<scalar_t>();
    p.grad_a = grad_a.data_ptr<scalar_t>();
    p.rows = a.size(0);
    p.depth = a.size(1);
    p.ladders = a.size(2);
    p.tiles_per_row = (p.ladders + kTile - 1) / kTile;
    p.eps = static_cast<scalar_t>(eps);
    p.exact = exact;
    run_parallel<scalar_t, false>(p);
  });
}

std::string continuant_cpu_isa() {
  return use_avx2() ? "avx2" : "baseline";
}

void set_continuant_cpu_isa(const std::string& isa) {
  if (isa == "auto") {
    g_isa_override.store(-1);
  } else if (isa == "baseline") {
    g_isa_override.store(0);
  } else if (isa == "avx2") {
    CEMFRAC_CHECK(cpu_has_avx2(),
                  "ladder ISA 'avx2' requested but this CPU (or build) has no AVX2");
    g_isa_override.store(1);
  } else {
    fail("unknown ladder ISA '{}' (expected auto, baseline or avx2)", isa);
  }
}

}  // namespace cemfrac::kernels
