// Causal softmax attention as one differentiable function, beside its plain-ATen twin (the pattern
// of ops/continuant.h):
//
//   causal_attention(q, k, v, offset) = softmax(q k^T / sqrt(d_h) + causal mask) v
//
// q (B, H, N, d_h) at absolute positions offset..offset+N-1; k, v (B, H_kv, T, d_h) at positions
// 0..T-1 (T = offset + N); H a multiple of H_kv (grouped-query attention: query head h reads
// key/value head h / (H / H_kv)). Query n sees keys 0..offset+n. Returns (B, H, N, d_h).
//   - Full sequences (offset 0, T = N): the operator cemfrac::causal_attention (ops/library.h); on
//     the CPU in float32/64 the fused kernel (kernels/cpu/attention_cpu.cpp), which skips most of
//     the hidden upper triangle and keeps masked probabilities exact zeros; values that are the
//     keys (v.is_same(k), CEM) take one gradient for both. On CUDA (float32, bfloat16, float16)
//     ATen's scaled_dot_product_attention, differentiated by its own autograd (no (B, H, N, N)
//     matrix). Elsewhere the twin; the backward is an operator too, whose create_graph path is
//     the closed form in tensor ops (second derivatives).
//   - Anything else (a continuation against a decode cache, other devices): explicit matmuls,
//     the mask and a softmax, differentiated by autograd.
//   causal_attention_reference: the same function in the plainest ATen ops (the test oracle).
#pragma once
#include <ATen/core/Tensor.h>

#include <cstdint>

namespace cemfrac {

at::Tensor causal_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            int64_t offset);

at::Tensor causal_attention_reference(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                      int64_t offset);

// Causal attention with one logit bias a b^T shared by every head, and the heads' probabilities
// summed and read out once against r (CEM attention's shared D+LR diagonal, docs/layers/cem.md):
//
//   P_k = softmax((q_k k_k^T + a b^T) / sqrt(d_h) + causal mask),   out_k = P_k v_k,
//   read = (sum_k P_k) r
//
// q, k, v as for causal_attention; a (B, N, E) at the queries' positions, b (B, T, E) and r
// (B, T, F) at the keys'. Returns out (B, H, N, d_h) and read (B, N, F). Full sequences in
// float32/64 on the CPU take the fused kernel (kernels/cpu/attention_cpu.cpp: the (N, T) bias is
// made once per query block and never stored, the summed probabilities are read out block by
// block), elsewhere the twin (operator cemfrac::causal_attention_shared_bias); continuations
// against a cache run the reference.
struct AttentionWithRead {
  at::Tensor out, read;
};
AttentionWithRead causal_attention_shared_bias(const at::Tensor& q, const at::Tensor& k,
                                               const at::Tensor& v, const at::Tensor& a,
                                               const at::Tensor& b, const at::Tensor& r,
                                               int64_t offset);
AttentionWithRead causal_attention_shared_bias_reference(const at::Tensor& q, const at::Tensor& k,
                                                         const at::Tensor& v, const at::Tensor& a,
                                                         const at::Tensor& b, const at::Tensor& r,
                                                         int64_t offset);

// Causal attention with a diagonal logit term of its own per head, each head read out against h
// and the read-outs summed (CEM attention's per-head bilinear D+LR diagonal, docs/layers/cem.md):
//
//   P_k = softmax((q_k k_k^T + (delta_k . x) h^T) / sqrt(d_h) + causal mask),   out_k = P_k v_k,
//   read = sum_k delta_k . (P_k h)
//
// q, k, v as for causal_attention; x (B, N, D) at the queries' positions, h (B, T, D) at the keys',
// delta (H, D). Returns out (B, H, N, d_h) and read (B, N, D). Full sequences in float32/64 on the
// CPU take the fused kernel (kernels/cpu/attention_cpu.cpp: no (B, H, N, d_h + D) augmented heads,
// no (B, H, N, D) products of delta and x, the heads' read-outs summed inside), elsewhere the twin
// (operator cemfrac::causal_attention_head_diag); continuations against a cache run the reference.
AttentionWithRead causal_attention_head_diag(const at::Tensor& q, const at::Tensor& k,
                                             const at::Tensor& v, const at::Tensor& x,
                                             const at::Tensor& h, const at::Tensor& delta,
                                             int64_t offset);
AttentionWithRead causal_attention_head_diag_reference(const at::Tensor& q, const at::Tensor& k,
                                                       const at::Tensor& v, const at::Tensor& x,
                                                       const at::Tensor& h, const at::Tensor& delta,
                                                       int64_t offset);

}  // namespace cemfrac
