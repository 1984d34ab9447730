// CUDA ladder kernels (continuant_cuda.h has the contract; the per-ladder math, shared with a host
// test, is continuant_cuda_math.h). One thread per ladder, a grid-stride loop over the R * L
// ladders.
#include <cuda_runtime.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#include "cemfrac/kernels/cuda/continuant_cuda.h"
#include "cemfrac/kernels/cuda/continuant_cuda_math.h"

namespace cemfrac::kernels::cuda {
namespace {

template <typename T>
__global__ void forward_kernel(const T* __restrict__ a, T* __restrict__ f, T* __restrict__ r,
                               T* __restrict__ k_out, int64_t rows, int64_t d, int64_t L, T eps) {
  const int64_t n = rows * L;
  for (int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; idx < n;
       idx += int64_t(gridDim.x) * blockDim.x) {
    const int64_t row = idx / L, l = idx - row * L;
    T fv, rv;
    math::forward_one<T>(a + row * d * L + l, L, d, eps,
                         k_out != nullptr ? k_out + row * d * L + l : nullptr, &fv, &rv);
    f[row * L + l] = fv;
    if (r != nullptr) r[row * L + l] = rv;
  }
}

template <typename T>
__global__ void backward_kernel(const T* __restrict__ a, const T* __restrict__ r,
                                const T* __restrict__ k_saved, const T* __restrict__ grad_f,
                                T* __restrict__ grad_a, int64_t rows, int64_t d, int64_t L, T eps,
                                bool exact) {
  const int64_t n = rows * L;
  for (int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; idx < n;
       idx += int64_t(gridDim.x) * blockDim.x) {
    const int64_t row = idx / L, l = idx - row * L;
    math::backward_one<T>(
        a + row * d * L + l, k_saved != nullptr ? k_saved + row * d * L + l : nullptr, L, d,
        r[row * L + l], grad_f[row * L + l], eps, exact, grad_a + row * d * L + l);
  }
}

constexpr int kThreads = 256;

int blocks_for(int64_t n) {
  // Enough blocks to fill any current GPU several times over; the grid-stride loop covers the rest.
  const int64_t b = (n + kThreads - 1) / kThreads;
  return static_cast<int>(b < 65535 ? (b < 1 ? 1 : b) : 65535);
}

void check_launch(const char* what) {
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) {
    throw std::runtime_error(std::string(what) +
                             ": CUDA launch failed: " + cudaGetErrorString(err));
  }
}

}  // namespace

template <typename T>
void ladder_forward(const T* a, T* f, T* r, T* k_out, int64_t rows, int64_t depth, int64_t ladders,
                    double eps, void* stream) {
  const int64_t n = rows * ladders;
  if (n == 0) return;
  forward_kernel<T><<<blocks_for(n), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      a, f, r, k_out, rows, depth, ladders, static_cast<T>(eps));
  check_launch("continuant forward");
}

template <typename T>
void ladder_backward(const T* a, const T* r, const T* k_saved, const T* grad_f, T* grad_a,
                     int64_t rows, int64_t depth, int64_t ladders, double eps, bool exact,
                     void* stream) {
  const int64_t n = rows * ladders;
  if (n == 0) return;
  backward_kernel<T><<<blocks_for(n), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      a, r, k_saved, grad_f, grad_a, rows, depth, ladders, static_cast<T>(eps), exact);
  check_launch("continuant backward");
}

template void ladder_forward<float>(const float*, float*, float*, float*, int64_t, int64_t, int64_t,
                                    double, void*);
template void ladder_forward<double>(const double*, double*, double*, double*, int64_t, int64_t,
                                     int64_t, double, void*);
template void ladder_backward<float>(const float*, const float*, const float*, const float*, float*,
                                     int64_t, int64_t, int64_t, double, bool, void*);
template void ladder_backward<double>(const double*, const double*, const double*, const double*,
                                      double*, int64_t, int64_t, int64_t, double, bool, void*);

}  // namespace cemfrac::kernels::cuda
