// apply_rope (cemfrac/ops/rope.h) against its reference twin: values (bitwise, float64 and float32,
// contiguous, transposed and strided inputs, forward and inverse), first and second-order gradients
// against autograd through the reference, and a float64 central-difference gradient check.
#include <gtest/gtest.h>
#include <torch/autograd.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <utility>
#include <vector>

#include "cemfrac/layers/base/rope.h"  // RotaryEmbedding: the tables the layers pass in
#include "cemfrac/ops/rope.h"

namespace cemfrac {
namespace {

// The fused RoPE (one pass, layout-preserving, inverse rotation as its backward) against the
// reference made of tensor ops: bitwise forward, gradients and second derivatives, for a contiguous
// input, a transposed view (what split_heads gives) and a strided slice (what a fused QKV split
// gives).
TEST(FusedRope, EqualsReferenceWithGradients) {
  torch::manual_seed(5);
  const int64_t B = 2, H = 3, N = 7, d_h = 8;
  const auto o = torch::TensorOptions().dtype(torch::kFloat64);
  RotaryEmbedding rotary(d_h, 16, 10000.0);
  const auto [cos, sin] = rotary.tables(0, N, o);
  std::vector<std::pair<const char*, torch::Tensor>> inputs = {
      {"contiguous", torch::randn({B, H, N, d_h}, o)},
      {"transposed view", torch::randn({B, N, H, d_h}, o).transpose(1, 2)},
      {"strided slice", torch::randn({B, N, 3 * H * d_h}, o)
                            .narrow(-1, H * d_h, H * d_h)
                            .view({B, N, H, d_h})
                            .transpose(1, 2)},
  };
  for (const auto& [name, base] : inputs) {
    for (bool inverse : {false, true}) {
      SCOPED_TRACE(::testing::Message() << name << (inverse ? ", inverse" : ""));
      const torch::Tensor x = base.detach().requires_grad_();
      const torch::Tensor fused = apply_rope(x, cos, sin, inverse);
      const torch::Tensor ref = apply_rope_reference(x, cos, sin, inverse);
      EXPECT_TRUE(torch::equal(fused, ref));
      if (x.is_non_overlapping_and_dense()) {
        EXPECT_EQ(fused.strides(), x.strides());
      }
      // An output gradient whose last dimension is not contiguous (as matmul backward can produce).
      const torch::Tensor g = torch::randn({B, H, d_h, N}, o).transpose(2, 3);
      const auto gf =
          torch::autograd::grad({fused}, {x}, {g}, /*retain_graph=*/true, /*create_graph=*/true);
      const auto gr =
          torch::autograd::grad({ref}, {x}, {g}, /*retain_graph=*/true, /*create_graph=*/true);
      EXPECT_TRUE(torch::allclose(gf[0], gr[0], 0, 1e-14));
      // Second order, through the backward's own graph: the gradient of sum(y^2 w1) depends on x,
      // and the gradient of <that gradient, w2> runs the Function's backward of the backward.
      const torch::Tensor w1 = torch::randn({B, H, N, d_h}, o),
                          w2 = torch::randn({B, H, N, d_h}, o);
      const auto d1f = torch::autograd::grad({(fused * fused * w1).sum()}, {x}, {}, true, true);
      const auto d1r = torch::autograd::grad({(ref * ref * w1).sum()}, {x}, {}, true, true);
      const auto d2f = torch::autograd::grad({(d1f[0] * w2).sum()}, {x});
      const auto d2r = torch::autograd::grad({(d1r[0] * w2).sum()}, {x});
      EXPECT_TRUE(torch::allclose(d2f[0], d2r[0], 0, 1e-13));
      // A rotation followed by its inverse is the identity.
      EXPECT_TRUE(torch::allclose(apply_rope(fused, cos, sin, !inverse), x, 0, 1e-14));
    }
  }
  // Float32 takes the same fused path and matches the reference bitwise too.
  const torch::Tensor x32 = torch::randn({B, N, H, d_h}).transpose(1, 2);
  const auto [c32, s32] = rotary.tables(0, N, torch::TensorOptions().dtype(torch::kFloat32));
  EXPECT_TRUE(torch::equal(apply_rope(x32, c32, s32), apply_rope_reference(x32, c32, s32)));
}

// Central differences of <apply_rope(x), up> in float64, for the fused path (forward and inverse).
TEST(FusedRope, Float64GradientCheck) {
  torch::manual_seed(6);
  const int64_t B = 1, H = 2, N = 3, d_h = 4;
  const auto o = torch::TensorOptions().dtype(torch::kFloat64);
  RotaryEmbedding rotary(d_h, 8, 10000.0);
  const auto [cos, sin] = rotary.tables(2, N, o);  // positions 2..4: non-trivial angles
  const torch::Tensor x0 = torch::randn({B, H, N, d_h}, o), up = torch::randn({B, H, N, d_h}, o);
  for (bool inverse : {false, true}) {
    SCOPED_TRACE(inverse ? "inverse" : "forward");
    auto loss = [&](const torch::Tensor& x) {
      return (apply_rope(x, cos, sin, inverse) * up).sum();
    };
    const torch::Tensor x = x0.clone().requires_grad_();
    const torch::Tensor analytic = torch::autograd::grad({loss(x)}, {x})[0].reshape({-1});
    const double h = 1e-6;
    for (int64_t i = 0; i < x0.numel(); ++i) {
      torch::Tensor plus = x0.clone(), minus = x0.clone();
      plus.view({-1})[i] += h;
      minus.view({-1})[i] -= h;
      const double numeric = (loss(plus) - loss(minus)).item<double>() / (2 * h);
      EXPECT_NEAR(analytic[i].item<double>(), numeric, 1e-8) << i;
    }
  }
}

}  // namespace
}  // namespace cemfrac
