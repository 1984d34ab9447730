// rms_norm (cemfrac/ops/rms_norm.h) against its reference twin: float64 values and first and
// second-order gradients (row widths with and without a tail of the 4-wide sums, more rows than one
// block of the weight gradient, a non-contiguous input), a float32 bound derived from the rounding
// steps against a float64 oracle, the weight gradient the same for any thread count, and a float64
// central-difference check.
#include <ATen/Parallel.h>
#include <gtest/gtest.h>
#include <torch/autograd.h>
#include <torch/types.h>

#include <cmath>
#include <utility>
#include <vector>

#include "cemfrac/ops/rms_norm.h"
#include "tests/ops/grad_check_util.h"

namespace cemfrac {
namespace {

constexpr double kEps = 1e-5;

std::vector<std::pair<const char*, torch::Tensor>> inputs(torch::ScalarType dtype) {
  const auto o = torch::TensorOptions().dtype(dtype);
  return {
      {"(2, 5, 7): D with a tail", torch::randn({2, 5, 7}, o)},
      {"(100, 64): four blocks of rows, the last partial", torch::randn({100, 64}, o) * 3},
      {"transposed (3, 8, 12) view", torch::randn({3, 12, 8}, o).transpose(1, 2)},
      {"one row", torch::randn({1, 33}, o)},
  };
}

TEST(FusedRmsNorm, EqualsReferenceInFloat64WithGradients) {
  torch::manual_seed(11);
  const auto o = torch::TensorOptions().dtype(torch::kFloat64);
  for (const auto& [name, base] : inputs(torch::kFloat64)) {
    SCOPED_TRACE(name);
    const int64_t D = base.size(-1);
    const torch::Tensor x = base.detach().requires_grad_();
    const torch::Tensor w = (1 + 0.3 * torch::randn({D}, o)).requires_grad_();
    const torch::Tensor fused = rms_norm(x, w, kEps);
    const torch::Tensor ref = rms_norm_reference(x, w, kEps);
    EXPECT_TRUE(torch::allclose(fused, ref, 1e-13, 1e-14));
    const torch::Tensor g = torch::randn(base.sizes(), o);
    // First order through the backward kernel (no create_graph).
    const auto kf = torch::autograd::grad({fused}, {x, w}, {g}, /*retain_graph=*/true);
    const auto gr = torch::autograd::grad({ref}, {x, w}, {g}, true, /*create_graph=*/true);
    EXPECT_TRUE(torch::allclose(kf[0], gr[0], 1e-12, 1e-13));
    EXPECT_TRUE(torch::allclose(kf[1], gr[1], 1e-12, 1e-13));
    // Under create_graph the backward is built from tensor ops: the same values, and second
    // derivatives through it: <d<y, g>/dx, v> + |d<y, g>/dw|^2 differentiated again.
    const auto gf = torch::autograd::grad({fused}, {x, w}, {g}, true, /*create_graph=*/true);
    EXPECT_TRUE(torch::allclose(gf[0], gr[0], 1e-12, 1e-13));
    EXPECT_TRUE(torch::allclose(gf[1], gr[1], 1e-12, 1e-13));
    const torch::Tensor v = torch::randn(base.sizes(), o);
    const auto d2f = torch::autograd::grad({(gf[0] * v).sum() + gf[1].square().sum()}, {x, w});
    const auto d2r = torch::autograd::grad({(gr[0] * v).sum() + gr[1].square().sum()}, {x, w});
    EXPECT_TRUE(torch::allclose(d2f[0], d2r[0], 1e-11, 1e-12));
    EXPECT_TRUE(torch::allclose(d2f[1], d2r[1], 1e-11, 1e-12));
  }
}

// Float32 against the float64 oracle, elementwise. With u = 2^-24: the fused forward rounds
// r = 1/sqrt(ss/D + eps) once from a float64 value (1 u), then x r (1 u) and (x r) w (1 u), so
// |y - y64| <= 3 u |y| up to second order; 4 u |y| is asserted. The backward's gx_i = r (a_i - b_i c)
// with a = gy w, b = x r and c = mean(a b): r, a_i, b_i, the two products and the difference each
// add at most 1 u of their terms' size, and c (a float64 dot of rounded a_i) carries at most 2 u of
// mean |a b| (an absolute error: the dot may cancel), so |gx_i - gx64_i| <= 8 u r (|a_i| +
// |b_i| mean|a b|);
// gw sums float64 products of float32-rounded xh (1 u each, 2 u with the product): 3 u sum |gy xh|.
TEST(FusedRmsNorm, Float32WithinDerivedBoundOfFloat64) {
  torch::manual_seed(12);
  const double u = std::ldexp(1.0, -24);
  for (const auto& [name, base] : inputs(torch::kFloat32)) {
    SCOPED_TRACE(name);
    const int64_t D = base.size(-1);
    const torch::Tensor x = base.detach().requires_grad_();
    const torch::Tensor w = (1 + 0.3 * torch::randn({D})).requires_grad_();
    const torch::Tensor g = torch::randn(base.sizes());
    const torch::Tensor y = rms_norm(x, w, kEps);
    const auto grads = torch::autograd::grad({y}, {x, w}, {g});

    const torch::Tensor x64 = x.detach().to(torch::kFloat64).requires_grad_();
    const torch::Tensor w64 = w.detach().to(torch::kFloat64).requires_grad_();
    const torch::Tensor g64 = g.to(torch::kFloat64);
    const torch::Tensor y64 = rms_norm_reference(x64, w64, kEps);
    const auto grads64 = torch::autograd::grad({y64}, {x64, w64}, {g64});

    EXPECT_TRUE((y.to(torch::kFloat64) - y64).abs().le(4 * u * y64.abs()).all().item<bool>());
    const torch::Tensor r = torch::rsqrt(x64.detach().square().mean(-1, true) + kEps);
    const torch::Tensor a = g64 * w64.detach(), b = x64.detach() * r;
    const torch::Tensor c_abs = (a * b).abs().mean(-1, true);
    const torch::Tensor gx_bound = 8 * u * r * (a.abs() + b.abs() * c_abs);
    EXPECT_TRUE(
        (grads[0].to(torch::kFloat64) - grads64[0]).abs().le(gx_bound).all().item<bool>());
    const torch::Tensor gw_bound = 3 * u * (g64 * b).abs().reshape({-1, D}).sum(0);
    EXPECT_TRUE(
        (grads[1].to(torch::kFloat64) - grads64[1]).abs().le(gw_bound).all().item<bool>());
  }
}

// The weight gradient is summed over fixed blocks of rows, so one thread and two give the same bits.
TEST(FusedRmsNorm, WeightGradientIndependentOfThreadCount) {
  torch::manual_seed(13);
  const int before = at::get_num_threads();
  const torch::Tensor x0 = torch::randn({300, 48});
  const torch::Tensor w0 = 1 + 0.3 * torch::randn({48}), g = torch::randn({300, 48});
  std::vector<torch::Tensor> gw;
  for (int threads : {1, 2}) {
    at::set_num_threads(threads);
    const torch::Tensor x = x0.clone().requires_grad_(), w = w0.clone().requires_grad_();
    gw.push_back(torch::autograd::grad({rms_norm(x, w, kEps)}, {w}, {g})[0]);
  }
  at::set_num_threads(before);
  EXPECT_TRUE(torch::equal(gw[0], gw[1]));
}

// Central differences of <rms_norm(x, w), up> in float64, for x and the weight.
TEST(FusedRmsNorm, Float64GradientCheck) {
  torch::manual_seed(14);
  const auto o = torch::TensorOptions().dtype(torch::kFloat64);
  const torch::Tensor x0 = torch::randn({3, 5}, o), w0 = 1 + 0.3 * torch::randn({5}, o);
  const torch::Tensor up = torch::randn({3, 5}, o);
  test::expect_central_differences(
      [&](const std::vector<torch::Tensor>& in) { return (rms_norm(in[0], in[1], kEps) * up).sum(); },
      {x0, w0});
}

}  // namespace
}  // namespace cemfrac
