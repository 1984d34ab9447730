// cemfrac::causal_attention (ops/causal_attention.h), plain causal softmax attention; the two CEM
// variants with a read-out are causal_attention_shared_bias.cpp and causal_attention_head_diag.cpp,
// and what the three share is attention_common.h. LibTorch 1.13 has no public
// scaled_dot_product_attention, so the twin is written with explicit matmuls, a causal mask and a
// softmax; this also keeps the masked entries exact zeros, which the bitwise causality test relies
// on. On the CPU, training and full-sequence forwards take the fused kernel instead
// (kernels/cpu/attention_cpu.cpp), which avoids the batched matmuls' per-call thread fork/join on
// small matrices, the masked_fill and scale passes and four full-size (B, H, N, N) temporaries per
// layer. On CUDA (LibTorch 2.x) ATen's scaled_dot_product_attention.
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

}  // namespace

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
}

TORCH_LIBRARY_IMPL(cemfrac, Meta, m) {
  m.impl("causal_attention", &cemfrac::attention_meta);
  m.impl("causal_attention_forward", &cemfrac::attention_forward_meta);
  m.impl("causal_attention_backward", &cemfrac::attention_backward_meta);
}

TORCH_LIBRARY_IMPL(cemfrac, CompositeExplicitAutograd, m) {
  m.impl("causal_attention", &cemfrac::attention_twin);
  m.impl("causal_attention_forward", &cemfrac::attention_forward_twin);
  m.impl("causal_attention_backward", &cemfrac::attention_backward_twin);
}

TORCH_LIBRARY_IMPL(cemfrac, Autograd, m) {
  m.impl("causal_attention", &cemfrac::attention_autograd);
  m.impl("causal_attention_backward", &cemfrac::attention_backward_autograd);
}
