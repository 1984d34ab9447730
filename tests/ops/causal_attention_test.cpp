// causal_attention (cemfrac/ops/causal_attention.h) against its reference twin: the fused
// full-sequence path and the explicit path against a cache, with grouped-query heads and tied
// values, in values and (float64) gradients, plus a central-difference check of the fused backward.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/autograd.h>

#include <vector>

#include "cemfrac/ops/causal_attention.h"
#include "tests/ops/grad_check_util.h"

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

// ---- the shared-bias variant (CEM's shared D+LR diagonal)

struct BiasInputs {
  at::Tensor q, k, v, a, b, r;
};

// q (B, H, N, d_h), k and v (B, H_kv, T, d_h), a (B, N, E), b (B, T, E), r (B, T, F) in float64
// that require gradients; tied: v is k; b_is_r: r is b (CEM passes h as both).
BiasInputs bias_inputs(int64_t B, int64_t H, int64_t H_kv, int64_t N, int64_t T, int64_t E,
                       int64_t F, bool tied, bool b_is_r, at::TensorOptions o = kF64) {
  const int64_t d_h = 8;
  BiasInputs in;
  in.q = at::randn({B, H, N, d_h}, o).requires_grad_();
  in.k = at::randn({B, H_kv, T, d_h}, o).requires_grad_();
  in.v = tied ? in.k : at::randn({B, H_kv, T, d_h}, o).requires_grad_();
  in.a = at::randn({B, N, E}, o).mul(0.5).requires_grad_();
  in.b = at::randn({B, T, E}, o).requires_grad_();
  in.r = b_is_r ? in.b : at::randn({B, T, F}, o).requires_grad_();
  return in;
}

std::vector<at::Tensor> leaves(const BiasInputs& in) {
  std::vector<at::Tensor> out{in.q, in.k};
  if (!in.v.is_same(in.k)) out.push_back(in.v);
  out.push_back(in.a);
  out.push_back(in.b);
  if (!in.r.is_same(in.b)) out.push_back(in.r);
  return out;
}

TEST(CausalAttentionSharedBias, FusedEqualsTheReferenceInValuesAndGradients) {
  at::manual_seed(4);
  struct Case {
    int64_t B, H, H_kv, N, E, F;
    bool tied, b_is_r;
  };
  // One query block and several (64 rows each), grouped-query heads, tied values (CEM), r = b
  // (CEM) and r apart with another width.
  for (const Case& c : std::vector<Case>{{2, 4, 4, 9, 6, 6, true, true},
                                         {3, 4, 2, 70, 5, 7, false, false},
                                         {2, 2, 2, 130, 16, 16, true, true},
                                         {1, 3, 3, 64, 4, 3, true, false}}) {
    const BiasInputs in = bias_inputs(c.B, c.H, c.H_kv, c.N, c.N, c.E, c.F, c.tied, c.b_is_r);
    const auto y = causal_attention_shared_bias(in.q, in.k, in.v, in.a, in.b, in.r, 0);
    const auto ref = causal_attention_shared_bias_reference(in.q, in.k, in.v, in.a, in.b, in.r, 0);
    // The fused kernel ran (not the reference it is compared with).
    ASSERT_NE(y.read.grad_fn()->name().find("FusedSharedBiasAttention"), std::string::npos)
        << y.read.grad_fn()->name();
    EXPECT_TRUE(at::allclose(y.out, ref.out, 1e-12, 1e-12)) << c.N;
    EXPECT_TRUE(at::allclose(y.read, ref.read, 1e-12, 1e-12)) << c.N;
    const at::Tensor up = at::randn_like(ref.out), up_r = at::randn_like(ref.read);
    const auto gy = torch::autograd::grad({(y.out * up).sum() + (y.read * up_r).sum()}, leaves(in));
    const auto gr =
        torch::autograd::grad({(ref.out * up).sum() + (ref.read * up_r).sum()}, leaves(in));
    for (size_t i = 0; i < gy.size(); ++i)
      EXPECT_TRUE(at::allclose(gy[i], gr[i], 1e-11, 1e-11)) << "input " << i << " at N " << c.N;
  }
}

TEST(CausalAttentionSharedBias, ZeroBiasIsPlainAttentionAndReadIsTheSummedProbabilities) {
  at::manual_seed(5);
  const int64_t B = 2, H = 3, N = 80, E = 4;
  BiasInputs in = bias_inputs(B, H, H, N, N, E, N, true, false);
  const at::Tensor zero = at::zeros({B, N, E}, kF64);
  const at::Tensor eye = at::eye(N, kF64).expand({B, N, N}).contiguous();  // read = sum_k P_k
  const auto y = causal_attention_shared_bias(in.q, in.k, in.v, zero, in.b, eye, 0);
  EXPECT_TRUE(at::allclose(y.out, causal_attention(in.q, in.k, in.v, 0), 1e-13, 1e-13));
  // Rows of the summed probabilities: H each, nothing past the diagonal.
  EXPECT_TRUE(at::allclose(y.read.sum(-1), at::full({B, N}, double(H), kF64), 1e-12, 1e-12));
  EXPECT_EQ(y.read.triu(1).abs().max().item<double>(), 0.0);
}

TEST(CausalAttentionSharedBias, ContinuationAgainstACacheEqualsTheFullSequence) {
  at::manual_seed(6);
  const int64_t B = 2, H = 2, T = 12, N = 3, E = 5;
  const BiasInputs in = bias_inputs(B, H, H, T, T, E, E, true, true);
  const auto full = causal_attention_shared_bias(in.q, in.k, in.v, in.a, in.b, in.r, 0);
  const auto last = causal_attention_shared_bias(in.q.narrow(2, T - N, N), in.k, in.v,
                                                 in.a.narrow(1, T - N, N), in.b, in.r, T - N);
  EXPECT_TRUE(at::allclose(last.out, full.out.narrow(2, T - N, N), 1e-12, 1e-12));
  EXPECT_TRUE(at::allclose(last.read, full.read.narrow(1, T - N, N), 1e-12, 1e-12));
}

TEST(CausalAttentionSharedBias, Float32FusedPathIsCloseToTheReference) {
  at::manual_seed(7);
  const BiasInputs in = bias_inputs(2, 4, 4, 100, 100, 16, 16, true, true, at::TensorOptions());
  const auto y = causal_attention_shared_bias(in.q, in.k, in.v, in.a, in.b, in.r, 0);
  const auto ref = causal_attention_shared_bias_reference(in.q, in.k, in.v, in.a, in.b, in.r, 0);
  // float32: dot products of at most 100 terms of O(1) values and logits of O(10) carry errors of
  // about 100 x 2^-24 x 10 = 6e-5 at worst, so 1e-4 (absolute and relative) bounds them.
  EXPECT_TRUE(at::allclose(y.out, ref.out, 1e-4, 1e-4));
  EXPECT_TRUE(at::allclose(y.read, ref.read, 1e-4, 1e-4));
}

TEST(CausalAttentionSharedBias, FusedBackwardMatchesCentralDifferences) {
  at::manual_seed(8);
  const BiasInputs in = bias_inputs(2, 2, 1, 5, 5, 3, 2, false, false);
  const at::Tensor up = at::randn({2, 2, 5, 8}, kF64), up_r = at::randn({2, 5, 2}, kF64);
  test::expect_central_differences(
      [&](const std::vector<at::Tensor>& x) {
        const auto y = causal_attention_shared_bias(x[0], x[1], x[2], x[3], x[4], x[5], 0);
        return (y.out * up).sum() + (y.read * up_r).sum();
      },
      {in.q, in.k, in.v, in.a, in.b, in.r}, 1e-6, 1e-7);
}

// ---- the per-head diagonal (CEM's per-head bilinear D+LR)

struct DiagInputs {
  at::Tensor q, k, v, x, h, delta;
};

// q (B, H, N, d_h), k and v (B, H_kv, N, d_h), x and h (B, N, D), delta (H, D), requiring
// gradients; tied: v is k.
DiagInputs diag_inputs(int64_t B, int64_t H, int64_t H_kv, int64_t N, int64_t D, bool tied,
                       at::TensorOptions o = kF64) {
  const int64_t d_h = 8;
  DiagInputs in;
  in.q = at::randn({B, H, N, d_h}, o).requires_grad_();
  in.k = at::randn({B, H_kv, N, d_h}, o).requires_grad_();
  in.v = tied ? in.k : at::randn({B, H_kv, N, d_h}, o).requires_grad_();
  in.x = at::randn({B, N, D}, o).requires_grad_();
  in.h = at::randn({B, N, D}, o).requires_grad_();
  in.delta = at::randn({H, D}, o).mul(0.5).requires_grad_();
  return in;
}

std::vector<at::Tensor> leaves(const DiagInputs& in) {
  std::vector<at::Tensor> out{in.q, in.k};
  if (!in.v.is_same(in.k)) out.push_back(in.v);
  for (const at::Tensor& t : {in.x, in.h, in.delta}) out.push_back(t);
  return out;
}

AttentionWithRead head_diag(const DiagInputs& in) {
  return causal_attention_head_diag(in.q, in.k, in.v, in.x, in.h, in.delta, 0);
}

TEST(CausalAttentionHeadDiag, FusedEqualsTheReferenceInValuesAndGradients) {
  at::manual_seed(9);
  struct Case {
    int64_t B, H, H_kv, N, D;
    bool tied;
  };
  // One query block and several (64 rows each), grouped-query heads, tied values (CEM).
  for (const Case& c : std::vector<Case>{{2, 4, 4, 9, 6, true},
                                         {3, 4, 2, 70, 5, false},
                                         {2, 2, 2, 130, 16, true},
                                         {1, 3, 3, 64, 4, false}}) {
    const DiagInputs in = diag_inputs(c.B, c.H, c.H_kv, c.N, c.D, c.tied);
    const auto y = head_diag(in);
    const auto ref =
        causal_attention_head_diag_reference(in.q, in.k, in.v, in.x, in.h, in.delta, 0);
    ASSERT_NE(y.read.grad_fn()->name().find("FusedHeadDiagAttention"), std::string::npos)
        << y.read.grad_fn()->name();
    EXPECT_TRUE(at::allclose(y.out, ref.out, 1e-12, 1e-12)) << c.N;
    EXPECT_TRUE(at::allclose(y.read, ref.read, 1e-12, 1e-12)) << c.N;
    const at::Tensor up = at::randn_like(ref.out), up_r = at::randn_like(ref.read);
    const auto gy = torch::autograd::grad({(y.out * up).sum() + (y.read * up_r).sum()}, leaves(in));
    const auto gr =
        torch::autograd::grad({(ref.out * up).sum() + (ref.read * up_r).sum()}, leaves(in));
    for (size_t i = 0; i < gy.size(); ++i)
      EXPECT_TRUE(at::allclose(gy[i], gr[i], 1e-11, 1e-11)) << "input " << i << " at N " << c.N;
  }
}

// The per-head op is the shared-bias op run head by head with a = delta_k . x and b = r = h, and
// with delta = 0 it is plain attention with a zero read-out.
TEST(CausalAttentionHeadDiag, IsTheSharedBiasOpHeadByHead) {
  at::manual_seed(10);
  const int64_t B = 2, H = 3, N = 70, D = 5;
  const DiagInputs in = diag_inputs(B, H, H, N, D, true);
  const auto y = head_diag(in);
  at::Tensor read = at::zeros({B, N, D}, kF64);
  for (int64_t k = 0; k < H; ++k) {
    const at::Tensor kk = in.k.narrow(1, k, 1);
    const auto o = causal_attention_shared_bias(in.q.narrow(1, k, 1), kk, kk, in.x * in.delta[k],
                                                in.h, in.h, 0);
    EXPECT_TRUE(at::allclose(y.out.narrow(1, k, 1), o.out, 1e-12, 1e-12)) << k;
    read = read + in.delta[k] * o.read;
  }
  EXPECT_TRUE(at::allclose(y.read, read, 1e-12, 1e-12));
  const auto zero =
      causal_attention_head_diag(in.q, in.k, in.v, in.x, in.h, at::zeros({H, D}, kF64), 0);
  EXPECT_TRUE(at::allclose(zero.out, causal_attention(in.q, in.k, in.v, 0), 1e-13, 1e-13));
  EXPECT_EQ(zero.read.abs().max().item<double>(), 0.0);
}

TEST(CausalAttentionHeadDiag, ContinuationAgainstACacheEqualsTheFullSequence) {
  at::manual_seed(11);
  const int64_t B = 2, H = 2, T = 12, N = 3, D = 5;
  const DiagInputs in = diag_inputs(B, H, H, T, D, true);
  const auto full = head_diag(in);
  const auto last = causal_attention_head_diag(in.q.narrow(2, T - N, N), in.k, in.v,
                                               in.x.narrow(1, T - N, N), in.h, in.delta, T - N);
  EXPECT_TRUE(at::allclose(last.out, full.out.narrow(2, T - N, N), 1e-12, 1e-12));
  EXPECT_TRUE(at::allclose(last.read, full.read.narrow(1, T - N, N), 1e-12, 1e-12));
}

TEST(CausalAttentionHeadDiag, Float32FusedPathIsCloseToTheReference) {
  at::manual_seed(12);
  const DiagInputs in = diag_inputs(2, 4, 4, 100, 16, true, at::TensorOptions());
  const auto y = head_diag(in);
  const auto ref = causal_attention_head_diag_reference(in.q, in.k, in.v, in.x, in.h, in.delta, 0);
  // float32: logits are dot products of at most 8 + 16 terms of O(1) values (|logit| up to ~10),
  // outputs and read-outs sums of at most 100 probabilities times O(1) values and 4 heads; each
  // carries at most about 100 x 2^-24 x 10 = 6e-5 of rounding, so 1e-4 (absolute and relative)
  // bounds them, as for the shared-bias op.
  EXPECT_TRUE(at::allclose(y.out, ref.out, 1e-4, 1e-4));
  EXPECT_TRUE(at::allclose(y.read, ref.read, 1e-4, 1e-4));
}

TEST(CausalAttentionHeadDiag, SameBitsForOneAndTwoThreads) {
  at::manual_seed(13);
  const DiagInputs in = diag_inputs(3, 2, 2, 70, 6, true, at::TensorOptions());
  const at::Tensor up = at::randn({3, 2, 70, 8}), up_r = at::randn({3, 70, 6});
  auto run = [&](int threads) {
    at::set_num_threads(threads);
    const auto y = head_diag(in);
    auto g = torch::autograd::grad({(y.out * up).sum() + (y.read * up_r).sum()}, leaves(in));
    g.push_back(y.out.detach());
    g.push_back(y.read.detach());
    return g;
  };
  const int before = at::get_num_threads();
  const auto one = run(1), two = run(2);
  at::set_num_threads(before);
  for (size_t i = 0; i < one.size(); ++i) EXPECT_TRUE(at::equal(one[i], two[i])) << i;
}

TEST(CausalAttentionHeadDiag, FusedBackwardMatchesCentralDifferences) {
  at::manual_seed(14);
  const DiagInputs in = diag_inputs(2, 2, 1, 5, 3, false);
  const at::Tensor up = at::randn({2, 2, 5, 8}, kF64), up_r = at::randn({2, 5, 3}, kF64);
  test::expect_central_differences(
      [&](const std::vector<at::Tensor>& x) {
        const auto y = causal_attention_head_diag(x[0], x[1], x[2], x[3], x[4], x[5], 0);
        return (y.out * up).sum() + (y.read * up_r).sum();
      },
      {in.q, in.k, in.v, in.x, in.h, in.delta}, 1e-6, 1e-7);
}

}  // namespace
}  // namespace cemfrac
