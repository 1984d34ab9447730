// The Gram matrix W W^T of a matrix W (n, k) as one differentiable function: CEM attention's gram
// recursion forms G = eta W_Q W_Q^T with it (docs/layers/cem.md).
//
//   symmetric_gram(W)            the operator cemfrac::symmetric_gram (ops/library.h): BLAS
//                                syrk on one triangle, mirrored (half a matmul forward);
//                                backward dW = (g + g^T) W, one matmul (autograd through
//                                W.mm(W.t()) runs a full matmul forward and two backward).
//                                Float32/64 on the CPU with a CBLAS that has syrk (OpenBLAS, MKL);
//                                anything else falls back to at::mm(W, W^T), still with the
//                                one-matmul backward.
//   symmetric_gram_reference(W)  W.mm(W.t()) with autograd: the test oracle.
// The backward's matmul is itself differentiable (the saved input is W itself).
#pragma once
#include <ATen/core/Tensor.h>

namespace cemfrac {

at::Tensor symmetric_gram(const at::Tensor& w);
at::Tensor symmetric_gram_reference(const at::Tensor& w);

}  // namespace cemfrac
