// causal_attention (cemfrac/ops/causal_attention.h) against its reference twin: the fused
// full-sequence path and the explicit path against a cache, with grouped-query heads and tied
// values, in values and (float64) gradients, plus a central-difference check of the fused backward.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/autograd.h>

#include <vector>

#include "cemfrac/ops/causal_attention.h"

namespace cemfrac {
namespace {

const auto kF64 = at::TensorOptions().dtype(at::kDouble);

struct Shape {
  int64_t H, H_kv, N, T;  // T = offset + N
  bool tied;
};

std::vector<Shape> shapes() {
  return {{4, 4, 70, 70, false},
          {4, 2, 9, 9, false},
          {2, 2, 130, 130, true},  // full: the fused kernel
          {4, 2, 3, 11, false},
          {2, 2, 1, 8, true}};  // against a cache
}

TEST(CausalAttention, EqualsTheReferenceInValuesAndGradients) {
  at::manual_seed(1);
  for (const Shape& s : shapes()) {
    const int64_t B = 2, d_h = 8, offset = s.T - s.N;
    const at::Tensor q = at::randn({B, s.H, s.N, d_h}, kF64).requires_grad_();
    const at::Tensor k = at::randn({B, s.H_kv, s.T, d_h}, kF64).requires_grad_();
    const at::Tensor v = s.tied ? k : at::randn({B, s.H_kv, s.T, d_h}, kF64).requires_grad_();
    const at::Tensor up = at::randn({B, s.H, s.N, d_h}, kF64);
    const at::Tensor y = causal_attention(q, k, v, offset),
                     r = causal_attention_reference(q, k, v, offset);
    EXPECT_TRUE(at::allclose(y, r, 1e-12, 1e-12)) << s.N << " " << s.T;
    std::vector<at::Tensor> inputs{q, k};
    if (!s.tied) inputs.push_back(v);
    const auto gy = torch::autograd::grad({(y * up).sum()}, inputs);
    const auto gr = torch::autograd::grad({(r * up).sum()}, inputs);
    for (size_t i = 0; i < inputs.size(); ++i)
      EXPECT_TRUE(at::allclose(gy[i], gr[i], 1e-11, 1e-11))
          << "input " << i << " at " << s.N << " " << s.T;
  }
}

TEST(CausalAttention, Float32FusedPathIsCloseToTheReference) {
  at::manual_seed(2);
  const at::Tensor q = at::randn({2, 4, 100, 16}), k = at::randn({2, 2, 100, 16}),
                   v = at::randn({2, 2, 100, 16});
  EXPECT_TRUE(at::allclose(causal_attention(q, k, v, 0), causal_attention_reference(q, k, v, 0),
                           1e-5, 1e-5));
}

TEST(CausalAttention, FusedBackwardMatchesCentralDifferences) {
  at::manual_seed(3);
  const int64_t B = 1, H = 2, N = 5, d_h = 3;
  const at::Tensor q0 = at::randn({B, H, N, d_h}, kF64), k0 = at::randn({B, 1, N, d_h}, kF64);
  const at::Tensor v0 = at::randn({B, 1, N, d_h}, kF64), up = at::randn({B, H, N, d_h}, kF64);
  auto loss = [&](const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
    return (causal_attention(q, k, v, 0) * up).sum();
  };
  const at::Tensor q = q0.clone().requires_grad_(), k = k0.clone().requires_grad_(),
                   v = v0.clone().requires_grad_();
  const auto g = torch::autograd::grad({loss(q, k, v)}, {q, k, v});
  const double h = 1e-6;
  const std::vector<at::Tensor> base{q0, k0, v0};
  for (size_t which = 0; which < 3; ++which) {
    const at::Tensor flat = base[which].reshape({-1});
    for (int64_t i = 0; i < flat.numel(); ++i) {
      std::vector<at::Tensor> plus{q0.clone(), k0.clone(), v0.clone()},
          minus{q0.clone(), k0.clone(), v0.clone()};
      plus[which].view({-1})[i] += h;
      minus[which].view({-1})[i] -= h;
      const double numeric =
          (loss(plus[0], plus[1], plus[2]) - loss(minus[0], minus[1], minus[2])).item<double>() /
          (2 * h);
      EXPECT_NEAR(g[which].reshape({-1})[i].item<double>(), numeric, 1e-7) << which << " " << i;
    }
  }
}

}  // namespace
}  // namespace cemfrac
