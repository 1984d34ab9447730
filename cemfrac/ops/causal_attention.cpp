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

#include <cmath>
#include <limits>

#include "cemfrac/kernels/kernels.h"

namespace cemfrac {
namespace {

// softmax(scale q k^T + causal mask) v for q (B, H, N, d_h), k, v (B, H_kv, N, d_h), offset 0, over
// kernels::causal_attention_{forward,backward}_cpu. Returns (B, N, H, d_h) contiguous. Tied (the
// CEM case, values are the keys): called with v = k, it returns one gradient for both, dk = dS^T q
// + P^T dO accumulated in one buffer, instead of two that autograd would then add.
class FusedCausalAttention : public torch::autograd::Function<FusedCausalAttention> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& q_in,
                            const at::Tensor& k_in, const at::Tensor& v_in, bool tied) {
    const at::Tensor q = kernels::attention_rows_cpu(q_in.detach());
    const at::Tensor k = kernels::attention_rows_cpu(k_in.detach());
    const at::Tensor v = tied ? k : kernels::attention_rows_cpu(v_in.detach());
    const int64_t B = q.size(0), H = q.size(1), N = q.size(2), d_h = q.size(3);
    at::Tensor p = at::empty({B, H, N, N}, q.options());      // probabilities (saved)
    at::Tensor out = at::empty({B, N, H, d_h}, q.options());  // merged-heads layout
    kernels::causal_attention_forward_cpu(q, k, v, p, out);
    ctx->save_for_backward({q, k, v});
    ctx->saved_data["p"] = p;
    ctx->saved_data["tied"] = tied;
    return out;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &q = saved[0], &k = saved[1], &v = saved[2];
    const at::Tensor p = ctx->saved_data["p"].toTensor();
    const bool tied = ctx->saved_data["tied"].toBool();
    const at::Tensor d_out = grads[0].contiguous();  // (B, N, H, d_h)
    // The gradients take their inputs' memory layout (a transposed view of (B, N, H, d_h) from
    // split_heads stays one), so the view and reshape backward of the projections need no copy.
    at::Tensor dq = at::empty_like(q), dk = at::empty_like(k);
    at::Tensor dv = tied ? dk : at::empty_like(v);
    kernels::causal_attention_backward_cpu(q, k, v, p, d_out, tied, dq, dk, dv);
    if (tied) return {dq, dk, at::Tensor(), at::Tensor()};
    return {dq, dk, dv, at::Tensor()};
  }
};

// The shared-bias variant over kernels::causal_attention_shared_bias_{forward,backward}_cpu.
// Returns out (B, N, H, d_h) contiguous and read (B, N, F).
class FusedSharedBiasAttention : public torch::autograd::Function<FusedSharedBiasAttention> {
 public:
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx,
                                                const at::Tensor& q_in, const at::Tensor& k_in,
                                                const at::Tensor& v_in, const at::Tensor& a_in,
                                                const at::Tensor& b_in, const at::Tensor& r_in,
                                                bool tied) {
    const at::Tensor q = kernels::attention_rows_cpu(q_in.detach());
    const at::Tensor k = kernels::attention_rows_cpu(k_in.detach());
    const at::Tensor v = tied ? k : kernels::attention_rows_cpu(v_in.detach());
    const at::Tensor a = a_in.detach().contiguous(), b = b_in.detach().contiguous(),
                     r = r_in.detach().contiguous();
    const int64_t B = q.size(0), H = q.size(1), N = q.size(2), d_h = q.size(3);
    at::Tensor p = at::empty({B, H, N, N}, q.options());
    at::Tensor psum = at::empty({B, N, N}, q.options());
    at::Tensor out = at::empty({B, N, H, d_h}, q.options());
    at::Tensor read = at::empty({B, N, r.size(2)}, q.options());
    kernels::causal_attention_shared_bias_forward_cpu(q, k, v, a, b, r, p, psum, out, read);
    ctx->save_for_backward({q, k, v, a, b, r});
    ctx->saved_data["p"] = p;
    ctx->saved_data["psum"] = psum;
    ctx->saved_data["tied"] = tied;
    return {out, read};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &q = saved[0], &k = saved[1], &v = saved[2];
    const at::Tensor &a = saved[3], &b = saved[4], &r = saved[5];
    const at::Tensor p = ctx->saved_data["p"].toTensor();
    const at::Tensor psum = ctx->saved_data["psum"].toTensor();
    const bool tied = ctx->saved_data["tied"].toBool();
    const int64_t B = q.size(0), H = q.size(1), N = q.size(2), d_h = q.size(3);
    const at::Tensor d_out =
        grads[0].defined() ? grads[0].contiguous() : at::zeros({B, N, H, d_h}, q.options());
    const at::Tensor d_read =
        grads[1].defined() ? grads[1].contiguous() : at::zeros({B, N, r.size(2)}, q.options());
    at::Tensor dq = at::empty_like(q), dk = at::empty_like(k);
    at::Tensor dv = tied ? dk : at::empty_like(v);
    at::Tensor da = at::empty_like(a), db = at::empty_like(b), dr = at::empty_like(r);
    kernels::causal_attention_shared_bias_backward_cpu(q, k, v, a, b, r, p, psum, d_out, d_read,
                                                       tied, dq, dk, dv, da, db, dr);
    return {dq, dk, tied ? at::Tensor() : dv, da, db, dr, at::Tensor()};
  }
};

// The per-head diagonal over kernels::causal_attention_head_diag_{forward,backward}_cpu. Returns
// out (B, N, H, d_h) contiguous and read (B, N, D).
class FusedHeadDiagAttention : public torch::autograd::Function<FusedHeadDiagAttention> {
 public:
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx,
                                                const at::Tensor& q_in, const at::Tensor& k_in,
                                                const at::Tensor& v_in, const at::Tensor& x_in,
                                                const at::Tensor& h_in, const at::Tensor& delta_in,
                                                bool tied) {
    const at::Tensor q = kernels::attention_rows_cpu(q_in.detach());
    const at::Tensor k = kernels::attention_rows_cpu(k_in.detach());
    const at::Tensor v = tied ? k : kernels::attention_rows_cpu(v_in.detach());
    const at::Tensor x = x_in.detach().contiguous(), h = h_in.detach().contiguous(),
                     delta = delta_in.detach().contiguous();
    const int64_t B = q.size(0), H = q.size(1), N = q.size(2), d_h = q.size(3), D = x.size(2);
    at::Tensor p = at::empty({B, H, N, N}, q.options());
    at::Tensor read = at::empty({B, H, N, D}, q.options());
    at::Tensor out = at::empty({B, N, H, d_h}, q.options());
    at::Tensor diag = at::empty({B, N, D}, q.options());
    kernels::causal_attention_head_diag_forward_cpu(q, k, v, x, h, delta, p, read, out, diag);
    ctx->save_for_backward({q, k, v, x, h, delta});
    ctx->saved_data["p"] = p;
    ctx->saved_data["read"] = read;
    ctx->saved_data["tied"] = tied;
    return {out, diag};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &q = saved[0], &k = saved[1], &v = saved[2];
    const at::Tensor &x = saved[3], &h = saved[4], &delta = saved[5];
    const at::Tensor p = ctx->saved_data["p"].toTensor();
    const at::Tensor read = ctx->saved_data["read"].toTensor();
    const bool tied = ctx->saved_data["tied"].toBool();
    const int64_t B = q.size(0), H = q.size(1), N = q.size(2), d_h = q.size(3), D = x.size(2);
    const at::Tensor d_out =
        grads[0].defined() ? grads[0].contiguous() : at::zeros({B, N, H, d_h}, q.options());
    const at::Tensor d_diag =
        grads[1].defined() ? grads[1].contiguous() : at::zeros({B, N, D}, q.options());
    at::Tensor dq = at::empty_like(q), dk = at::empty_like(k);
    at::Tensor dv = tied ? dk : at::empty_like(v);
    at::Tensor dx = at::empty_like(x), dh = at::empty_like(h);
    at::Tensor d_delta_rows = at::empty({B, H, D}, q.options());
    kernels::causal_attention_head_diag_backward_cpu(q, k, v, x, h, delta, p, read, d_out, d_diag,
                                                     tied, dq, dk, dv, dx, dh, d_delta_rows);
    // The batch rows' shares summed in row order: the same bits for any thread count.
    at::Tensor d_delta = d_delta_rows[0].clone();
    for (int64_t b = 1; b < B; ++b) d_delta.add_(d_delta_rows[b]);
    return {dq, dk, tied ? at::Tensor() : dv, dx, dh, d_delta, at::Tensor()};
  }
};

}  // namespace

AttentionWithRead causal_attention_head_diag(const at::Tensor& q, const at::Tensor& k,
                                             const at::Tensor& v, const at::Tensor& x,
                                             const at::Tensor& h, const at::Tensor& delta,
                                             int64_t offset) {
  const int64_t N = q.size(2), T = k.size(2);
  if (offset == 0 && N == T && q.device().is_cpu() &&
      (q.scalar_type() == at::kFloat || q.scalar_type() == at::kDouble)) {
    const auto o = FusedHeadDiagAttention::apply(q, k, v, x, h, delta, v.is_same(k));
    return {o[0].permute({0, 2, 1, 3}), o[1]};  // out as a (B, H, N, d_h) view
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
  const int64_t N = q.size(2), T = k.size(2);
  if (offset == 0 && N == T && q.device().is_cpu() &&
      (q.scalar_type() == at::kFloat || q.scalar_type() == at::kDouble)) {
    const auto o = FusedSharedBiasAttention::apply(q, k, v, a, b, r, v.is_same(k));
    return {o[0].permute({0, 2, 1, 3}), o[1]};  // out as a (B, H, N, d_h) view
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
  if (offset == 0 && N == T && q.device().is_cpu() &&
      (q.scalar_type() == at::kFloat || q.scalar_type() == at::kDouble)) {
    // Values that are the keys (one tensor, CEM) take the tied kernel: one gradient for both.
    return FusedCausalAttention::apply(q, k, v, v.is_same(k))
        .permute({0, 2, 1, 3});  // (B, H, N, d_h) view
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

}  // namespace cemfrac
