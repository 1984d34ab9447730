// Fused CPU kernels for continued-fraction ladders: forward and backward (docs/layers/cofrgenet.md).
//
// Legend.  R rows, d depth, L ladders per row; layout a[n][k-1][l], ladder index fastest, so every
// step of the recurrence below is one contiguous multiply-add over a run of ladders.
//   a_k     partial denominator k = 1..d of one ladder (a_1 outermost, a_d innermost)
//   K_j     tail continuant K(a_{d-j+1}, ..., a_d):  K_{-1} = 0,  K_0 = 1,
//           K_j = a_{d-j+1} K_{j-1} + K_{j-2}  (j = 1..d)   =>  K_d = K(a_1..a_d), K_{d-1} = K(a_2..a_d)
//   K̂_d     guarded K_d:  K̂_d = sgn(K_d) max(|K_d|, eps),  sgn(0) = sgn(-0) = +1
//   r       1 / K̂_d, the one reciprocal per ladder; cached for the backward
//   f       K_{d-1} r = 1/(a_1 + 1/(a_2 + ... + 1/a_d))  (guarded)
//   g       dLoss/df;  q_k = K_{d-k} r
//   tile    kTile consecutive ladders of one row: the unit of work of at::parallel_for
//
// Backward (Proposition 1, spec §2.4): df/da_k = (-1)^k (K_{d-k} / K_d)^2, evaluated with K̂_d, i.e.
//   grad a_k = g (-1)^k q_k^2.  The continuants are recomputed from a (never by running the recurrence
//   downwards, which is unstable), so the backward reads a, g, r and performs no division.
//
// Numerics notes (each pinned by a test in tests/ops/):
// - Pole guard: the only clamp is on K_d, at eps (0.01 by default, ContinuantOptions::eps), in the
//   forward right before the one division; K_d = +-0 gives K̂_d = +eps. Inner tails are never
//   clamped: their zeros are removable singularities of f (K_j = 0 just makes K_{j+1} = K_{j-1}).
//   Pinned by ContinuantPoleGuard.* and ContinuantRemovablePole.* (continuant_test.cpp).
// - With the guard inactive (|K_d| >= eps) the result is bitwise the eps = 0 (unguarded) kernel:
//   ContinuantPoleGuard.InactiveGuardIsBitwiseUnguarded.
// - No fused multiply-add anywhere (this file is compiled with -ffp-contract=off and the AVX2 clone
//   enables AVX2 only, not FMA), so the vector body, the scalar tail, the AVX2 and the baseline builds
//   and the ATen twin's `a * K + K_prev` all round identically: thread count, tiling and ISA never
//   change a bit (ContinuantFusedVsReference.*, ContinuantDeterminism.*).
// - Overflow: |K_j| grows like prod(|a_k| + 1) and can exceed the dtype's range although f and its
//   gradient are representable (e.g. every a_k = 1e30 in float32). A tile whose K_d or K_{d-1} came
//   out non-finite re-runs those ladders on a slow scalar path in long double with a separate
//   binary exponent per continuant (no overflow for any finite input), with the same formulas. The
//   same path computes the exact-mode gradient of ladders inside the clamp. NaN inputs give NaN for
//   that ladder only. Pinned by ContinuantPoleGuard.HugeInputsStayFinite / NonFiniteInputs.
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
#include <limits>
#include <vector>

#include "cemfrac/core/check.h"
#include "cemfrac/kernels/kernels.h"

#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
#define CEMFRAC_LADDER_X86_DISPATCH 1
#define CEMFRAC_LADDER_INLINE __attribute__((always_inline)) inline
#else
#define CEMFRAC_LADDER_X86_DISPATCH 0
#define CEMFRAC_LADDER_INLINE inline
#endif

namespace cemfrac::kernels {
namespace {

// Ladders per tile. The forward keeps two tile-long rows of continuants (K_{j-1}, K_j) on the stack
// (8 KiB in double) and streams d rows of a past them, so everything but a and the outputs stays in
// L1; 512 ladders = 2 KiB of float per depth level, long enough runs for the hardware prefetcher.
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
// |K_d| < eps when its K_d was finite (1 or 0), so both paths agree at the boundary; -1: decide here.
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
    Scaled head_prev{0, 0};          // H_{-1} = 0
    Scaled head = make_scaled(1);    // H_0 = K() = 1
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
// Fast path, one tile of n <= kTile ladders. Plain contiguous loops over the ladder index: the compiler
// vectorises them (SSE2 in the baseline build, AVX2 in the clone below); every loop is written so that
// element i only touches index i, which makes the vector body and the scalar tail round identically.

template <typename T>
CEMFRAC_LADDER_INLINE bool any_non_finite(const T* __restrict x, const T* __restrict y, int64_t n) {
  const T big = std::numeric_limits<T>::max();
  int bad = 0;
  for (int64_t i = 0; i < n; ++i) bad |= static_cast<int>(!(std::abs(x[i]) <= big)) |
                                         static_cast<int>(!(std::abs(y[i]) <= big));
  return bad != 0;
}

template <typename T>
CEMFRAC_LADDER_INLINE void forward_tile(const LadderArgs<T>& p, int64_t row, int64_t l0, int64_t n,
                                        SlowScratch& scratch) {
  const int64_t d = p.depth;
  const int64_t L = p.ladders;
  const T* __restrict a = p.a + (row * d) * L + l0;
  T* __restrict f = p.f + row * L + l0;
  T* __restrict r_out = p.r_out != nullptr ? p.r_out + row * L + l0 : nullptr;
  T* __restrict k_out = p.k_out != nullptr ? p.k_out + (row * d) * L + l0 : nullptr;
  alignas(64) T prev[kTile];  // K_{j-1}
  alignas(64) T cur[kTile];   // K_j
  alignas(64) T recip[kTile];
  for (int64_t i = 0; i < n; ++i) {
    prev[i] = T(0);  // K_{-1}
    cur[i] = T(1);   // K_0
  }
  // Scalar math: for k = d..1:  K_{d-k+1} = a_k K_{d-k} + K_{d-k-1}.
  for (int64_t k = d; k >= 1; --k) {
    const T* __restrict ak = a + (k - 1) * L;
    if (k_out != nullptr) {
      T* __restrict kk = k_out + (k - 1) * L;  // stores K_{d-k}, the factor of grad a_k
      for (int64_t i = 0; i < n; ++i) kk[i] = cur[i];
    }
    for (int64_t i = 0; i < n; ++i) {
      const T next = ak[i] * cur[i] + prev[i];
      prev[i] = cur[i];
      cur[i] = next;
    }
  }
  // Now cur = K_d, prev = K_{d-1}.
  // Scalar math: K̂_d = K_d >= 0 ? max(K_d, eps) : min(K_d, -eps);  r = 1 / K̂_d;  f = K_{d-1} r.
  const T eps = p.eps;
  for (int64_t i = 0; i < n; ++i) {
    const T kd = cur[i];
    const T kh = kd >= T(0) ? std::max(kd, eps) : std::min(kd, -eps);
    recip[i] = T(1) / kh;  // the one division of the ladder
    f[i] = prev[i] * recip[i];
  }
  if (r_out != nullptr) {
    for (int64_t i = 0; i < n; ++i) r_out[i] = recip[i];
  }
  if (any_non_finite(cur, prev, n)) {
    for (int64_t i = 0; i < n; ++i) {
      if (std::isfinite(cur[i]) && std::isfinite(prev[i])) continue;
      ladder_slow_path<T>(a + i, L, d, eps, false, -1, f + i,
                          r_out != nullptr ? r_out + i : nullptr, T(0), nullptr, scratch);
    }
  }
}

template <typename T>
CEMFRAC_LADDER_INLINE void backward_tile(const LadderArgs<T>& p, int64_t row, int64_t l0, int64_t n,
                                         SlowScratch& scratch) {
  const int64_t d = p.depth;
  const int64_t L = p.ladders;
  const T* __restrict a = p.a + (row * d) * L + l0;
  const T* __restrict g = p.grad_f + row * L + l0;
  const T* __restrict r = p.r + row * L + l0;
  T* __restrict grad_a = p.grad_a + (row * d) * L + l0;
  alignas(64) T prev[kTile];
  alignas(64) T cur[kTile];
  // Forward being differentiated:  f = K_{d-1} r,  r = 1/K̂_d  ->  df/da_k = (-1)^k (K_{d-k} r)^2.
  // Scalar math: for k = d..1:  q = K_{d-k} r;  grad a_k = (-1)^k (q q) g;  then advance K as in
  // the forward (K_{d-k+1} = a_k K_{d-k} + K_{d-k-1}), so K_{d-k} is ready exactly when a_k is read.
  if (p.k_saved == nullptr) {
    for (int64_t i = 0; i < n; ++i) {
      prev[i] = T(0);
      cur[i] = T(1);
    }
    for (int64_t k = d; k >= 1; --k) {
      const T* __restrict ak = a + (k - 1) * L;
      T* __restrict gk = grad_a + (k - 1) * L;
      if (k & 1) {
        for (int64_t i = 0; i < n; ++i) {
          const T q = cur[i] * r[i];
          gk[i] = -(q * q) * g[i];
          const T next = ak[i] * cur[i] + prev[i];
          prev[i] = cur[i];
          cur[i] = next;
        }
      } else {
        for (int64_t i = 0; i < n; ++i) {
          const T q = cur[i] * r[i];
          gk[i] = (q * q) * g[i];
          const T next = ak[i] * cur[i] + prev[i];
          prev[i] = cur[i];
          cur[i] = next;
        }
      }
    }
  } else {
    const T* __restrict ks = p.k_saved + (row * d) * L + l0;
    for (int64_t k = d; k >= 1; --k) {
      const T* __restrict kk = ks + (k - 1) * L;  // K_{d-k}
      T* __restrict gk = grad_a + (k - 1) * L;
      if (k & 1) {
        for (int64_t i = 0; i < n; ++i) {
          const T q = kk[i] * r[i];
          gk[i] = -(q * q) * g[i];
        }
      } else {
        for (int64_t i = 0; i < n; ++i) {
          const T q = kk[i] * r[i];
          gk[i] = (q * q) * g[i];
        }
      }
    }
    // K_d = a_1 K_{d-1} + K_{d-2}, the forward's last step, for the checks below.
    const T* __restrict k_d1 = ks;                          // K_{d-1}
    const T* __restrict k_d2 = d >= 2 ? ks + L : nullptr;  // K_{d-2}
    for (int64_t i = 0; i < n; ++i) {
      prev[i] = k_d1[i];
      cur[i] = a[i] * k_d1[i] + (k_d2 != nullptr ? k_d2[i] : T(0));
    }
  }
  // Now cur = K_d, prev = K_{d-1}: bitwise the forward's values.
  const bool overflow = any_non_finite(cur, prev, n);
  bool inside = false;
  if (p.exact) {
    int any = 0;
    for (int64_t i = 0; i < n; ++i) any |= static_cast<int>(std::abs(cur[i]) < p.eps);
    inside = any != 0;
  }
  if (!overflow && !inside) return;
  for (int64_t i = 0; i < n; ++i) {
    const bool bad = !(std::isfinite(cur[i]) && std::isfinite(prev[i]));
    const bool clamped = p.exact && std::abs(cur[i]) < p.eps;
    if (!bad && !clamped) continue;
    ladder_slow_path<T>(a + i, L, d, p.eps, p.exact, bad ? -1 : 1, nullptr, nullptr, g[i],
                        grad_a + i, scratch);
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

// Two builds of the same loops: the baseline (x86-64 SSE2 or the host's default) and, on x86, an AVX2
// clone chosen at run time from CPUID, so the binary still runs on any x86-64.
template <typename T, bool kForward>
void run_tiles_baseline(const LadderArgs<T>& p, int64_t t0, int64_t t1) {
  run_tiles<T, kForward>(p, t0, t1);
}

#if CEMFRAC_LADDER_X86_DISPATCH
template <typename T, bool kForward>
__attribute__((target("avx2"))) void run_tiles_avx2(const LadderArgs<T>& p, int64_t t0, int64_t t1) {
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
bool cpu_has_avx2() { return false; }
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
  // Grain: a task should stream at least ~256 KiB of a (64 Ki elements of float) so that waking a
  // thread (a few microseconds) stays well under its work; with fewer tiles everything runs inline.
  const int64_t per_tile = std::max<int64_t>(1, std::min(kTile, p.ladders) * p.depth);
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 16) / per_tile);
  auto body = [&](int64_t t0, int64_t t1) {
#if CEMFRAC_LADDER_X86_DISPATCH
    if (use_avx2()) {
      run_tiles_avx2<T, kForward>(p, t0, t1);
      return;
    }
#endif
    run_tiles_baseline<T, kForward>(p, t0, t1);
  };
  at::parallel_for(0, tiles, grain, body);
}

void check_ladder_tensor(const at::Tensor& t, const at::Tensor& like, int64_t dim, const char* name) {
  TORCH_INTERNAL_ASSERT(t.defined() && t.is_contiguous() && t.scalar_type() == like.scalar_type() &&
                            t.dim() == dim && t.device().is_cpu(),
                        "continuant kernel: bad tensor ", name);
}

}  // namespace

void continuant_forward_cpu(const at::Tensor& a, double eps, const at::Tensor& f, const at::Tensor& r,
                            const at::Tensor& k_saved) {
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

std::string continuant_cpu_isa() { return use_avx2() ? "avx2" : "baseline"; }

void set_continuant_cpu_isa(const std::string& isa) {
  if (isa == "auto") {
    g_isa_override.store(-1);
  } else if (isa == "baseline") {
    g_isa_override.store(0);
  } else if (isa == "avx2") {
    CEMFRAC_CHECK(cpu_has_avx2(), "ladder ISA 'avx2' requested but this CPU (or build) has no AVX2");
    g_isa_override.store(1);
  } else {
    fail("unknown ladder ISA '{}' (expected auto, baseline or avx2)", isa);
  }
}

}  // namespace cemfrac::kernels
