// The CUDA ladder kernels' per-ladder math (cemfrac/kernels/cuda/continuant_cuda_math.h), run here
// on the CPU against the CPU kernel (kernels/cpu/continuant_cpu.cpp). The .cu file only loops this
// math over threads, so this pins the GPU path's results on machines without a GPU: bitwise equal
// on the fast path (same IEEE operations in the same order, no contraction: this file is built with
// -ffp-contract=off, like the CPU kernel), and within a derived bound on the slow path (double on
// the GPU, long double on the CPU). The `cuda` test label runs the kernels themselves on a device.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "cemfrac/kernels/cuda/continuant_cuda_math.h"
#include "cemfrac/kernels/kernels.h"
#include "tests/ops/ladder_test_util.h"

namespace cemfrac::test {
namespace {

namespace cm = cemfrac::kernels::cuda::math;

struct Ladders {
  at::Tensor f, r, k, grad;  // the kernels' outputs; k: saved continuants
};

// The CUDA math over every ladder of a (R, d, L), serially, as the kernel's threads would.
template <typename T>
Ladders cuda_math(const at::Tensor& a, const at::Tensor& g, double eps, bool exact,
                  bool use_saved) {
  const int64_t R = a.size(0), d = a.size(1), L = a.size(2);
  Ladders out{at::empty({R, L}, a.options()), at::empty({R, L}, a.options()), at::empty_like(a),
              at::empty_like(a)};
  const T* ap = a.data_ptr<T>();
  for (int64_t row = 0; row < R; ++row) {
    for (int64_t l = 0; l < L; ++l) {
      const int64_t base = row * d * L + l;
      cm::forward_one<T>(ap + base, L, d, static_cast<T>(eps), out.k.data_ptr<T>() + base,
                         out.f.data_ptr<T>() + row * L + l, out.r.data_ptr<T>() + row * L + l);
      cm::backward_one<T>(ap + base, use_saved ? out.k.data_ptr<T>() + base : nullptr, L, d,
                          out.r.data_ptr<T>()[row * L + l], g.data_ptr<T>()[row * L + l],
                          static_cast<T>(eps), exact, out.grad.data_ptr<T>() + base);
    }
  }
  return out;
}

Ladders cpu_kernel(const at::Tensor& a, const at::Tensor& g, double eps, bool exact,
                   bool use_saved) {
  const int64_t R = a.size(0), L = a.size(2);
  Ladders out{at::empty({R, L}, a.options()), at::empty({R, L}, a.options()), at::empty_like(a),
              at::empty_like(a)};
  kernels::continuant_forward_cpu(a, eps, out.f, out.r, use_saved ? out.k : at::Tensor());
  kernels::continuant_backward_cpu(a, out.r, use_saved ? out.k : at::Tensor(), g, eps, exact,
                                   out.grad);
  return out;
}

// Bitwise equality, NaN equal to NaN (a NaN input gives NaN on both sides for that ladder).
void expect_same_bits(const at::Tensor& x, const at::Tensor& y, const std::string& what) {
  ASSERT_EQ(x.sizes(), y.sizes()) << what;
  const at::Tensor both_nan = x.isnan() & y.isnan();
  const at::Tensor differ = (x != y) & ~both_nan;
  const int64_t n = differ.sum().item<int64_t>();
  if (n > 0) {
    const int64_t i = differ.reshape(-1).nonzero()[0].item<int64_t>();
    ADD_FAILURE() << what << ": " << n << " elements differ; first at " << i << ": "
                  << x.reshape(-1)[i].item<double>() << " vs " << y.reshape(-1)[i].item<double>();
  }
}

template <typename T>
void compare_fast_path(at::ScalarType dtype, bool exact, bool use_saved) {
  for (int64_t d : {1, 2, 3, 5, 8, 16}) {
    for (int64_t L : {1, 7, 33}) {
      const std::string what = std::string(at::toString(dtype)) + " d=" + std::to_string(d) +
                               " L=" + std::to_string(L) + (exact ? " exact" : "") +
                               (use_saved ? " saved" : "");
      // Mixed signs (some ladders land inside the pole guard) and a zero-crossing range.
      const at::Tensor a = uniform({3, d, L}, -2.0, 2.0, dtype, 100 + d * 7 + L);
      const at::Tensor g = uniform({3, L}, -1.0, 1.0, dtype, 200 + d + L);
      const Ladders gpu = cuda_math<T>(a, g, 0.01, exact, use_saved);
      const Ladders cpu = cpu_kernel(a, g, 0.01, exact, use_saved);
      expect_same_bits(gpu.f, cpu.f, what + " f");
      expect_same_bits(gpu.r, cpu.r, what + " r");
      if (use_saved) expect_same_bits(gpu.k, cpu.k, what + " k_saved");
      if (!exact) {
        expect_same_bits(gpu.grad, cpu.grad, what + " grad");
        continue;
      }
      // Exact mode: a ladder inside the clamp (|r| = 1/eps) takes the slow path on both sides, in
      // double here and long double on the CPU; every other ladder is the fast path, bit for bit.
      const double r_clamped =
          dtype == at::kFloat ? double(1.0f / static_cast<float>(0.01)) : 1.0 / 0.01;
      const at::Tensor clamped = cpu.r.abs().to(at::kDouble) == r_clamped;  // (R, L)
      const at::Tensor fast = (~clamped).unsqueeze(1).expand_as(a);
      expect_same_bits(gpu.grad.masked_select(fast), cpu.grad.masked_select(fast), what + " grad");
      // Slow-path bound: grad a_k = g r H_k T_k with head and tail continuants H_k, T_k, each a sum
      // of products of a's that double evaluates with at most 2 roundings per step, so the absolute
      // error is at most (4d + 4) 2^-53 |g r| M, where M = K(|a_1|, ..., |a_d|) bounds every
      // H_k T_k (continuants of non-negative entries are super-multiplicative); plus one rounding
      // of T on each side.
      const at::Tensor M =
          continuant_tails_reference(a.abs().to(at::kDouble)).select(-2, d);  // (R, L)
      const at::Tensor bound = ((4 * d + 4) * std::ldexp(1.0, -53) *
                                (g.to(at::kDouble) * cpu.r.to(at::kDouble)).abs() * M)
                                   .unsqueeze(1)
                                   .expand_as(a);
      const double unit = dtype == at::kFloat ? std::numeric_limits<float>::epsilon()
                                              : std::numeric_limits<double>::epsilon();
      const at::Tensor err = (gpu.grad.to(at::kDouble) - cpu.grad.to(at::kDouble)).abs();
      const at::Tensor allowed = bound + unit * cpu.grad.to(at::kDouble).abs();
      EXPECT_TRUE((err <= allowed).all().item<bool>())
          << what << " slow-path grad: max excess " << (err - allowed).max().item<double>();
    }
  }
}

TEST(ContinuantCudaMath, FastPathIsBitwiseTheCpuKernel) {
  for (bool saved : {false, true}) {
    compare_fast_path<float>(at::kFloat, false, saved);
    compare_fast_path<double>(at::kDouble, false, saved);
  }
}

TEST(ContinuantCudaMath, ExactModeMatchesTheCpuKernel) {
  compare_fast_path<float>(at::kFloat, true, false);
  compare_fast_path<double>(at::kDouble, true, false);
}

// Ladders whose continuants overflow the dtype take the slow path on both sides: a_1 moderate and
// a_2..a_d huge, so K_d ~ a_1 a_2 ... a_d overflows while f ~ 1/a_1 and grad a_1 = -(K_{d-1}/K_d)^2
// ~ 1/a_1^2 stay representable (the deeper gradients underflow to 0 on both sides). Error bound:
// with all a_k > 0 no continuant cancels, so each scaled multiply-add of the GPU's double path adds
// at most 2 roundings of 2^-53 relative; K_d and K_{d-1} carry at most 2d, f and grad (products and
// a square of them) at most 4d + 2. Rounding to T adds one rounding of T on each side, which may
// round two nearby values to neighbouring representable ones: 2 eps_T.
template <typename T>
void check_slow_path(at::ScalarType dtype, double a1_lo, double a1_hi, double rest_lo,
                     double rest_hi) {
  for (int64_t d : {2, 3, 6}) {
    at::Tensor a = uniform({2, d, 9}, rest_lo, rest_hi, dtype, 300 + d);
    a.select(1, 0).copy_(uniform({2, 9}, a1_lo, a1_hi, dtype, 350 + d));
    const at::Tensor g = uniform({2, 9}, 0.5, 1.0, dtype, 400 + d);
    const Ladders gpu = cuda_math<T>(a, g, 0.01, false, false);
    const Ladders cpu = cpu_kernel(a, g, 0.01, false, false);
    const double rel = 2 * std::numeric_limits<T>::epsilon() + (4 * d + 2) * std::ldexp(1.0, -53);
    const std::string what = std::string(at::toString(dtype)) + " d=" + std::to_string(d);
    expect_close(gpu.f, cpu.f, rel, 0, what + " f");
    expect_close(gpu.grad, cpu.grad, rel, 0, what + " grad");
    // Not vacuous: every f and every grad a_1 is a finite non-zero value.
    EXPECT_TRUE((cpu.f.abs() > 0).all().item<bool>()) << what;
    EXPECT_TRUE((cpu.grad.select(1, 0).abs() > 0).all().item<bool>()) << what;
    EXPECT_TRUE(gpu.f.isfinite().all().item<bool>()) << what;
  }
}

TEST(ContinuantCudaMath, SlowPathWithinDerivedBound) {
  check_slow_path<float>(at::kFloat, 1e8, 1e10, 1e29, 1e31);
  check_slow_path<double>(at::kDouble, 1e90, 1e100, 1e250, 1e300);
}

TEST(ContinuantCudaMath, NonFiniteInputsStayInTheirLadder) {
  at::Tensor a = uniform({1, 4, 6}, 0.5, 1.5, at::kDouble, 500);
  a[0][2][1] = std::numeric_limits<double>::quiet_NaN();
  a[0][0][4] = std::numeric_limits<double>::infinity();
  const at::Tensor g = uniform({1, 6}, -1, 1, at::kDouble, 501);
  const Ladders gpu = cuda_math<double>(a, g, 0.01, false, false);
  const Ladders cpu = cpu_kernel(a, g, 0.01, false, false);
  expect_same_bits(gpu.f, cpu.f, "f");
  expect_same_bits(gpu.grad, cpu.grad, "grad");
  EXPECT_TRUE(std::isnan(gpu.f[0][1].item<double>()));
  for (int64_t l : {0, 2, 3, 5}) EXPECT_TRUE(std::isfinite(gpu.f[0][l].item<double>())) << l;
}

}  // namespace
}  // namespace cemfrac::test
