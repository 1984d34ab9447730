// cemfrac::causal_attention_shared_bias (ops/causal_attention.h): CEM attention's shared D+LR logit
// bias, its CPU kernel (kernels/cpu/attention_cpu.cpp), ATen twin, Meta and Autograd kernels.
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

using SbSig = WithReadSig;
using SbForwardSig = WithReadForwardSig;
using SbBackwardSig = WithReadBackwardSig;

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
      q, k, v, a, b, r, p.contiguous(), psum.contiguous(), d_out.contiguous(), d_read.contiguous(),
      tied, dq, dk, dv, da, db, dr);
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
    static const auto backward_op = ops::op<SbBackwardSig>("causal_attention_shared_bias_backward");
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
                                      const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                      const at::Tensor& a, const at::Tensor& b, const at::Tensor& r,
                                      const at::Tensor& p, const at::Tensor& psum, bool tied) {
  if (recording({d_out, d_read, q, k, v, a, b, r})) {
    return shared_bias_backward_closed_form(d_out, d_read, q, k, v, a, b, r, tied);
  }
  static const auto backward_op = ops::op<SbBackwardSig>("causal_attention_shared_bias_backward");
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  return backward_op.call(d_out, d_read, q, k, v, a, b, r, p, psum, tied);
}

}  // namespace

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

extern const bool kCausalAttentionSharedBiasKernels = true;  // ops/library.cpp's link anchor

}  // namespace cemfrac

TORCH_LIBRARY_IMPL(cemfrac, CPU, m) {
  m.impl("causal_attention_shared_bias", &cemfrac::shared_bias_cpu);
  m.impl("causal_attention_shared_bias_forward", &cemfrac::shared_bias_forward_cpu);
  m.impl("causal_attention_shared_bias_backward", &cemfrac::shared_bias_backward_cpu);
}

TORCH_LIBRARY_IMPL(cemfrac, Meta, m) {
  m.impl("causal_attention_shared_bias", &cemfrac::shared_bias_meta);
  m.impl("causal_attention_shared_bias_forward", &cemfrac::shared_bias_forward_meta);
  m.impl("causal_attention_shared_bias_backward", &cemfrac::shared_bias_backward_meta);
}

TORCH_LIBRARY_IMPL(cemfrac, CompositeExplicitAutograd, m) {
  m.impl("causal_attention_shared_bias", &cemfrac::shared_bias_twin);
  m.impl("causal_attention_shared_bias_forward", &cemfrac::shared_bias_forward_twin);
  m.impl("causal_attention_shared_bias_backward", &cemfrac::shared_bias_backward_twin);
}

TORCH_LIBRARY_IMPL(cemfrac, Autograd, m) {
  m.impl("causal_attention_shared_bias", &cemfrac::shared_bias_autograd);
  m.impl("causal_attention_shared_bias_backward", &cemfrac::shared_bias_backward_autograd);
}
