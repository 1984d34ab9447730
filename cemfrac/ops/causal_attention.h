// Causal softmax attention as one differentiable function, beside its plain-ATen twin (the pattern
// of ops/continuant.h):
//
//   causal_attention(q, k, v, offset) = softmax(q k^T / sqrt(d_h) + causal mask) v
//
// q (B, H, N, d_h) at absolute positions offset..offset+N-1; k, v (B, H_kv, T, d_h) at positions
// 0..T-1 (T = offset + N); H a multiple of H_kv (grouped-query attention: query head h reads
// key/value head h / (H / H_kv)). Query n sees keys 0..offset+n. Returns (B, H, N, d_h).
//   - Full sequences (offset 0, T = N) in float32/64 on the CPU: a custom autograd Function over
//   the
//     fused kernel (kernels/cpu/attention_cpu.cpp), which skips most of the hidden upper triangle
//     and keeps masked probabilities exact zeros; values that are the keys (v.is_same(k), CEM) take
//     one gradient for both.
//   - Anything else (a continuation against a decode cache, other devices): explicit matmuls, the
//   mask
//     and a softmax, differentiated by autograd.
//   causal_attention_reference: the same function in the plainest ATen ops (the test oracle).
#pragma once
#include <ATen/core/Tensor.h>

#include <cstdint>

namespace cemfrac {

at::Tensor causal_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            int64_t offset);

at::Tensor causal_attention_reference(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                      int64_t offset);

}  // namespace cemfrac
