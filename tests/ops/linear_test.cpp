// linear (cemfrac/ops/linear.h): a one-row input goes through a matrix-vector product, every other
// input through torch::linear bit for bit. The one-row path against torch::linear: float64 values
// and gradients (x, W, b) to a few ulps, float32 within a bound derived from the two summation
// orders, every shape of one row ((in), (1, in), (1, 1, in)), with and without a bias.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/autograd.h>
#include <torch/types.h>

#include <cmath>
#include <vector>

#include "cemfrac/ops/linear.h"

namespace cemfrac {
namespace {

const std::vector<std::vector<int64_t>> kOneRow = {{96}, {1, 96}, {1, 1, 96}};

TEST(Linear, OneRowEqualsTorchLinearInFloat64WithGradients) {
  torch::manual_seed(3);
  const auto o = torch::TensorOptions().dtype(torch::kFloat64);
  for (const bool bias : {false, true}) {
    for (const auto& shape : kOneRow) {
      SCOPED_TRACE(::testing::Message() << torch::IntArrayRef(shape) << " bias " << bias);
      const torch::Tensor x = torch::randn(shape, o).requires_grad_();
      const torch::Tensor w = torch::randn({40, 96}, o).requires_grad_();
      const torch::Tensor b = bias ? torch::randn({40}, o).requires_grad_() : torch::Tensor();
      const torch::Tensor y = cemfrac::linear(x, w, b), ref = torch::linear(x, w, b);
      ASSERT_EQ(y.sizes(), ref.sizes());
      EXPECT_TRUE(torch::allclose(y, ref, 1e-13, 1e-13));
      const torch::Tensor g = torch::randn(ref.sizes(), o);
      std::vector<torch::Tensor> inputs{x, w};
      if (bias) inputs.push_back(b);
      const auto ga = torch::autograd::grad({y}, inputs, {g});
      const auto gb = torch::autograd::grad({ref}, inputs, {g});
      for (size_t i = 0; i < ga.size(); ++i)
        EXPECT_TRUE(torch::allclose(ga[i], gb[i], 1e-13, 1e-13)) << "gradient " << i;
    }
  }
}

// float32: both compute each output as a sum of in = 512 products in some order; each result is
// within in * u * sum_k |x_k w_jk| of the exact one (the standard bound for any order; u = 2^-24),
// so the two within twice that. Checked against a float64 oracle, not only against each other.
TEST(Linear, OneRowFloat32WithinTheSummationBound) {
  torch::manual_seed(4);
  const int64_t in = 512, out = 1536;
  const torch::Tensor x = torch::randn({1, 1, in}), w = torch::randn({out, in}) / 20,
                      b = torch::randn({out});
  const torch::Tensor exact =
      torch::linear(x.to(torch::kFloat64), w.to(torch::kFloat64), b.to(torch::kFloat64));
  const torch::Tensor scale =
      torch::linear(x.abs().to(torch::kFloat64), w.abs().to(torch::kFloat64)) +
      b.abs().to(torch::kFloat64);
  const double u = std::ldexp(1.0, -24);
  const torch::Tensor bound = (in + 1) * u * scale;
  const torch::Tensor y = cemfrac::linear(x, w, b).to(torch::kFloat64);
  const torch::Tensor ref = torch::linear(x, w, b).to(torch::kFloat64);
  EXPECT_TRUE(((y - exact).abs() <= bound).all().item<bool>());
  EXPECT_TRUE(((ref - exact).abs() <= bound).all().item<bool>());
  // Not vacuous: the bound is far below the outputs' size.
  EXPECT_LT(bound.max().item<double>(), 1e-3 * exact.abs().mean().item<double>());
}

// The one-row path is the matrix-vector product itself (bit for bit), not torch::linear under
// another name: the speed depends on it.
TEST(Linear, OneRowIsTheMatrixVectorProduct) {
  torch::manual_seed(6);
  const torch::Tensor x = torch::randn({1, 1, 512}), w = torch::randn({1536, 512}),
                      b = torch::randn({1536});
  const torch::Tensor v = x.reshape({512});
  EXPECT_TRUE(torch::equal(cemfrac::linear(x, w), at::mv(w, v).view({1, 1, 1536})));
  EXPECT_TRUE(torch::equal(cemfrac::linear(x, w, b), at::addmv(b, w, v).view({1, 1, 1536})));
}

TEST(Linear, SeveralRowsAreTorchLinearBitForBit) {
  torch::manual_seed(5);
  for (const std::vector<int64_t>& shape :
       std::vector<std::vector<int64_t>>{{2, 96}, {1, 3, 96}, {4, 1, 96}}) {
    const torch::Tensor x = torch::randn(shape), w = torch::randn({40, 96}), b = torch::randn({40});
    EXPECT_TRUE(torch::equal(cemfrac::linear(x, w, b), torch::linear(x, w, b)));
    EXPECT_TRUE(torch::equal(cemfrac::linear(x, w), torch::linear(x, w)));
  }
}

TEST(Linear, ShapeErrorsAreTorchLinearErrors) {
  const torch::Tensor x = torch::randn({1, 95}), w = torch::randn({40, 96});
  EXPECT_THROW(cemfrac::linear(x, w), c10::Error);
}

}  // namespace
}  // namespace cemfrac
