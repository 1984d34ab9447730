// y = x Wᵀ + b (torch::linear), with inputs of one to eight rows (decoding) read W only once: the
// operator cemfrac::linear (ops/library.h; the CPU kernel below, torch::linear on other devices).
//
// x (..., in) of R rows in all (R = x.numel() / in), on the CPU:
//   R = 1: at::mv / at::addmv, i.e. BLAS gemv, which streams W once (differentiable). LibTorch 1.13
//          sends a one-row linear to sgemm, which packs W before multiplying: at W = 4096 x 512
//          float32, 2 threads, 799 us against at::mv's 219 us (Intel VM, 2026-12-02;
//          docs/history/speed.md, "Batch-1 decoding through gemv").
//   2 <= R <= 8 with no gradient needed (decoding a small batch): kernels::skinny_linear_cpu, which
//          reads each row of W once for all R rows.
// Every other input (R > 8, or a gradient needed for R >= 2) goes to torch::linear unchanged, bit
// for bit. Same function, another summation order.
#pragma once
#include <ATen/core/Tensor.h>

namespace cemfrac {

at::Tensor linear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b = {});

}  // namespace cemfrac
