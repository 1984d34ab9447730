// symmetric_gram (cemfrac/ops/symmetric_gram.h) against its reference twin W W^T: values in float32
// and float64, the gradient against autograd through the reference, and a float64 gradient check.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/autograd.h>

#include "cemfrac/ops/symmetric_gram.h"

namespace cemfrac {
namespace {

TEST(SymmetricGram, EqualsTheReferenceAndIsSymmetric) {
  at::manual_seed(1);
  for (auto dtype : {at::kFloat, at::kDouble}) {
    const at::Tensor w = at::randn({24, 40}, at::TensorOptions().dtype(dtype));
    const at::Tensor g = symmetric_gram(w), r = symmetric_gram_reference(w);
    const double tol = dtype == at::kDouble ? 1e-12 : 1e-5;
    EXPECT_TRUE(at::allclose(g, r, tol, tol)) << at::toString(dtype);
    EXPECT_TRUE(at::equal(g, g.t())) << "mirrored exactly";
  }
}

TEST(SymmetricGram, GradientEqualsAutogradThroughTheReference) {
  at::manual_seed(2);
  const at::Tensor w = at::randn({12, 20}, at::TensorOptions().dtype(at::kDouble)).requires_grad_();
  const at::Tensor up =
      at::randn({12, 12}, at::TensorOptions().dtype(at::kDouble));  // not symmetric
  const at::Tensor fused = torch::autograd::grad({(symmetric_gram(w) * up).sum()}, {w})[0];
  const at::Tensor reference =
      torch::autograd::grad({(symmetric_gram_reference(w) * up).sum()}, {w})[0];
  EXPECT_TRUE(at::allclose(fused, reference, 1e-12, 1e-12));
}

TEST(SymmetricGram, Float64GradientCheck) {
  at::manual_seed(3);
  const at::Tensor w = at::randn({5, 7}, at::TensorOptions().dtype(at::kDouble));
  const at::Tensor up = at::randn({5, 5}, at::TensorOptions().dtype(at::kDouble));
  at::Tensor wg = w.clone().requires_grad_();
  const at::Tensor analytic = torch::autograd::grad({(symmetric_gram(wg) * up).sum()}, {wg})[0];
  const double h = 1e-6;
  for (int64_t i = 0; i < w.size(0); ++i) {
    for (int64_t j = 0; j < w.size(1); ++j) {
      at::Tensor plus = w.clone(), minus = w.clone();
      plus[i][j] += h;
      minus[i][j] -= h;
      const double numeric =
          ((symmetric_gram(plus) * up).sum() - (symmetric_gram(minus) * up).sum()).item<double>() /
          (2 * h);
      EXPECT_NEAR(analytic[i][j].item<double>(), numeric, 1e-7) << i << "," << j;
    }
  }
}

}  // namespace
}  // namespace cemfrac
