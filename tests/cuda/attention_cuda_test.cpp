// cemfrac::causal_attention on CUDA (label `cuda`): the CUDA and AutogradCUDA kernels are ATen's
// scaled_dot_product_attention (ops/causal_attention.cpp). Checked against the float64 reference on
// the CPU (causal_attention_reference) for MHA, grouped-query and tied (v = k, CEM) heads, in
// float32 and bfloat16, forward and backward; and its memory: the (B, H, N, N) probabilities are
// never made. Skipped with the reason where no CUDA device or kernels exist.
//
// Bounds (derived, not tuned), element by element. A sum of terms, each with a relative error of at
// most e, is off by at most e times the sum of the terms' absolute values. So each result is
// compared within c u A, where A is the same computation in float64 with every term made
// non-negative (abs_terms below: P |V| for the output, P^T |dO| for dV, P o (|dO| |V|^T + D_abs)
// for dS, then dS |K| and dS^T |Q| scaled), u the unit roundoff of the tested dtype. float32 (u =
// 2^-24): every term passes through at most d_h + N roundings (a d_h-term logit, an N-term sum) and
// exp's relative error, c = 4 (d_h + N). bfloat16 (u = 2^-8): the kernels accumulate in float32
// (sum errors ~2^-24, negligible) but round P and dS to bfloat16 before their products and the
// results at the end; each term carries at most 3 such roundings, c = 8. The inputs are rounded
// to the tested dtype first, so both sides see the same numbers. A wrong mask or scale moves the
// output by O(max|v|), far outside every bound.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <string>

#ifdef CEMFRAC_WITH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#endif

#include "cemfrac/ops/causal_attention.h"
#include "tests/cuda/cuda_test_util.h"

namespace cemfrac::test {
namespace {

double max_abs(const torch::Tensor& t) {
  return t.abs().max().item<double>();
}

// The absolute-term sums A of the output and the three gradients (float64, CPU), for q (B, H, N,
// d_h), k and v (B, H_kv, N, d_h); tied: v is k and its gradient holds both.
struct AbsTerms {
  torch::Tensor out, dq, dk, dv;
};
AbsTerms abs_terms(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                   const torch::Tensor& dout, bool tied) {
  const int64_t H = q.size(1), H_kv = k.size(1), N = q.size(2);
  const double scale = 1.0 / std::sqrt(double(q.size(3)));
  const torch::Tensor kk = k.repeat_interleave(H / H_kv, 1), vv = v.repeat_interleave(H / H_kv, 1);
  const torch::Tensor hidden = torch::ones({N, N}, torch::kBool).triu(1);
  const torch::Tensor p = torch::softmax(
      (torch::matmul(q, kk.transpose(-2, -1)) * scale).masked_fill(hidden, -INFINITY), -1);
  const torch::Tensor ado = dout.abs();
  AbsTerms a;
  a.out = torch::matmul(p, vv.abs());
  const torch::Tensor d_abs = (ado * a.out).sum(-1, true);
  const torch::Tensor ds = p * (torch::matmul(ado, vv.abs().transpose(-2, -1)) + d_abs);
  a.dq = torch::matmul(ds, kk.abs()) * scale;
  auto fold = [&](const torch::Tensor& t) {  // (B, H, N, d_h) -> (B, H_kv, N, d_h)
    return t.reshape({t.size(0), H_kv, H / H_kv, N, t.size(3)}).sum(2);
  };
  a.dk = fold(torch::matmul(ds.transpose(-2, -1), q.abs()) * scale);
  a.dv = fold(torch::matmul(p.transpose(-2, -1), ado));
  if (tied) a.dk = a.dk + a.dv;
  return a;
}

// Largest |x - ref| - c u A over the elements: <= 0 when every element is within its bound.
double excess(const torch::Tensor& x, const torch::Tensor& ref, const torch::Tensor& A, double cu) {
  return (x.to(torch::kCPU, torch::kFloat64) - ref).abs().sub(A * cu).max().item<double>();
}

struct Case {
  int64_t H, H_kv;
  bool tied;
  torch::Dtype dtype;
};

void check_case(const Case& c) {
  const int64_t B = 2, N = 64, d_h = 16;
  torch::manual_seed(11);
  const torch::TensorOptions cpu64 = torch::TensorOptions().dtype(torch::kFloat64);
  // Inputs rounded to the tested dtype first, so both sides see the same numbers.
  auto draw = [&](int64_t heads) {
    return (torch::randn({B, heads, N, d_h}, cpu64) * 0.5).to(c.dtype).to(torch::kFloat64);
  };
  const torch::Tensor q64 = draw(c.H), k64 = draw(c.H_kv), v64 = c.tied ? k64 : draw(c.H_kv);
  const torch::Tensor dout64 =
      torch::randn({B, c.H, N, d_h}, cpu64).to(c.dtype).to(torch::kFloat64);

  // Reference: float64 on the CPU.
  torch::Tensor rq = q64.clone().requires_grad_(), rk = k64.clone().requires_grad_();
  torch::Tensor rv = c.tied ? rk : v64.clone().requires_grad_();
  const torch::Tensor ref = causal_attention_reference(rq, rk, rv, 0);
  ref.backward(dout64);

  // CUDA, in the tested dtype.
  const torch::Device gpu(torch::kCUDA, 0);
  torch::Tensor q = q64.to(gpu, c.dtype).requires_grad_(),
                k = k64.to(gpu, c.dtype).requires_grad_();
  torch::Tensor v = c.tied ? k : v64.to(gpu, c.dtype).requires_grad_();
  const torch::Tensor out = causal_attention(q, k, v, 0);
  out.backward(dout64.to(gpu, c.dtype));

  const double u = c.dtype == torch::kFloat32 ? std::ldexp(1.0, -24) : std::ldexp(1.0, -8);
  const double cu = (c.dtype == torch::kFloat32 ? 4.0 * (d_h + N) : 8.0) * u;
  const AbsTerms A = abs_terms(q64, k64, v64, dout64, c.tied);
  EXPECT_LE(excess(out, ref.detach(), A.out, cu), 0.0) << "output";
  EXPECT_LE(excess(q.grad(), rq.grad(), A.dq, cu), 0.0) << "dq";
  EXPECT_LE(excess(k.grad(), rk.grad(), A.dk, cu), 0.0) << "dk";
  if (!c.tied) {
    EXPECT_LE(excess(v.grad(), rv.grad(), A.dv, cu), 0.0) << "dv";
  }
}

TEST(AttentionCuda, SdpaEqualsTheFloat64ReferenceWithinTheDerivedBound) {
  const std::string why = cuda_unavailable();
  if (!why.empty()) GTEST_SKIP() << why;
  for (const torch::Dtype dtype : {torch::kFloat32, torch::kBFloat16}) {
    for (const Case c :
         {Case{4, 4, false, dtype}, Case{4, 2, false, dtype}, Case{4, 4, true, dtype}}) {
      SCOPED_TRACE(::testing::Message() << "H " << c.H << ", H_kv " << c.H_kv
                                        << (c.tied ? ", tied" : "") << ", " << dtype);
      check_case(c);
    }
  }
}

// float64 keeps the twin, which is differentiable again (second order through the operator).
TEST(AttentionCuda, Float64IsTwiceDifferentiable) {
  const std::string why = cuda_unavailable();
  if (!why.empty()) GTEST_SKIP() << why;
  const torch::TensorOptions o = torch::TensorOptions().dtype(torch::kFloat64).device(torch::kCUDA);
  torch::manual_seed(3);
  torch::Tensor q = torch::randn({1, 2, 8, 4}, o).requires_grad_();
  torch::Tensor k = torch::randn({1, 2, 8, 4}, o).requires_grad_();
  torch::Tensor v = torch::randn({1, 2, 8, 4}, o).requires_grad_();
  const torch::Tensor y = causal_attention(q, k, v, 0).square().sum();
  const auto g = torch::autograd::grad({y}, {q}, {}, /*retain_graph=*/true, /*create_graph=*/true);
  const auto gg = torch::autograd::grad({g[0].sum()}, {k});
  EXPECT_TRUE(gg[0].defined());
  EXPECT_GT(max_abs(gg[0]), 0.0);
}

// N = 4096, 8 heads: the probabilities alone would be 8 * 4096^2 * 2 bytes = 256 MiB in bfloat16.
// Forward and backward together must stay under a quarter of that above what was allocated before.
TEST(AttentionCuda, ProbabilitiesAreNeverMaterialised) {
  const std::string why = cuda_unavailable();
  if (!why.empty()) GTEST_SKIP() << why;
#ifdef CEMFRAC_WITH_CUDA
  namespace alloc = c10::cuda::CUDACachingAllocator;
  const torch::TensorOptions o =
      torch::TensorOptions().dtype(torch::kBFloat16).device(torch::kCUDA);
  torch::Tensor q = torch::randn({1, 8, 4096, 64}, o).requires_grad_();
  torch::Tensor k = torch::randn({1, 8, 4096, 64}, o).requires_grad_();
  torch::Tensor v = torch::randn({1, 8, 4096, 64}, o).requires_grad_();
  torch::cuda::synchronize();
  const auto agg = static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);
  const int64_t base = alloc::getDeviceStats(0).allocated_bytes[agg].current;
  alloc::resetPeakStats(0);
  causal_attention(q, k, v, 0).sum().backward();
  torch::cuda::synchronize();
  const int64_t peak = alloc::getDeviceStats(0).allocated_bytes[agg].peak - base;
  const int64_t probs = int64_t(8) * 4096 * 4096 * 2;
  EXPECT_LT(peak, probs / 4) << "peak " << peak << " bytes above the inputs";
#endif
}

}  // namespace
}  // namespace cemfrac::test
