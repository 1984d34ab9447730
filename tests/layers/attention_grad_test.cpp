// The fused causal attention (offset 0, the training path of causal_attention) against autograd
// through a plain ATen formulation: outputs and the gradients of q, k and v, for multi-head,
// grouped-query and multi-query shapes, in float64 and float32, with 1 and 2 threads, in one and in
// several query blocks. (The fused RoPE against its reference: tests/ops/rope_test.cpp.)
#include <gtest/gtest.h>
#include <torch/autograd.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <cmath>
#include <limits>

#include "cemfrac/core/blas.h"
#include "cemfrac/layers/base/mha.h"

namespace cemfrac {
namespace {

torch::Tensor plain_attention(const torch::Tensor& q, const torch::Tensor& k,
                              const torch::Tensor& v) {
  const int64_t H = q.size(1), N = q.size(2), d_h = q.size(3), group = H / k.size(1);
  const torch::Tensor kk = k.repeat_interleave(group, 1), vv = v.repeat_interleave(group, 1);
  const torch::Tensor scores = torch::matmul(q, kk.transpose(-2, -1)) / std::sqrt(double(d_h));
  const torch::Tensor hidden =
      torch::ones({N, N}, torch::TensorOptions().dtype(torch::kBool)).triu(1);
  return torch::matmul(
      torch::softmax(scores.masked_fill(hidden, -std::numeric_limits<double>::infinity()), -1), vv);
}

// N = 37 fits one block of queries; N = 150 takes three (64, 64, 22 rows).
void check(torch::ScalarType dtype, int64_t h_kv, int threads, double tol, int64_t N) {
  SCOPED_TRACE(::testing::Message()
               << c10::toString(dtype) << " H_kv=" << h_kv << " threads=" << threads << " N=" << N);
  set_threads(threads);
  torch::manual_seed(3);
  const auto o = torch::TensorOptions().dtype(dtype);
  const int64_t B = 3, H = 4, d_h = 16;
  torch::Tensor q = torch::randn({B, H, N, d_h}, o).requires_grad_();
  torch::Tensor k = torch::randn({B, h_kv, N, d_h}, o).requires_grad_();
  torch::Tensor v = torch::randn({B, h_kv, N, d_h}, o).requires_grad_();
  const torch::Tensor g = torch::randn({B, H, N, d_h}, o);
  const torch::Tensor fused = causal_attention(q, k, v, 0);
  const torch::Tensor plain = plain_attention(q, k, v);
  ASSERT_EQ(fused.sizes(), plain.sizes());
  EXPECT_TRUE(torch::allclose(fused, plain, tol, tol));
  {
    // Leave NaN-filled blocks of the gradients' sizes on the heap: a gradient block that the
    // backward accumulates into without writing it first would pick one up.
    std::vector<torch::Tensor> poison;
    for (int i = 0; i < 4; ++i) poison.push_back(torch::full({B, H, N, d_h}, std::nan(""), o));
  }
  const auto g_fused = torch::autograd::grad({fused}, {q, k, v}, {g});
  const auto g_plain = torch::autograd::grad({plain}, {q, k, v}, {g});
  const char* names[] = {"dq", "dk", "dv"};
  for (int i = 0; i < 3; ++i) {
    EXPECT_TRUE(torch::allclose(g_fused[i], g_plain[i], tol, tol))
        << names[i] << " max abs diff " << (g_fused[i] - g_plain[i]).abs().max().item<double>();
  }
}

TEST(FusedAttention, EqualsAutogradFloat64) {
  for (int64_t N : {1, 37, 150})
    for (int threads : {1, 2})
      for (int64_t h_kv : {4, 2, 1}) check(torch::kFloat64, h_kv, threads, 1e-12, N);
}

TEST(FusedAttention, EqualsAutogradFloat32) {
  for (int64_t N : {37, 150})
    for (int threads : {1, 2})
      for (int64_t h_kv : {4, 2, 1}) check(torch::kFloat32, h_kv, threads, 1e-5, N);
}

// Tied values (v is the key tensor itself, as in CEM attention): the kernel returns one gradient
// dS^T q + P^T dO; autograd through the plain form adds the key and value paths. Queries come in
// the merged-heads layout the layers give it, (B, N, H, d_h) seen as (B, H, N, d_h), so the row
// stride is H d_h rather than d_h.
void check_tied(torch::ScalarType dtype, int64_t h_kv, int threads, double tol, int64_t N) {
  SCOPED_TRACE(::testing::Message() << c10::toString(dtype) << " tied H_kv=" << h_kv
                                    << " threads=" << threads << " N=" << N);
  set_threads(threads);
  torch::manual_seed(5);
  const auto o = torch::TensorOptions().dtype(dtype);
  const int64_t B = 2, H = 4, d_h = 16;
  torch::Tensor q_merged = torch::randn({B, N, H, d_h}, o).requires_grad_();
  torch::Tensor k = torch::randn({B, h_kv, N, d_h}, o).requires_grad_();
  const torch::Tensor q = q_merged.transpose(1, 2);
  ASSERT_NE(q.stride(2), d_h);
  const torch::Tensor g = torch::randn({B, H, N, d_h}, o);
  const torch::Tensor fused = causal_attention(q, k, k, 0);
  const torch::Tensor plain = plain_attention(q, k, k.clone());  // two tensors: the untied oracle
  EXPECT_TRUE(torch::allclose(fused, plain, tol, tol));
  {
    std::vector<torch::Tensor> poison;
    for (int i = 0; i < 4; ++i) poison.push_back(torch::full({B, H, N, d_h}, std::nan(""), o));
  }
  const auto g_fused = torch::autograd::grad({fused}, {q_merged, k}, {g});
  const auto g_plain = torch::autograd::grad({plain}, {q_merged, k}, {g});
  EXPECT_TRUE(torch::allclose(g_fused[0], g_plain[0], tol, tol))
      << "dq max abs diff " << (g_fused[0] - g_plain[0]).abs().max().item<double>();
  EXPECT_TRUE(torch::allclose(g_fused[1], g_plain[1], tol, tol))
      << "dk max abs diff " << (g_fused[1] - g_plain[1]).abs().max().item<double>();
}

TEST(FusedAttention, TiedValuesEqualAutograd) {
  for (int64_t N : {1, 37, 150})  // N = 1: one row, whose row stride BLAS still checks
    for (int threads : {1, 2})
      for (int64_t h_kv : {4, 2}) {
        check_tied(torch::kFloat64, h_kv, threads, 1e-12, N);
        check_tied(torch::kFloat32, h_kv, threads, 1e-5, N);
      }
}

TEST(FusedAttention, MaskedProbabilitiesAreExactZeros) {
  // Changing the last key and value never changes the outputs of earlier queries, bitwise.
  torch::manual_seed(4);
  torch::Tensor q = torch::randn({2, 2, 9, 8}), k = torch::randn({2, 2, 9, 8}),
                v = torch::randn({2, 2, 9, 8});
  const torch::Tensor before = causal_attention(q, k, v, 0);
  k.select(2, 8).fill_(1e4);
  v.select(2, 8).fill_(-1e4);
  const torch::Tensor after = causal_attention(q, k, v, 0);
  EXPECT_TRUE(torch::equal(before.narrow(2, 0, 8), after.narrow(2, 0, 8)));
  // Across query blocks (N = 130: blocks of 64, 64, 2 rows), changing key 100 leaves rows 0..99
  // alone.
  q = torch::randn({1, 2, 130, 8}), k = torch::randn({1, 2, 130, 8}),
  v = torch::randn({1, 2, 130, 8});
  const torch::Tensor long_before = causal_attention(q, k, v, 0);
  k.select(2, 100).fill_(1e4);
  v.select(2, 100).fill_(-1e4);
  const torch::Tensor long_after = causal_attention(q, k, v, 0);
  EXPECT_TRUE(torch::equal(long_before.narrow(2, 0, 100), long_after.narrow(2, 0, 100)));
  EXPECT_FALSE(torch::equal(long_before.narrow(2, 100, 30), long_after.narrow(2, 100, 30)));
}

}  // namespace
}  // namespace cemfrac
