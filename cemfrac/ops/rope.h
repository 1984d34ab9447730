// Rotary position embedding (Su et al. 2021) as one differentiable function, beside its plain-ATen
// twin (the pattern of ops/continuant.h), in the half-split ("rotate half") layout Llama uses: a
// head vector x = [x1, x2] (each d_h/2 wide) at position p becomes
//     [x1 * cos(p w) - x2 * sin(p w),  x2 * cos(p w) + x1 * sin(p w)].
// The tables cos(p w), sin(p w) come from the layer (layers/base/rope.h, RotaryEmbedding).
//
//   apply_rope(x, cos, sin, inverse)  the operator cemfrac::rope (ops/library.h): on the CPU in
//                                     float32/64 the fused one-pass kernel (kernels/cpu/rope_cpu.cpp)
//                                     whose output keeps x's memory layout, elsewhere the twin; its
//                                     backward is the inverse rotation, the same operator
//                                     (differentiable again). Tables requiring grad, or shapes the
//                                     operator does not take, run the reference.
//   apply_rope_reference(...)         the same function in tensor ops, differentiated by autograd:
//                                     the test oracle (bitwise equal to the fused path).
#pragma once
#include <ATen/core/Tensor.h>

namespace cemfrac {

// x (B, h, N, d_h), cos/sin (N, d_h / 2) -> x rotated, same shape; inverse = rotate by the negative
// angles (R^T x, what sin -> -sin gives).
at::Tensor apply_rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                      bool inverse = false);

// The same function composed of tensor ops (autograd differentiates it): the fused path's oracle.
at::Tensor apply_rope_reference(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                                bool inverse = false);

}  // namespace cemfrac
