// What the three causal-attention operators share (ops/causal_attention*.cpp): input checks, output
// shapes, the causal softmax and its backward, the q/k/v gradients from dS, grouped-query head
// expansion, and when a call takes an operator at all. Internal to ops/.
#pragma once
#include <ATen/ATen.h>

#include <cstdint>
#include <initializer_list>
#include <tuple>

namespace cemfrac::attention {

using Tensor3 = std::tuple<at::Tensor, at::Tensor, at::Tensor>;
using Tensor4 = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>;
using Tensor6 = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>;

// The two operators with a read-out (shared_bias, head_diag) have one signature shape: six inputs
// to (out, read); the forward adds what the backward reads; the backward takes both output
// gradients, the six inputs, the two saved tensors and `tied`.
using WithReadSig = std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&,
                                                       const at::Tensor&, const at::Tensor&,
                                                       const at::Tensor&, const at::Tensor&);
using WithReadForwardSig = Tensor4(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                   const at::Tensor&, const at::Tensor&, const at::Tensor&);
using WithReadBackwardSig = Tensor6(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                    const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                    const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                    const at::Tensor&, bool);

// The operators take full sequences only (offset 0, as many keys as queries): q (B, H, N, d_h),
// k, v (B, H_kv, N, d_h), H a multiple of H_kv. The merged-heads output is (B, N, H, d_h).
void check_qkv(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const char* where);

// float32 or float64: the dtypes the fused CPU kernels take.
bool has_kernel_dtype(const at::Tensor& q);

// Uninitialised outputs: the merged heads (B, N, H, d_h) and the probabilities (B, H, N, N).
at::Tensor empty_merged(const at::Tensor& q);
at::Tensor empty_probs(const at::Tensor& q);

// The no-element tensor that stands for "no separate gradient" (tied values: dk holds both).
at::Tensor none_like(const at::Tensor& t);

// 1 / sqrt(d_h).
double scale_of(const at::Tensor& q);

// (B, H_kv, T, X) -> (B, H, T, X), each key/value head repeated for its H / H_kv query heads in a
// row (repeat_interleave's order), through expand + reshape: sizes that depend on no values, so the
// meta device runs it (LibTorch 1.13's repeat_interleave has no C++ meta kernel).
at::Tensor repeat_heads(const at::Tensor& t, int64_t H);

// (B, H, T, .) -> (B, H_kv, T, .)
at::Tensor sum_heads(const at::Tensor& t, int64_t H_kv);

// P = softmax(logits * scale + causal mask) for logits (B, H, N, N) without the scale.
at::Tensor causal_softmax(const at::Tensor& logits, double scale);

// dS = P (dP - rowsum(dP P)): the softmax's backward (masked entries stay 0 since P is 0 there).
at::Tensor softmax_backward(const at::Tensor& p, const at::Tensor& dp);

// (B, H, N, d_h) -> (B, N, H, d_h) contiguous
at::Tensor merged(const at::Tensor& heads);

// The q, k, v gradients from dS, P and dO (all (B, H, N, .)); tied: dk holds dk + dv, dv none.
//   S = scale q k^T:  dq = scale dS k,  dk = scale dS^T q;   O = P v:  dv = P^T dO
Tensor3 qkv_gradients(const at::Tensor& ds, const at::Tensor& p, const at::Tensor& d_o,
                      const at::Tensor& q, const at::Tensor& k, bool tied);

// A gradient slot autograd left undefined (an output not used) as zeros of its shape.
at::Tensor or_zeros(const at::Tensor& g, at::IntArrayRef shape, const at::Tensor& like);

// Whether a backward's result must be differentiable again (create_graph with a live input).
bool recording(std::initializer_list<at::Tensor> ts);

// Full sequences (offset 0, as many keys as queries) take the operators; continuations against a
// decode cache take the explicit ATen paths (the *_reference functions).
bool full_sequence(const at::Tensor& q, const at::Tensor& k, int64_t offset);

}  // namespace cemfrac::attention
