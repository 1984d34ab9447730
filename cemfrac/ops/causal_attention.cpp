// LibTorch 1.13 has no public scaled_dot_product_attention (only the private
// at::_scaled_dot_product_attention), so attention is written with explicit matmuls, a causal mask
// and a softmax; this also keeps the masked entries exact zeros, which the bitwise causality test
// relies on. Training and full-sequence forwards take the fused kernel instead
// (kernels/cpu/attention_cpu.cpp), which avoids the batched matmuls' per-call thread fork/join on
// small matrices, the masked_fill and scale passes and four full-size (B, H, N, N) temporaries per
// layer.
#include "cemfrac/ops/causal_attention.h"

#include <ATen/ATen.h>
#include <torch/autograd.h>
#include <torch/library.h>

#include <cmath>
#include <initializer_list>
#include <limits>
#include <tuple>

#include "cemfrac/kernels/kernels.h"
#include "cemfrac/ops/library.h"

namespace cemfrac {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;
using Tensor3 = std::tuple<at::Tensor, at::Tensor, at::Tensor>;
using Tensor4 = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>;
using Tensor6 = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>;

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
  return at::softmax(
      (logits * scale).masked_fill(hidden, -std::numeric_limits<double>::infinity()), -1);
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

// Plain attention.
at::Tensor plain_probs(const at::Tensor& q, const at::Tensor& k) {
  return causal_softmax(at::matmul(q, repeat_heads(k, q.size(1)).transpose(-2, -1)), scale_of(q));
}

Tensor3 attention_backward_closed_form(const at::Tensor& d_out, const at::Tensor& q,
                                       const at::Tensor& k, const at::Tensor& v, bool tied) {
  const at::Tensor p = plain_probs(q, k);
  const at::Tensor d_o = d_out.permute({0, 2, 1, 3});  // (B, H, N, d_h)
  const at::Tensor dp = at::matmul(d_o, repeat_heads(v, q.size(1)).transpose(-2, -1));
  return qkv_gradients(softmax_backward(p, dp), p, d_o, q, k, tied);
}

// Shared bias a b^T, read = (sum_k P_k) r.
at::Tensor shared_bias_probs(const at::Tensor& q, const at::Tensor& k, const at::Tensor& a,
                             const at::Tensor& b) {
  const at::Tensor logits = at::matmul(q, repeat_heads(k, q.size(1)).transpose(-2, -1)) +
                            at::matmul(a, b.transpose(-2, -1)).unsqueeze(1);
  return causal_softmax(logits, scale_of(q));
}

//   dP_k = dO_k v_k^T + d_read r^T;  da = scale (sum_k dS_k) b,  db = scale (sum_k dS_k)^T a,
//   dr = (sum_k P_k)^T d_read
Tensor6 shared_bias_backward_closed_form(const at::Tensor& d_out, const at::Tensor& d_read,
                                         const at::Tensor& q, const at::Tensor& k,
                                         const at::Tensor& v, const at::Tensor& a,
                                         const at::Tensor& b, const at::Tensor& r, bool tied) {
  const double scale = scale_of(q);
  const at::Tensor p = shared_bias_probs(q, k, a, b);
  const at::Tensor d_o = d_out.permute({0, 2, 1, 3});
  const at::Tensor dp = at::matmul(d_o, repeat_heads(v, q.size(1)).transpose(-2, -1)) +
                        at::matmul(d_read, r.transpose(-2, -1)).unsqueeze(1);
  const at::Tensor ds = softmax_backward(p, dp);
  auto [dq, dk, dv] = qkv_gradients(ds, p, d_o, q, k, tied);
  const at::Tensor ds_sum = ds.sum(1);  // (B, N, N)
  return {dq,
          dk,
          dv,
          at::matmul(ds_sum, b) * scale,
          at::matmul(ds_sum.transpose(-2, -1), a) * scale,
          at::matmul(p.sum(1).transpose(-2, -1), d_read)};
}

// Per-head diagonal (delta_k . x) h^T, read = sum_k delta_k . (P_k h).
at::Tensor head_diag_probs(const at::Tensor& q, const at::Tensor& k, const at::Tensor& x,
                           const at::Tensor& h, const at::Tensor& delta) {
  const int64_t H = q.size(1), D = x.size(2);
  const at::Tensor xd = x.unsqueeze(1) * delta.view({1, H, 1, D});  // (B, H, N, D)
  const at::Tensor logits = at::matmul(q, repeat_heads(k, H).transpose(-2, -1)) +
                            at::matmul(xd, h.unsqueeze(1).transpose(-2, -1));
  return causal_softmax(logits, scale_of(q));
}

//   dP_k = dO_k v_k^T + (d_read . delta_k) h^T;  with E_k = scale dS_k h:
//   dx = sum_k delta_k . E_k,  dh = sum_k [scale dS_k^T (delta_k . x) + P_k^T (d_read . delta_k)],
//   d delta_k = sum_rows [x . E_k + d_read . (P_k h)]
Tensor6 head_diag_backward_closed_form(const at::Tensor& d_out, const at::Tensor& d_diag,
                                       const at::Tensor& q, const at::Tensor& k,
                                       const at::Tensor& v, const at::Tensor& x,
                                       const at::Tensor& h, const at::Tensor& delta, bool tied) {
  const int64_t H = q.size(1), D = x.size(2);
  const double scale = scale_of(q);
  const at::Tensor p = head_diag_probs(q, k, x, h, delta);
  const at::Tensor dk_ = delta.view({1, H, 1, D});
  const at::Tensor hs = h.unsqueeze(1);                // (B, 1, N, D)
  const at::Tensor rd = d_diag.unsqueeze(1) * dk_;     // (B, H, N, D): d_read . delta_k
  const at::Tensor d_o = d_out.permute({0, 2, 1, 3});
  const at::Tensor dp = at::matmul(d_o, repeat_heads(v, H).transpose(-2, -1)) +
                        at::matmul(rd, hs.transpose(-2, -1));
  const at::Tensor ds = softmax_backward(p, dp);
  auto [dq, dk, dv] = qkv_gradients(ds, p, d_o, q, k, tied);
  const at::Tensor e = at::matmul(ds, hs) * scale;  // (B, H, N, D)
  const at::Tensor xd = x.unsqueeze(1) * dk_;
  const at::Tensor dx = (e * dk_).sum(1);
  const at::Tensor dh = (at::matmul(ds.transpose(-2, -1), xd) * scale +
                         at::matmul(p.transpose(-2, -1), rd))
                            .sum(1);
  const at::Tensor d_delta =
      (e * x.unsqueeze(1) + at::matmul(p, hs) * d_diag.unsqueeze(1)).sum(at::IntArrayRef{0, 2});
  return {dq, dk, dv, dx, dh, d_delta};
}

// ---- cemfrac::causal_attention -------------------------------------------------------------

using AttnSig = at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&);
using AttnForwardSig = std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&,
                                                          const at::Tensor&);
using AttnBackwardSig = Tensor3(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                const at::Tensor&, const at::Tensor&, bool);

std::tuple<at::Tensor, at::Tensor> attention_forward_twin(const at::Tensor& q, const at::Tensor& k,
                                                          const at::Tensor& v) {
  check_qkv(q, k, v, "cemfrac::causal_attention");
  const at::Tensor p = plain_probs(q, k);
  return {merged(at::matmul(p, repeat_heads(v, q.size(1)))), p};
}

at::Tensor attention_twin(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  return std::get<0>(attention_forward_twin(q, k, v));
}

Tensor3 attention_backward_twin(const at::Tensor& d_out, const at::Tensor& q, const at::Tensor& k,
                                const at::Tensor& v, const at::Tensor& /*p*/, bool tied) {
  return attention_backward_closed_form(d_out, q, k, v, tied);
}

// CPU: kernels::causal_attention_{forward,backward}_cpu; values that are the keys (one tensor,
// CEM) take one gradient for both, accumulated in one buffer.
std::tuple<at::Tensor, at::Tensor> attention_forward_cpu(const at::Tensor& q_in,
                                                         const at::Tensor& k_in,
                                                         const at::Tensor& v_in) {
  check_qkv(q_in, k_in, v_in, "cemfrac::causal_attention");
  if (!has_kernel_dtype(q_in)) return attention_forward_twin(q_in, k_in, v_in);
  const at::Tensor q = kernels::attention_rows_cpu(q_in);
  const at::Tensor k = kernels::attention_rows_cpu(k_in);
  const at::Tensor v = v_in.is_same(k_in) ? k : kernels::attention_rows_cpu(v_in);
  at::Tensor p = empty_probs(q), out = empty_merged(q);
  kernels::causal_attention_forward_cpu(q, k, v, p, out);
  return {out, p};
}

at::Tensor attention_cpu(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  return std::get<0>(attention_forward_cpu(q, k, v));
}

Tensor3 attention_backward_cpu(const at::Tensor& d_out, const at::Tensor& q_in,
                               const at::Tensor& k_in, const at::Tensor& v_in, const at::Tensor& p,
                               bool tied) {
  if (!has_kernel_dtype(q_in)) return attention_backward_closed_form(d_out, q_in, k_in, v_in, tied);
  const at::Tensor q = kernels::attention_rows_cpu(q_in);
  const at::Tensor k = kernels::attention_rows_cpu(k_in);
  const at::Tensor v = tied ? k : kernels::attention_rows_cpu(v_in);
  // The gradients take their inputs' memory layout (a transposed view of (B, N, H, d_h) from
  // split_heads stays one), so the view and reshape backward of the projections need no copy.
  at::Tensor dq = at::empty_like(q), dk = at::empty_like(k);
  at::Tensor dv = tied ? dk : at::empty_like(v);
  kernels::causal_attention_backward_cpu(q, k, v, p.contiguous(), d_out.contiguous(), tied, dq, dk,
                                         dv);
  return {dq, dk, tied ? none_like(k) : dv};
}

std::tuple<at::Tensor, at::Tensor> attention_forward_meta(const at::Tensor& q, const at::Tensor& k,
                                                          const at::Tensor& v) {
  check_qkv(q, k, v, "cemfrac::causal_attention");
  return {empty_merged(q), empty_probs(q)};
}

at::Tensor attention_meta(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  return std::get<0>(attention_forward_meta(q, k, v));
}

Tensor3 attention_backward_meta(const at::Tensor&, const at::Tensor& q, const at::Tensor& k,
                                const at::Tensor& v, const at::Tensor&, bool tied) {
  return {at::empty_like(q), at::empty_like(k), tied ? none_like(k) : at::empty_like(v)};
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

class FusedCausalAttention : public torch::autograd::Function<FusedCausalAttention> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k,
                            const at::Tensor& v, bool tied) {
    static const auto forward_op = ops::op<AttnForwardSig>("causal_attention_forward");
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    auto [out, p] = forward_op.call(q, k, tied ? k : v);
    ctx->save_for_backward({q, k, v});  // the inputs themselves: create_graph needs them
    ctx->saved_data["p"] = p;
    ctx->saved_data["tied"] = tied;
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    static const auto backward_op = ops::op<AttnBackwardSig>("causal_attention_backward");
    const auto saved = ctx->get_saved_variables();
    const bool tied = ctx->saved_data["tied"].toBool();
    if (!grads[0].defined()) return {at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
    auto [dq, dk, dv] = backward_op.call(grads[0], saved[0], saved[1], tied ? saved[1] : saved[2],
                                         ctx->saved_data["p"].toTensor(), tied);
    return {dq, dk, tied ? at::Tensor() : dv, at::Tensor()};
  }
};

at::Tensor attention_autograd(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  if (recording({q, k, v})) return FusedCausalAttention::apply(q, k, v, v.is_same(k));
  static const auto attn_op = ops::op<AttnSig>("causal_attention");
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  return attn_op.call(q, k, v);
}

Tensor3 attention_backward_autograd(const at::Tensor& d_out, const at::Tensor& q,
                                    const at::Tensor& k, const at::Tensor& v, const at::Tensor& p,
                                    bool tied) {
  if (recording({d_out, q, k, v})) return attention_backward_closed_form(d_out, q, k, v, tied);
  static const auto backward_op = ops::op<AttnBackwardSig>("causal_attention_backward");
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  return backward_op.call(d_out, q, k, v, p, tied);
}

// ---- cemfrac::causal_attention_shared_bias ------------------------------------------------------

void check_shared_bias(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                       const at::Tensor& a, const at::Tensor& b, const at::Tensor& r) {
  const char* where = "cemfrac::causal_attention_shared_bias";
  check_qkv(q, k, v, where);
  const int64_t B = q.size(0), N = q.size(2);
  TORCH_CHECK(a.dim() == 3 && b.dim() == 3 && r.dim() == 3 && a.size(0) == B && a.size(1) == N &&
                  b.size(0) == B && b.size(1) == N && b.size(2) == a.size(2) && r.size(0) == B &&
                  r.size(1) == N,
              where, ": a, b must be (B, N, E) and r (B, N, F), got ", a.sizes(), ", ", b.sizes(),
              ", ", r.sizes());
  TORCH_CHECK(a.scalar_type() == q.scalar_type() && b.scalar_type() == q.scalar_type() &&
                  r.scalar_type() == q.scalar_type(),
              where, ": every input must have q's dtype");
}

using SbSig = std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&,
                                                 const at::Tensor&, const at::Tensor&,
                                                 const at::Tensor&, const at::Tensor&);
using SbForwardSig = Tensor4(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                             const at::Tensor&, const at::Tensor&, const at::Tensor&);
using SbBackwardSig = Tensor6(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                              const at::Tensor&, const at::Tensor&, const at::Tensor&,
                              const at::Tensor&, const at::Tensor&, const at::Tensor&,
                              const at::Tensor&, bool);

// Forward results: out (B, N, H, d_h), read (B, N, F), p (B, H, N, N), psum (B, N, N).
Tensor4 shared_bias_forward_twin(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                 const at::Tensor& a, const at::Tensor& b, const at::Tensor& r) {
  check_shared_bias(q, k, v, a, b, r);
  const at::Tensor p = shared_bias_probs(q, k, a, b);
  const at::Tensor psum = p.sum(1);
  return {merged(at::matmul(p, repeat_heads(v, q.size(1)))), at::matmul(psum, r), p, psum};
}

std::tuple<at::Tensor, at::Tensor> shared_bias_twin(const at::Tensor& q, const at::Tensor& k,
                                                    const at::Tensor& v, const at::Tensor& a,
                                                    const at::Tensor& b, const at::Tensor& r) {
  auto [out, read, p, psum] = shared_bias_forward_twin(q, k, v, a, b, r);
  return {out, read};
}

Tensor6 shared_bias_backward_twin(const at::Tensor& d_out, const at::Tensor& d_read,
                                  const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                  const at::Tensor& a, const at::Tensor& b, const at::Tensor& r,
                                  const at::Tensor&, const at::Tensor&, bool tied) {
  return shared_bias_backward_closed_form(d_out, d_read, q, k, v, a, b, r, tied);
}

Tensor4 shared_bias_forward_cpu(const at::Tensor& q_in, const at::Tensor& k_in,
                                const at::Tensor& v_in, const at::Tensor& a_in,
                                const at::Tensor& b_in, const at::Tensor& r_in) {
  check_shared_bias(q_in, k_in, v_in, a_in, b_in, r_in);
  if (!has_kernel_dtype(q_in)) return shared_bias_forward_twin(q_in, k_in, v_in, a_in, b_in, r_in);
  const at::Tensor q = kernels::attention_rows_cpu(q_in);
  const at::Tensor k = kernels::attention_rows_cpu(k_in);
  const at::Tensor v = v_in.is_same(k_in) ? k : kernels::attention_rows_cpu(v_in);
  const at::Tensor a = a_in.contiguous(), b = b_in.contiguous(), r = r_in.contiguous();
  const int64_t B = q.size(0), N = q.size(2);
  at::Tensor p = empty_probs(q), psum = at::empty({B, N, N}, q.options());
  at::Tensor out = empty_merged(q), read = at::empty({B, N, r.size(2)}, q.options());
  kernels::causal_attention_shared_bias_forward_cpu(q, k, v, a, b, r, p, psum, out, read);
  return {out, read, p, psum};
}

std::tuple<at::Tensor, at::Tensor> shared_bias_cpu(const at::Tensor& q, const at::Tensor& k,
                                                   const at::Tensor& v, const at::Tensor& a,
                                                   const at::Tensor& b, const at::Tensor& r) {
  auto [out, read, p, psum] = shared_bias_forward_cpu(q, k, v, a, b, r);
  return {out, read};
}

Tensor6 shared_bias_backward_cpu(const at::Tensor& d_out, const at::Tensor& d_read,
                                 const at::Tensor& q_in, const at::Tensor& k_in,
                                 const at::Tensor& v_in, const at::Tensor& a_in,
                                 const at::Tensor& b_in, const at::Tensor& r_in,
                                 const at::Tensor& p, const at::Tensor& psum, bool tied) {
  if (!has_kernel_dtype(q_in)) {
    return shared_bias_backward_closed_form(d_out, d_read, q_in, k_in, v_in, a_in, b_in, r_in,
                                            tied);
  }
  const at::Tensor q = kernels::attention_rows_cpu(q_in);
  const at::Tensor k = kernels::attention_rows_cpu(k_in);
  const at::Tensor v = tied ? k : kernels::attention_rows_cpu(v_in);
  const at::Tensor a = a_in.contiguous(), b = b_in.contiguous(), r = r_in.contiguous();
  at::Tensor dq = at::empty_like(q), dk = at::empty_like(k);
  at::Tensor dv = tied ? dk : at::empty_like(v);
  at::Tensor da = at::empty_like(a), db = at::empty_like(b), dr = at::empty_like(r);
  kernels::causal_attention_shared_bias_backward_cpu(
      q, k, v, a, b, r, p.contiguous(), psum.contiguous(), d_out.contiguous(),
      d_read.contiguous(), tied, dq, dk, dv, da, db, dr);
  return {dq, dk, tied ? none_like(k) : dv, da, db, dr};
}

Tensor4 shared_bias_forward_meta(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                 const at::Tensor& a, const at::Tensor& b, const at::Tensor& r) {
  check_shared_bias(q, k, v, a, b, r);
  const int64_t B = q.size(0), N = q.size(2);
  return {empty_merged(q), at::empty({B, N, r.size(2)}, q.options()), empty_probs(q),
          at::empty({B, N, N}, q.options())};
}

std::tuple<at::Tensor, at::Tensor> shared_bias_meta(const at::Tensor& q, const at::Tensor& k,
                                                    const at::Tensor& v, const at::Tensor& a,
                                                    const at::Tensor& b, const at::Tensor& r) {
  auto [out, read, p, psum] = shared_bias_forward_meta(q, k, v, a, b, r);
  return {out, read};
}

Tensor6 shared_bias_backward_meta(const at::Tensor&, const at::Tensor&, const at::Tensor& q,
                                  const at::Tensor& k, const at::Tensor& v, const at::Tensor& a,
                                  const at::Tensor& b, const at::Tensor& r, const at::Tensor&,
                                  const at::Tensor&, bool tied) {
  return {at::empty_like(q), at::empty_like(k), tied ? none_like(k) : at::empty_like(v),
          at::empty_like(a), at::empty_like(b), at::empty_like(r)};
}

class FusedSharedBiasAttention : public torch::autograd::Function<FusedSharedBiasAttention> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k,
                               const at::Tensor& v, const at::Tensor& a, const at::Tensor& b,
                               const at::Tensor& r, bool tied) {
    static const auto forward_op = ops::op<SbForwardSig>("causal_attention_shared_bias_forward");
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    auto [out, read, p, psum] = forward_op.call(q, k, tied ? k : v, a, b, r);
    ctx->save_for_backward({q, k, v, a, b, r});
    ctx->saved_data["p"] = p;
    ctx->saved_data["psum"] = psum;
    ctx->saved_data["tied"] = tied;
    return {out, read};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    static const auto backward_op =
        ops::op<SbBackwardSig>("causal_attention_shared_bias_backward");
    const auto s = ctx->get_saved_variables();
    const bool tied = ctx->saved_data["tied"].toBool();
    const at::Tensor& q = s[0];
    const at::Tensor d_out = or_zeros(grads[0], {q.size(0), q.size(2), q.size(1), q.size(3)}, q);
    const at::Tensor d_read = or_zeros(grads[1], {q.size(0), q.size(2), s[5].size(2)}, q);
    auto [dq, dk, dv, da, db, dr] =
        backward_op.call(d_out, d_read, q, s[1], tied ? s[1] : s[2], s[3], s[4], s[5],
                         ctx->saved_data["p"].toTensor(), ctx->saved_data["psum"].toTensor(), tied);
    return {dq, dk, tied ? at::Tensor() : dv, da, db, dr, at::Tensor()};
  }
};

std::tuple<at::Tensor, at::Tensor> shared_bias_autograd(const at::Tensor& q, const at::Tensor& k,
                                                        const at::Tensor& v, const at::Tensor& a,
                                                        const at::Tensor& b, const at::Tensor& r) {
  if (recording({q, k, v, a, b, r})) {
    const auto o = FusedSharedBiasAttention::apply(q, k, v, a, b, r, v.is_same(k));
    return {o[0], o[1]};
  }
  static const auto sb_op = ops::op<SbSig>("causal_attention_shared_bias");
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  return sb_op.call(q, k, v, a, b, r);
}

Tensor6 shared_bias_backward_autograd(const at::Tensor& d_out, const at::Tensor& d_read,
                                      const at::Tensor& q, const at::Tensor& k,
                                      const at::Tensor& v, const at::Tensor& a,
                                      const at::Tensor& b, const at::Tensor& r,
                                      const at::Tensor& p, const at::Tensor& psum, bool tied) {
  if (recording({d_out, d_read, q, k, v, a, b, r})) {
    return shared_bias_backward_closed_form(d_out, d_read, q, k, v, a, b, r, tied);
  }
  static const auto backward_op = ops::op<SbBackwardSig>("causal_attention_shared_bias_backward");
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  return backward_op.call(d_out, d_read, q, k, v, a, b, r, p, psum, tied);
}

// ---- cemfrac::causal_attention_head_diag ------------------------------------------------------

void check_head_diag(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                     const at::Tensor& x, const at::Tensor& h, const at::Tensor& delta) {
  const char* where = "cemfrac::causal_attention_head_diag";
  check_qkv(q, k, v, where);
  const int64_t B = q.size(0), H = q.size(1), N = q.size(2);
  TORCH_CHECK(x.dim() == 3 && x.size(0) == B && x.size(1) == N && h.sizes() == x.sizes() &&
                  delta.dim() == 2 && delta.size(0) == H && delta.size(1) == x.size(2),
              where, ": x, h must be (B, N, D) and delta (H, D), got ", x.sizes(), ", ", h.sizes(),
              ", ", delta.sizes());
  TORCH_CHECK(x.scalar_type() == q.scalar_type() && h.scalar_type() == q.scalar_type() &&
                  delta.scalar_type() == q.scalar_type(),
              where, ": every input must have q's dtype");
}

using HdSig = SbSig;
using HdForwardSig = SbForwardSig;
using HdBackwardSig = SbBackwardSig;

// Forward results: out (B, N, H, d_h), diag (B, N, D), p (B, H, N, N), read (B, H, N, D) = P_k h.
Tensor4 head_diag_forward_twin(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                               const at::Tensor& x, const at::Tensor& h, const at::Tensor& delta) {
  check_head_diag(q, k, v, x, h, delta);
  const int64_t H = q.size(1), D = x.size(2);
  const at::Tensor p = head_diag_probs(q, k, x, h, delta);
  const at::Tensor read = at::matmul(p, h.unsqueeze(1));
  return {merged(at::matmul(p, repeat_heads(v, H))), (read * delta.view({1, H, 1, D})).sum(1), p,
          read};
}

std::tuple<at::Tensor, at::Tensor> head_diag_twin(const at::Tensor& q, const at::Tensor& k,
                                                  const at::Tensor& v, const at::Tensor& x,
                                                  const at::Tensor& h, const at::Tensor& delta) {
  auto [out, diag, p, read] = head_diag_forward_twin(q, k, v, x, h, delta);
  return {out, diag};
}

Tensor6 head_diag_backward_twin(const at::Tensor& d_out, const at::Tensor& d_diag,
                                const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                const at::Tensor& x, const at::Tensor& h, const at::Tensor& delta,
                                const at::Tensor&, const at::Tensor&, bool tied) {
  return head_diag_backward_closed_form(d_out, d_diag, q, k, v, x, h, delta, tied);
}

Tensor4 head_diag_forward_cpu(const at::Tensor& q_in, const at::Tensor& k_in,
                              const at::Tensor& v_in, const at::Tensor& x_in,
                              const at::Tensor& h_in, const at::Tensor& delta_in) {
  check_head_diag(q_in, k_in, v_in, x_in, h_in, delta_in);
  if (!has_kernel_dtype(q_in)) {
    return head_diag_forward_twin(q_in, k_in, v_in, x_in, h_in, delta_in);
  }
  const at::Tensor q = kernels::attention_rows_cpu(q_in);
  const at::Tensor k = kernels::attention_rows_cpu(k_in);
  const at::Tensor v = v_in.is_same(k_in) ? k : kernels::attention_rows_cpu(v_in);
  const at::Tensor x = x_in.contiguous(), h = h_in.contiguous(), delta = delta_in.contiguous();
  const int64_t B = q.size(0), H = q.size(1), N = q.size(2), D = x.size(2);
  at::Tensor p = empty_probs(q), read = at::empty({B, H, N, D}, q.options());
  at::Tensor out = empty_merged(q), diag = at::empty({B, N, D}, q.options());
  kernels::causal_attention_head_diag_forward_cpu(q, k, v, x, h, delta, p, read, out, diag);
  return {out, diag, p, read};
}

std::tuple<at::Tensor, at::Tensor> head_diag_cpu(const at::Tensor& q, const at::Tensor& k,
                                                 const at::Tensor& v, const at::Tensor& x,
                                                 const at::Tensor& h, const at::Tensor& delta) {
  auto [out, diag, p, read] = head_diag_forward_cpu(q, k, v, x, h, delta);
  return {out, diag};
}

Tensor6 head_diag_backward_cpu(const at::Tensor& d_out, const at::Tensor& d_diag,
                               const at::Tensor& q_in, const at::Tensor& k_in,
                               const at::Tensor& v_in, const at::Tensor& x_in,
                               const at::Tensor& h_in, const at::Tensor& delta_in,
                               const at::Tensor& p, const at::Tensor& read, bool tied) {
  if (!has_kernel_dtype(q_in)) {
    return head_diag_backward_closed_form(d_out, d_diag, q_in, k_in, v_in, x_in, h_in, delta_in,
                                          tied);
  }
  const at::Tensor q = kernels::attention_rows_cpu(q_in);
  const at::Tensor k = kernels::attention_rows_cpu(k_in);
  const at::Tensor v = tied ? k : kernels::attention_rows_cpu(v_in);
  const at::Tensor x = x_in.contiguous(), h = h_in.contiguous(), delta = delta_in.contiguous();
  const int64_t B = q.size(0), H = q.size(1), D = x.size(2);
  at::Tensor dq = at::empty_like(q), dk = at::empty_like(k);
  at::Tensor dv = tied ? dk : at::empty_like(v);
  at::Tensor dx = at::empty_like(x), dh = at::empty_like(h);
  at::Tensor d_delta_rows = at::empty({B, H, D}, q.options());
  kernels::causal_attention_head_diag_backward_cpu(q, k, v, x, h, delta, p.contiguous(),
                                                   read.contiguous(), d_out.contiguous(),
                                                   d_diag.contiguous(), tied, dq, dk, dv, dx, dh,
                                                   d_delta_rows);
  // The batch rows' shares summed in row order: the same bits for any thread count.
  at::Tensor d_delta = d_delta_rows[0].clone();
  for (int64_t b = 1; b < B; ++b) d_delta.add_(d_delta_rows[b]);
  return {dq, dk, tied ? none_like(k) : dv, dx, dh, d_delta};
}

Tensor4 head_diag_forward_meta(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                               const at::Tensor& x, const at::Tensor& h, const at::Tensor& delta) {
  check_head_diag(q, k, v, x, h, delta);
  const int64_t B = q.size(0), H = q.size(1), N = q.size(2), D = x.size(2);
  return {empty_merged(q), at::empty({B, N, D}, q.options()), empty_probs(q),
          at::empty({B, H, N, D}, q.options())};
}

std::tuple<at::Tensor, at::Tensor> head_diag_meta(const at::Tensor& q, const at::Tensor& k,
                                                  const at::Tensor& v, const at::Tensor& x,
                                                  const at::Tensor& h, const at::Tensor& delta) {
  auto [out, diag, p, read] = head_diag_forward_meta(q, k, v, x, h, delta);
  return {out, diag};
}

Tensor6 head_diag_backward_meta(const at::Tensor&, const at::Tensor&, const at::Tensor& q,
                                const at::Tensor& k, const at::Tensor& v, const at::Tensor& x,
                                const at::Tensor& h, const at::Tensor& delta, const at::Tensor&,
                                const at::Tensor&, bool tied) {
  return {at::empty_like(q), at::empty_like(k), tied ? none_like(k) : at::empty_like(v),
          at::empty_like(x), at::empty_like(h), at::empty_like(delta)};
}

class FusedHeadDiagAttention : public torch::autograd::Function<FusedHeadDiagAttention> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k,
                               const at::Tensor& v, const at::Tensor& x, const at::Tensor& h,
                               const at::Tensor& delta, bool tied) {
    static const auto forward_op = ops::op<HdForwardSig>("causal_attention_head_diag_forward");
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    auto [out, diag, p, read] = forward_op.call(q, k, tied ? k : v, x, h, delta);
    ctx->save_for_backward({q, k, v, x, h, delta});
    ctx->saved_data["p"] = p;
    ctx->saved_data["read"] = read;
    ctx->saved_data["tied"] = tied;
    return {out, diag};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    static const auto backward_op = ops::op<HdBackwardSig>("causal_attention_head_diag_backward");
    const auto s = ctx->get_saved_variables();
    const bool tied = ctx->saved_data["tied"].toBool();
    const at::Tensor& q = s[0];
    const at::Tensor d_out = or_zeros(grads[0], {q.size(0), q.size(2), q.size(1), q.size(3)}, q);
    const at::Tensor d_diag = or_zeros(grads[1], s[3].sizes(), q);
    auto [dq, dk, dv, dx, dh, d_delta] =
        backward_op.call(d_out, d_diag, q, s[1], tied ? s[1] : s[2], s[3], s[4], s[5],
                         ctx->saved_data["p"].toTensor(), ctx->saved_data["read"].toTensor(), tied);
    return {dq, dk, tied ? at::Tensor() : dv, dx, dh, d_delta, at::Tensor()};
  }
};

std::tuple<at::Tensor, at::Tensor> head_diag_autograd(const at::Tensor& q, const at::Tensor& k,
                                                      const at::Tensor& v, const at::Tensor& x,
                                                      const at::Tensor& h,
                                                      const at::Tensor& delta) {
  if (recording({q, k, v, x, h, delta})) {
    const auto o = FusedHeadDiagAttention::apply(q, k, v, x, h, delta, v.is_same(k));
    return {o[0], o[1]};
  }
  static const auto hd_op = ops::op<HdSig>("causal_attention_head_diag");
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  return hd_op.call(q, k, v, x, h, delta);
}

Tensor6 head_diag_backward_autograd(const at::Tensor& d_out, const at::Tensor& d_diag,
                                    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                    const at::Tensor& x, const at::Tensor& h,
                                    const at::Tensor& delta, const at::Tensor& p,
                                    const at::Tensor& read, bool tied) {
  if (recording({d_out, d_diag, q, k, v, x, h, delta})) {
    return head_diag_backward_closed_form(d_out, d_diag, q, k, v, x, h, delta, tied);
  }
  static const auto backward_op = ops::op<HdBackwardSig>("causal_attention_head_diag_backward");
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  return backward_op.call(d_out, d_diag, q, k, v, x, h, delta, p, read, tied);
}

// Full sequences (offset 0, as many keys as queries) take the operators; continuations against a
// decode cache take the explicit ATen paths below.
bool full_sequence(const at::Tensor& q, const at::Tensor& k, int64_t offset) {
  return offset == 0 && q.size(2) == k.size(2);
}

}  // namespace

AttentionWithRead causal_attention_head_diag(const at::Tensor& q, const at::Tensor& k,
                                             const at::Tensor& v, const at::Tensor& x,
                                             const at::Tensor& h, const at::Tensor& delta,
                                             int64_t offset) {
  if (full_sequence(q, k, offset)) {
    static const auto hd_op = ops::op<HdSig>("causal_attention_head_diag");
    auto [out, diag] = hd_op.call(q, k, v, x, h, delta);
    return {out.permute({0, 2, 1, 3}), diag};  // out as a (B, H, N, d_h) view
  }
  return causal_attention_head_diag_reference(q, k, v, x, h, delta, offset);
}

AttentionWithRead causal_attention_head_diag_reference(const at::Tensor& q, const at::Tensor& k,
                                                       const at::Tensor& v, const at::Tensor& x,
                                                       const at::Tensor& h, const at::Tensor& delta,
                                                       int64_t offset) {
  const int64_t H = q.size(1), N = q.size(2), d_h = q.size(3), D = x.size(2);
  const int64_t H_kv = k.size(1), T = k.size(2);
  const at::Tensor kk = k.repeat_interleave(H / H_kv, 1), vv = v.repeat_interleave(H / H_kv, 1);
  const at::Tensor dk = delta.view({1, H, 1, D});
  const at::Tensor hs = h.unsqueeze(1);  // (B, 1, T, D)
  at::Tensor scores = at::matmul(q, kk.transpose(-2, -1)) +
                      at::matmul(x.unsqueeze(1) * dk, hs.transpose(-2, -1));  // (B, H, N, T)
  scores = scores / std::sqrt(double(d_h));
  const at::Tensor hidden =
      at::ones({N, T}, at::TensorOptions().dtype(at::kBool).device(q.device())).triu(offset + 1);
  scores = scores.masked_fill(hidden, -std::numeric_limits<double>::infinity());
  const at::Tensor probs = at::softmax(scores, -1);
  return {at::matmul(probs, vv), (at::matmul(probs, hs) * dk).sum(1)};
}

AttentionWithRead causal_attention_shared_bias(const at::Tensor& q, const at::Tensor& k,
                                               const at::Tensor& v, const at::Tensor& a,
                                               const at::Tensor& b, const at::Tensor& r,
                                               int64_t offset) {
  if (full_sequence(q, k, offset)) {
    static const auto sb_op = ops::op<SbSig>("causal_attention_shared_bias");
    auto [out, read] = sb_op.call(q, k, v, a, b, r);
    return {out.permute({0, 2, 1, 3}), read};  // out as a (B, H, N, d_h) view
  }
  return causal_attention_shared_bias_reference(q, k, v, a, b, r, offset);
}

AttentionWithRead causal_attention_shared_bias_reference(const at::Tensor& q, const at::Tensor& k,
                                                         const at::Tensor& v, const at::Tensor& a,
                                                         const at::Tensor& b, const at::Tensor& r,
                                                         int64_t offset) {
  const int64_t H = q.size(1), N = q.size(2), d_h = q.size(3);
  const int64_t H_kv = k.size(1), T = k.size(2);
  const at::Tensor kk = k.repeat_interleave(H / H_kv, 1), vv = v.repeat_interleave(H / H_kv, 1);
  at::Tensor scores =
      at::matmul(q, kk.transpose(-2, -1)) + at::matmul(a, b.transpose(-2, -1)).unsqueeze(1);
  scores = scores / std::sqrt(double(d_h));  // (B, H, N, T)
  const at::Tensor hidden =
      at::ones({N, T}, at::TensorOptions().dtype(at::kBool).device(q.device())).triu(offset + 1);
  scores = scores.masked_fill(hidden, -std::numeric_limits<double>::infinity());
  const at::Tensor probs = at::softmax(scores, -1);
  return {at::matmul(probs, vv), at::matmul(probs.sum(1), r)};
}

at::Tensor causal_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            int64_t offset) {
  const int64_t B = q.size(0), H = q.size(1), N = q.size(2), d_h = q.size(3);
  const int64_t H_kv = k.size(1), T = k.size(2), group = H / H_kv;
  if (full_sequence(q, k, offset)) {
    // Values that are the keys (one tensor, CEM) take the tied kernel: one gradient for both.
    static const auto attn_op = ops::op<AttnSig>("causal_attention");
    return attn_op.call(q, k, v).permute({0, 2, 1, 3});  // (B, H, N, d_h) view
  }
  // Query heads h = j * group + r share key/value head j: stack each group's queries along the
  // rows, so one matmul per key/value head serves the whole group (no copies of K or V).
  at::Tensor q_grouped = q.reshape({B, H_kv, group * N, d_h}) * (1.0 / std::sqrt(double(d_h)));
  at::Tensor scores = at::matmul(q_grouped, k.transpose(-2, -1));  // (B, H_kv, group N, T)
  if (N > 1 || offset + N < T) {
    // Row n of every group is query position offset + n; key t is visible when t <= offset + n.
    at::Tensor hidden =
        at::ones({N, T}, at::TensorOptions().dtype(at::kBool).device(q.device())).triu(offset + 1);
    if (group > 1) hidden = hidden.repeat({group, 1});  // (group N, T)
    scores = scores.masked_fill(hidden, -std::numeric_limits<double>::infinity());
  }
  at::Tensor probs = at::softmax(scores, -1);        // (B, H_kv, group N, T)
  return at::matmul(probs, v).view({B, H, N, d_h});  // (B, H, N, d_h)
}

at::Tensor causal_attention_reference(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                      int64_t offset) {
  const int64_t H = q.size(1), N = q.size(2), d_h = q.size(3);
  const int64_t H_kv = k.size(1), T = k.size(2);
  // Every query head with its own copy of its key/value head.
  const at::Tensor kk = k.repeat_interleave(H / H_kv, 1), vv = v.repeat_interleave(H / H_kv, 1);
  at::Tensor scores = at::matmul(q, kk.transpose(-2, -1)) / std::sqrt(double(d_h));  // (B, H, N, T)
  const at::Tensor hidden =
      at::ones({N, T}, at::TensorOptions().dtype(at::kBool).device(q.device())).triu(offset + 1);
  scores = scores.masked_fill(hidden, -std::numeric_limits<double>::infinity());
  return at::matmul(at::softmax(scores, -1), vv);
}

#ifdef CEMFRAC_WITH_CUDA
// CUDA (LibTorch 2.x): ATen's scaled_dot_product_attention, whose flash and memory-efficient
// kernels never build the (B, H, N, N) probabilities, differentiated by its own autograd.
// Registered for AutogradCUDA (training) and CUDA (below autograd, e.g. under NoGradGuard), so
// the CPU's Autograd kernel and its saved probabilities are not used on CUDA. float64 (the
// gradient checks' dtype, second order included) keeps the twin: SDPA's fast backward kernels are
// not differentiable again. Grouped-query heads are repeated first (repeat_heads), which keeps
// SDPA on its fast kernels. Returns the operator's merged-heads layout (B, N, H, d_h) as a view.
at::Tensor attention_sdpa(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  check_qkv(q, k, v, "cemfrac::causal_attention");
  const int64_t H = q.size(1);
  const at::Tensor vv = v.is_same(k) ? repeat_heads(k, H) : repeat_heads(v, H);
  return at::scaled_dot_product_attention(q, repeat_heads(k, H), vv, /*attn_mask=*/{},
                                          /*dropout_p=*/0.0, /*is_causal=*/true)
      .transpose(1, 2);
}

at::Tensor attention_autograd_cuda(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  if (q.scalar_type() == at::kDouble) return attention_autograd(q, k, v);
  return attention_sdpa(q, k, v);
}

at::Tensor attention_cuda(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  if (q.scalar_type() == at::kDouble) return attention_twin(q, k, v);
  return attention_sdpa(q, k, v);
}
#endif

extern const bool kCausalAttentionKernels = true;  // ops/library.cpp's link anchor

}  // namespace cemfrac

#ifdef CEMFRAC_WITH_CUDA
TORCH_LIBRARY_IMPL(cemfrac, CUDA, m) {
  m.impl("causal_attention", &cemfrac::attention_cuda);
}

TORCH_LIBRARY_IMPL(cemfrac, AutogradCUDA, m) {
  m.impl("causal_attention", &cemfrac::attention_autograd_cuda);
}
#endif

TORCH_LIBRARY_IMPL(cemfrac, CPU, m) {
  m.impl("causal_attention", &cemfrac::attention_cpu);
  m.impl("causal_attention_forward", &cemfrac::attention_forward_cpu);
  m.impl("causal_attention_backward", &cemfrac::attention_backward_cpu);
  m.impl("causal_attention_shared_bias", &cemfrac::shared_bias_cpu);
  m.impl("causal_attention_shared_bias_forward", &cemfrac::shared_bias_forward_cpu);
  m.impl("causal_attention_shared_bias_backward", &cemfrac::shared_bias_backward_cpu);
  m.impl("causal_attention_head_diag", &cemfrac::head_diag_cpu);
  m.impl("causal_attention_head_diag_forward", &cemfrac::head_diag_forward_cpu);
  m.impl("causal_attention_head_diag_backward", &cemfrac::head_diag_backward_cpu);
}

TORCH_LIBRARY_IMPL(cemfrac, Meta, m) {
  m.impl("causal_attention", &cemfrac::attention_meta);
  m.impl("causal_attention_forward", &cemfrac::attention_forward_meta);
  m.impl("causal_attention_backward", &cemfrac::attention_backward_meta);
  m.impl("causal_attention_shared_bias", &cemfrac::shared_bias_meta);
  m.impl("causal_attention_shared_bias_forward", &cemfrac::shared_bias_forward_meta);
  m.impl("causal_attention_shared_bias_backward", &cemfrac::shared_bias_backward_meta);
  m.impl("causal_attention_head_diag", &cemfrac::head_diag_meta);
  m.impl("causal_attention_head_diag_forward", &cemfrac::head_diag_forward_meta);
  m.impl("causal_attention_head_diag_backward", &cemfrac::head_diag_backward_meta);
}

TORCH_LIBRARY_IMPL(cemfrac, CompositeExplicitAutograd, m) {
  m.impl("causal_attention", &cemfrac::attention_twin);
  m.impl("causal_attention_forward", &cemfrac::attention_forward_twin);
  m.impl("causal_attention_backward", &cemfrac::attention_backward_twin);
  m.impl("causal_attention_shared_bias", &cemfrac::shared_bias_twin);
  m.impl("causal_attention_shared_bias_forward", &cemfrac::shared_bias_forward_twin);
  m.impl("causal_attention_shared_bias_backward", &cemfrac::shared_bias_backward_twin);
  m.impl("causal_attention_head_diag", &cemfrac::head_diag_twin);
  m.impl("causal_attention_head_diag_forward", &cemfrac::head_diag_forward_twin);
  m.impl("causal_attention_head_diag_backward", &cemfrac::head_diag_backward_twin);
}

TORCH_LIBRARY_IMPL(cemfrac, Autograd, m) {
  m.impl("causal_attention", &cemfrac::attention_autograd);
  m.impl("causal_attention_backward", &cemfrac::attention_backward_autograd);
  m.impl("causal_attention_shared_bias", &cemfrac::shared_bias_autograd);
  m.impl("causal_attention_shared_bias_backward", &cemfrac::shared_bias_backward_autograd);
  m.impl("causal_attention_head_diag", &cemfrac::head_diag_autograd);
  m.impl("causal_attention_head_diag_backward", &cemfrac::head_diag_backward_autograd);
}
