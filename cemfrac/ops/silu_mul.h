// The SiLU gate silu(a) * b (SwiGLU's gate times its up projection; the CEM MLP's form A step) as
// one differentiable function, beside its plain-ATen twin (the pattern of ops/rope.h):
//
//   silu_mul(a, b)            a and b of one shape and dtype: the operator cemfrac::silu_mul
//                             (ops/library.h), on the CPU in float32/64 the one-pass kernels
//                             (kernels/cpu/silu_mul_cpu.cpp), elsewhere the twin; under
//                             create_graph its backward operator is built from tensor ops, so it
//                             is differentiable again; broadcasting runs the reference.
//   silu_mul_reference(a, b)  at::silu(a) * b, differentiated by autograd: the test oracle.
#pragma once
#include <ATen/core/Tensor.h>

namespace cemfrac {

at::Tensor silu_mul(const at::Tensor& a, const at::Tensor& b);

at::Tensor silu_mul_reference(const at::Tensor& a, const at::Tensor& b);

}  // namespace cemfrac
