// linear (cemfrac/ops/linear.h): a one-row input goes through a matrix-vector product, 2 to 8 rows
// without a gradient through the skinny kernel, every other input through torch::linear bit for
// bit. Each path against torch::linear: float64 values (and, for one row, gradients) to a few ulps,
// float32 within the summation bound against a float64 oracle, with and without a bias.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <gtest/gtest.h>
#include <torch/autograd.h>
#include <torch/types.h>

#include <cmath>
#include <vector>

#include "cemfrac/kernels/kernels.h"
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

// 2 to 8 rows without a gradient (decoding a small batch) take the skinny kernel: against
// torch::linear in float64 to a few ulps, in float32 within the summation bound against a float64
// oracle (in = 515: the 8-wide loop and a tail), with and without a bias, at thread counts 1 and 2
// with the same bits.
TEST(Linear, FewRowsWithoutGradientTakeTheSkinnyKernel) {
  torch::manual_seed(7);
  torch::NoGradGuard no_grad;
  const int64_t in = 515, out = 300;
  const double u = std::ldexp(1.0, -24);
  for (int64_t rows = 2; rows <= 8; ++rows) {
    SCOPED_TRACE(::testing::Message() << rows << " rows");
    const torch::Tensor x64 = torch::randn({rows, 1, in}, torch::kFloat64),
                        w64 = torch::randn({out, in}, torch::kFloat64) / 20,
                        b64 = torch::randn({out}, torch::kFloat64);
    EXPECT_TRUE(torch::allclose(cemfrac::linear(x64, w64, b64), torch::linear(x64, w64, b64), 1e-13,
                                1e-13));
    EXPECT_TRUE(torch::allclose(cemfrac::linear(x64, w64), torch::linear(x64, w64), 1e-13, 1e-13));
    const torch::Tensor x = x64.to(torch::kFloat32), w = w64.to(torch::kFloat32),
                        b = b64.to(torch::kFloat32);
    const torch::Tensor exact =
        torch::linear(x.to(torch::kFloat64), w.to(torch::kFloat64), b.to(torch::kFloat64));
    const torch::Tensor bound =
        (in + 1) * u *
        (torch::linear(x.abs().to(torch::kFloat64), w.abs().to(torch::kFloat64)) +
         b.abs().to(torch::kFloat64));
    const torch::Tensor y = cemfrac::linear(x, w, b);
    ASSERT_EQ(y.sizes(), torch::IntArrayRef({rows, 1, out}));
    EXPECT_TRUE(((y.to(torch::kFloat64) - exact).abs() <= bound).all().item<bool>());
    const int threads = at::get_num_threads();
    at::set_num_threads(1);
    const torch::Tensor y1 = cemfrac::linear(x, w, b);
    at::set_num_threads(2);
    const torch::Tensor y2 = cemfrac::linear(x, w, b);
    at::set_num_threads(threads);
    EXPECT_TRUE(torch::equal(y1, y2));
    EXPECT_TRUE(torch::equal(y1, y));
    // The path taken is the kernel itself, bit for bit (the speed depends on it).
    const torch::Tensor direct = torch::empty({rows, out});
    kernels::skinny_linear_cpu(x.reshape({rows, in}), w, b, direct);
    EXPECT_TRUE(torch::equal(y, direct.view({rows, 1, out})));
  }
}

// With a gradient needed, or beyond 8 rows, several rows are torch::linear bit for bit (and
// differentiable as it is).
TEST(Linear, SeveralRowsWithGradientOrManyRowsAreTorchLinearBitForBit) {
  torch::manual_seed(5);
  for (const std::vector<int64_t>& shape :
       std::vector<std::vector<int64_t>>{{2, 96}, {1, 3, 96}, {4, 1, 96}, {9, 96}, {3, 5, 96}}) {
    const torch::Tensor w = torch::randn({40, 96}).requires_grad_(), b = torch::randn({40});
    const torch::Tensor x = torch::randn(shape);
    EXPECT_TRUE(torch::equal(cemfrac::linear(x, w, b), torch::linear(x, w, b)));
    EXPECT_TRUE(torch::equal(cemfrac::linear(x, w), torch::linear(x, w)));
    const int64_t rows = x.numel() / 96;
    if (rows > 8) {
      torch::NoGradGuard no_grad;
      EXPECT_TRUE(torch::equal(cemfrac::linear(x, w, b), torch::linear(x, w, b)));
    }
  }
}

TEST(Linear, ShapeErrorsAreTorchLinearErrors) {
  const torch::Tensor x = torch::randn({1, 95}), w = torch::randn({40, 96});
  EXPECT_THROW(cemfrac::linear(x, w), c10::Error);
}

}  // namespace
}  // namespace cemfrac
