// silu_mul (cemfrac/ops/silu_mul.h) against its reference twin at::silu(a) * b: float64 values and
// first (through the kernel) and second-order (through the create_graph backward) gradients, lengths
// with and without a tail of the 8-wide float32 loop; float32 against a float64 oracle within a bound
// derived from the rounding steps; a float64 central-difference check.
#include <ATen/Parallel.h>
#include <gtest/gtest.h>
#include <torch/autograd.h>
#include <torch/types.h>

#include <cmath>
#include <vector>

#include "cemfrac/ops/silu_mul.h"
#include "tests/ops/grad_check_util.h"

namespace cemfrac {
namespace {

const std::vector<std::vector<int64_t>> kShapes = {{2, 3, 8}, {5, 7}, {1, 1}, {4, 16417}};

TEST(FusedSiluMul, EqualsReferenceInFloat64WithGradients) {
  torch::manual_seed(21);
  const auto o = torch::TensorOptions().dtype(torch::kFloat64);
  for (const auto& shape : kShapes) {
    SCOPED_TRACE(::testing::Message() << torch::IntArrayRef(shape));
    const torch::Tensor a = (3 * torch::randn(shape, o)).requires_grad_();
    const torch::Tensor b = torch::randn(shape, o).requires_grad_();
    const torch::Tensor fused = silu_mul(a, b), ref = silu_mul_reference(a, b);
    EXPECT_TRUE(torch::allclose(fused, ref, 1e-14, 1e-15));
    const torch::Tensor g = torch::randn(shape, o);
    const auto kf = torch::autograd::grad({fused}, {a, b}, {g}, /*retain_graph=*/true);
    const auto gr = torch::autograd::grad({ref}, {a, b}, {g}, true, /*create_graph=*/true);
    EXPECT_TRUE(torch::allclose(kf[0], gr[0], 1e-13, 1e-14));
    EXPECT_TRUE(torch::allclose(kf[1], gr[1], 1e-13, 1e-14));
    const auto gf = torch::autograd::grad({fused}, {a, b}, {g}, true, /*create_graph=*/true);
    const torch::Tensor v = torch::randn(shape, o);
    const auto d2f = torch::autograd::grad({(gf[0] * v).sum() + gf[1].square().sum()}, {a, b});
    const auto d2r = torch::autograd::grad({(gr[0] * v).sum() + gr[1].square().sum()}, {a, b});
    EXPECT_TRUE(torch::allclose(d2f[0], d2r[0], 1e-12, 1e-13));
    EXPECT_TRUE(torch::allclose(d2f[1], d2r[1], 1e-12, 1e-13));
  }
}

// Float32 against the float64 oracle, elementwise, u = 2^-24. exp is about 1 ulp (vec_exp.h; the
// scalar path's std::exp is within 1 ulp too): e = exp(-a) carries 2 u, 1 + e and the division
// each 1 u, so s carries 4 u (the relative error of 1 + e is at most that of e); a s, then times b:
// |y - y64| <= 6 u |y|, 8 u asserted. db = g (a s): 6 u, 8 u asserted. da = (g b) (s (1 + a (1 - s))):
// 1 - s can cancel, so its error is 5 u of s, and the whole is bounded by
// 8 u |g b| s (1 + |a| (|1 - s| + s)) + 8 u |da|, which is asserted.
TEST(FusedSiluMul, Float32WithinDerivedBoundOfFloat64) {
  torch::manual_seed(22);
  const double u = std::ldexp(1.0, -24);
  for (const auto& shape : kShapes) {
    SCOPED_TRACE(::testing::Message() << torch::IntArrayRef(shape));
    const torch::Tensor a = (4 * torch::randn(shape)).requires_grad_();
    const torch::Tensor b = torch::randn(shape).requires_grad_();
    const torch::Tensor g = torch::randn(shape);
    const torch::Tensor y = silu_mul(a, b);
    const auto grads = torch::autograd::grad({y}, {a, b}, {g});

    const torch::Tensor a64 = a.detach().to(torch::kFloat64).requires_grad_();
    const torch::Tensor b64 = b.detach().to(torch::kFloat64).requires_grad_();
    const torch::Tensor g64 = g.to(torch::kFloat64);
    const torch::Tensor y64 = silu_mul_reference(a64, b64);
    const auto grads64 = torch::autograd::grad({y64}, {a64, b64}, {g64});
    auto within = [](const torch::Tensor& got, const torch::Tensor& want,
                     const torch::Tensor& bound) {
      return (got.to(torch::kFloat64) - want).abs().le(bound).all().item<bool>();
    };
    EXPECT_TRUE(within(y, y64, 8 * u * y64.abs()));
    EXPECT_TRUE(within(grads[1], grads64[1], 8 * u * grads64[1].abs()));
    const torch::Tensor s = torch::sigmoid(a64.detach());
    const torch::Tensor da_bound =
        8 * u * (g64 * b64.detach()).abs() * s * (1 + a64.detach().abs() * ((1 - s).abs() + s)) +
        8 * u * grads64[0].abs();
    EXPECT_TRUE(within(grads[0], grads64[0], da_bound));
  }
}

// Threads get whole groups of 8 elements, so one thread and two give the same bits (a length that
// is no multiple of 8, long enough to be split).
TEST(FusedSiluMul, SameBitsForAnyThreadCount) {
  torch::manual_seed(24);
  const int before = at::get_num_threads();
  const torch::Tensor a0 = 3 * torch::randn({100003}), b0 = torch::randn({100003});
  const torch::Tensor g = torch::randn({100003});
  std::vector<torch::Tensor> out;
  for (int threads : {1, 2}) {
    at::set_num_threads(threads);
    const torch::Tensor a = a0.clone().requires_grad_(), b = b0.clone().requires_grad_();
    const torch::Tensor y = silu_mul(a, b);
    const auto grads = torch::autograd::grad({y}, {a, b}, {g});
    out.push_back(torch::cat({y.detach(), grads[0], grads[1]}));
  }
  at::set_num_threads(before);
  EXPECT_TRUE(torch::equal(out[0], out[1]));
}

// Central differences of <silu_mul(a, b), up> in float64, for both inputs.
TEST(FusedSiluMul, Float64GradientCheck) {
  torch::manual_seed(23);
  const auto o = torch::TensorOptions().dtype(torch::kFloat64);
  const torch::Tensor a0 = 2 * torch::randn({3, 5}, o), b0 = torch::randn({3, 5}, o);
  const torch::Tensor up = torch::randn({3, 5}, o);
  test::expect_central_differences(
      [&](const std::vector<torch::Tensor>& in) { return (silu_mul(in[0], in[1]) * up).sum(); },
      {a0, b0});
}

}  // namespace
}  // namespace cemfrac
