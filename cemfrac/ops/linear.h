// y = x Wᵀ + b (torch::linear) with a one-row input taken as a matrix-vector product.
//
// x (..., in) with one row in all (x.numel() == in: batch-1 decoding, one token), on the CPU, goes
// to at::mv / at::addmv, i.e. BLAS gemv, which streams W once. LibTorch 1.13 sends a one-row
// linear to sgemm, which packs W before multiplying: at W = 4096 x 512 float32, 2 threads, 799 us
// against at::mv's 219 us (Intel VM, 2026-12-02; docs/results.md, "Batch-1 decoding through
// gemv"). Every other input goes to torch::linear unchanged, bit for bit. Same function, another
// summation order; differentiable (autograd of mv / addmv).
#pragma once
#include <ATen/core/Tensor.h>

namespace cemfrac {

at::Tensor linear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b = {});

}  // namespace cemfrac
