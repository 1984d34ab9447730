// The causal-attention operators' shared pieces (see attention_common.h).
#include "cemfrac/ops/attention_common.h"

#include <cmath>
#include <limits>

namespace cemfrac::attention {

// ---- Shapes and checks shared by the three operators ------------------------------------------
// The operators take full sequences only (offset 0, as many keys as queries): q (B, H, N, d_h),
// k, v (B, H_kv, N, d_h), H a multiple of H_kv. The merged-heads output is (B, N, H, d_h).

void check_qkv(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const char* where) {
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4, where,
              ": q, k, v must be (B, H, N, d_h), got ", q.sizes(), ", ", k.sizes(), ", ",
              v.sizes());
  TORCH_CHECK(k.sizes() == v.sizes() && k.size(0) == q.size(0) && k.size(2) == q.size(2) &&
                  k.size(3) == q.size(3) && k.size(1) >= 1 && q.size(1) % k.size(1) == 0,
              where, ": k, v must be (B, H_kv, N, d_h) with H a multiple of H_kv, got q ",
              q.sizes(), ", k ", k.sizes(), ", v ", v.sizes());
  TORCH_CHECK(k.scalar_type() == q.scalar_type() && v.scalar_type() == q.scalar_type(), where,
              ": q, k, v must have one dtype");
}

bool has_kernel_dtype(const at::Tensor& q) {
  return q.scalar_type() == at::kFloat || q.scalar_type() == at::kDouble;
}

at::Tensor empty_merged(const at::Tensor& q) {  // (B, N, H, d_h)
  return at::empty({q.size(0), q.size(2), q.size(1), q.size(3)}, q.options());
}

at::Tensor empty_probs(const at::Tensor& q) {  // (B, H, N, N)
  return at::empty({q.size(0), q.size(1), q.size(2), q.size(2)}, q.options());
}

// The no-element tensor that stands for "no separate gradient" (tied values: dk holds both).
at::Tensor none_like(const at::Tensor& t) {
  return at::empty({0}, t.options());
}

double scale_of(const at::Tensor& q) {
  return 1.0 / std::sqrt(double(q.size(3)));
}

// ---- The twins' pieces: probabilities, closed-form gradients (ATen ops, differentiable) ---------

// (B, H_kv, T, X) -> (B, H, T, X), each key/value head repeated for its H / H_kv query heads in a
// row (repeat_interleave's order), through expand + reshape: sizes that depend on no values, so the
// meta device runs it (LibTorch 1.13's repeat_interleave has no C++ meta kernel).
at::Tensor repeat_heads(const at::Tensor& t, int64_t H) {
  const int64_t H_kv = t.size(1);
  if (H_kv == H) return t;
  return t.unsqueeze(2)
      .expand({t.size(0), H_kv, H / H_kv, t.size(2), t.size(3)})
      .reshape({t.size(0), H, t.size(2), t.size(3)});
}

at::Tensor sum_heads(const at::Tensor& t, int64_t H_kv) {  // (B, H, T, .) -> (B, H_kv, T, .)
  const int64_t B = t.size(0), H = t.size(1);
  return t.reshape({B, H_kv, H / H_kv, t.size(2), t.size(3)}).sum(2);
}

// P = softmax(logits * scale + causal mask) for logits (B, H, N, N) without the scale.
at::Tensor causal_softmax(const at::Tensor& logits, double scale) {
  const int64_t N = logits.size(-1);
  const at::Tensor hidden =
      at::ones({N, N}, at::TensorOptions().dtype(at::kBool).device(logits.device())).triu(1);
  return at::softmax((logits * scale).masked_fill(hidden, -std::numeric_limits<double>::infinity()),
                     -1);
}

// dS = P (dP - rowsum(dP P)): the softmax's backward (masked entries stay 0 since P is 0 there).
at::Tensor softmax_backward(const at::Tensor& p, const at::Tensor& dp) {
  return p * (dp - (dp * p).sum(-1, /*keepdim=*/true));
}

at::Tensor merged(const at::Tensor& heads) {  // (B, H, N, d_h) -> (B, N, H, d_h) contiguous
  return heads.permute({0, 2, 1, 3}).contiguous();
}

// The q, k, v gradients from dS, P and dO (all (B, H, N, .)); tied: dk holds dk + dv, dv none.
//   S = scale q k^T:  dq = scale dS k,  dk = scale dS^T q;   O = P v:  dv = P^T dO
Tensor3 qkv_gradients(const at::Tensor& ds, const at::Tensor& p, const at::Tensor& d_o,
                      const at::Tensor& q, const at::Tensor& k, bool tied) {
  const double scale = scale_of(q);
  const int64_t H_kv = k.size(1);
  const at::Tensor kk = repeat_heads(k, q.size(1));
  const at::Tensor dq = at::matmul(ds, kk) * scale;
  at::Tensor dk = sum_heads(at::matmul(ds.transpose(-2, -1), q) * scale, H_kv);
  const at::Tensor dv = sum_heads(at::matmul(p.transpose(-2, -1), d_o), H_kv);
  if (tied) return {dq, dk + dv, none_like(k)};
  return {dq, dk, dv};
}

// A gradient slot autograd left undefined (an output not used) as zeros of its shape.
at::Tensor or_zeros(const at::Tensor& g, at::IntArrayRef shape, const at::Tensor& like) {
  return g.defined() ? g : at::zeros(shape, like.options());
}

// Whether a backward's result must be differentiable again (create_graph with a live input).
bool recording(std::initializer_list<at::Tensor> ts) {
  if (!at::GradMode::is_enabled()) return false;
  for (const at::Tensor& t : ts) {
    if (t.defined() && t.requires_grad()) return true;
  }
  return false;
}

// Full sequences (offset 0, as many keys as queries) take the operators; continuations against a
// decode cache take the explicit ATen paths below.
bool full_sequence(const at::Tensor& q, const at::Tensor& k, int64_t offset) {
  return offset == 0 && q.size(2) == k.size(2);
}

}  // namespace cemfrac::attention
