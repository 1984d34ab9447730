// RMSNorm (Zhang & Sennrich 2019) over the last dimension as one differentiable function, beside
// its plain-ATen twin (the pattern of ops/rope.h):
//     y = x / sqrt(mean(x^2, -1) + eps) * weight.
//
//   rms_norm(x, weight, eps)            the operator cemfrac::rms_norm (ops/library.h): on the CPU
//                                       in float32/64 the one-pass kernels
//                                       (kernels/cpu/rms_norm_cpu.cpp), elsewhere the twin; its
//                                       backward is cemfrac::rms_norm_backward, whose create_graph
//                                       path is the closed form in tensor ops (differentiable
//                                       again). Shapes the operator does not take run the reference.
//   rms_norm_reference(x, weight, eps)  the same function in tensor ops, differentiated by
//                                       autograd: the test oracle.
#pragma once
#include <ATen/core/Tensor.h>

namespace cemfrac {

// x (..., D), weight (D) -> y of x's shape (contiguous).
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps);

// The same function composed of tensor ops (autograd differentiates it): the fused path's oracle.
at::Tensor rms_norm_reference(const at::Tensor& x, const at::Tensor& weight, double eps);

}  // namespace cemfrac
