// cemfrac::causal_attention_head_diag (ops/causal_attention.h): CEM attention's per-head bilinear
// D+LR diagonal, its CPU kernel (kernels/cpu/attention_cpu.cpp), ATen twin, Meta and Autograd
// kernels.
#include "cemfrac/ops/causal_attention.h"

#include <ATen/ATen.h>
#include <torch/autograd.h>
#include <torch/library.h>

#include <cmath>
#include <limits>
#include <tuple>

#include "cemfrac/kernels/kernels.h"
#include "cemfrac/ops/attention_common.h"
#include "cemfrac/ops/library.h"

namespace cemfrac {
namespace {

using namespace attention;  // NOLINT: the shared pieces of the three attention operators
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

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
  const at::Tensor hs = h.unsqueeze(1);             // (B, 1, N, D)
  const at::Tensor rd = d_diag.unsqueeze(1) * dk_;  // (B, H, N, D): d_read . delta_k
  const at::Tensor d_o = d_out.permute({0, 2, 1, 3});
  const at::Tensor dp =
      at::matmul(d_o, repeat_heads(v, H).transpose(-2, -1)) + at::matmul(rd, hs.transpose(-2, -1));
  const at::Tensor ds = softmax_backward(p, dp);
  auto [dq, dk, dv] = qkv_gradients(ds, p, d_o, q, k, tied);
  const at::Tensor e = at::matmul(ds, hs) * scale;  // (B, H, N, D)
  const at::Tensor xd = x.unsqueeze(1) * dk_;
  const at::Tensor dx = (e * dk_).sum(1);
  const at::Tensor dh =
      (at::matmul(ds.transpose(-2, -1), xd) * scale + at::matmul(p.transpose(-2, -1), rd)).sum(1);
  const at::Tensor d_delta =
      (e * x.unsqueeze(1) + at::matmul(p, hs) * d_diag.unsqueeze(1)).sum(at::IntArrayRef{0, 2});
  return {dq, dk, dv, dx, dh, d_delta};
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

using HdSig = WithReadSig;
using HdForwardSig = WithReadForwardSig;
using HdBackwardSig = WithReadBackwardSig;

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
  kernels::causal_attention_head_diag_backward_cpu(
      q, k, v, x, h, delta, p.contiguous(), read.contiguous(), d_out.contiguous(),
      d_diag.contiguous(), tied, dq, dk, dv, dx, dh, d_delta_rows);
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

extern const bool kCausalAttentionHeadDiagKernels = true;  // ops/library.cpp's link anchor

}  // namespace cemfrac

TORCH_LIBRARY_IMPL(cemfrac, CPU, m) {
  m.impl("causal_attention_head_diag", &cemfrac::head_diag_cpu);
  m.impl("causal_attention_head_diag_forward", &cemfrac::head_diag_forward_cpu);
  m.impl("causal_attention_head_diag_backward", &cemfrac::head_diag_backward_cpu);
}

TORCH_LIBRARY_IMPL(cemfrac, Meta, m) {
  m.impl("causal_attention_head_diag", &cemfrac::head_diag_meta);
  m.impl("causal_attention_head_diag_forward", &cemfrac::head_diag_forward_meta);
  m.impl("causal_attention_head_diag_backward", &cemfrac::head_diag_backward_meta);
}

TORCH_LIBRARY_IMPL(cemfrac, CompositeExplicitAutograd, m) {
  m.impl("causal_attention_head_diag", &cemfrac::head_diag_twin);
  m.impl("causal_attention_head_diag_forward", &cemfrac::head_diag_forward_twin);
  m.impl("causal_attention_head_diag_backward", &cemfrac::head_diag_backward_twin);
}

TORCH_LIBRARY_IMPL(cemfrac, Autograd, m) {
  m.impl("causal_attention_head_diag", &cemfrac::head_diag_autograd);
  m.impl("causal_attention_head_diag_backward", &cemfrac::head_diag_backward_autograd);
}
