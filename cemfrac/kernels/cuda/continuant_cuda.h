// CUDA kernels for continued-fraction ladders: the GPU twin of kernels/cpu/continuant_cpu.cpp.
// Raw pointers and sizes only (no ATen, no CUDA headers here), so that this header and the .cu file
// build with nvcc alone; the at::Tensor entry points that the ladder operator registers for the
// CUDA dispatch key are in continuant_cuda_aten.cpp (CEMFRAC_CUDA builds only).
//
// Layout and math are the CPU kernel's (kernels.h): a (R, d, L) contiguous, ladder index fastest;
// f = K_{d-1} / K̂_d with the pole guard at eps; r = 1 / K̂_d (the one reciprocal); the backward
// recomputes the continuants from a (or reads k_saved) and applies Proposition 1, or the exact
// derivative of the clamped map when `exact`. One thread per ladder: at every depth step the
// threads of a warp read 32 consecutive ladders, so each load is coalesced and a is read once.
//
// Bits: every multiply and add is an explicitly rounded IEEE operation (no contraction into FMA)
// and the reciprocal is correctly rounded, so a ladder whose continuants stay finite gives bitwise
// the CPU kernel's result. Ladders whose K_d or K_{d-1} overflow (and, in exact mode, ladders
// inside the clamp) take a slow path with a separate binary exponent per continuant, in double (the
// CPU uses long double there): equal to the CPU within one unit in the last place of T.
#pragma once
#include <cstdint>

namespace cemfrac::kernels::cuda {

// stream: a cudaStream_t (nullptr = the legacy default stream). Throws std::runtime_error naming
// the CUDA error if the launch fails. f, a: required; r, k_out: may be null.
template <typename T>
void ladder_forward(const T* a, T* f, T* r, T* k_out, int64_t rows, int64_t depth, int64_t ladders,
                    double eps, void* stream);

// grad_a from grad_f; r the forward's reciprocal; k_saved may be null (recompute, the default).
template <typename T>
void ladder_backward(const T* a, const T* r, const T* k_saved, const T* grad_f, T* grad_a,
                     int64_t rows, int64_t depth, int64_t ladders, double eps, bool exact,
                     void* stream);

}  // namespace cemfrac::kernels::cuda
