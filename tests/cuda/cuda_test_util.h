// What the `cuda` tests share: why they cannot run here, as the reason their skip names.
#pragma once
#include <torch/cuda.h>

#include <string>

namespace cemfrac::test {

// Why the CUDA tests cannot run here ("" when they can): a build without CUDA kernels, or no
// device.
inline std::string cuda_unavailable() {
#ifndef CEMFRAC_WITH_CUDA
  return "this build has no CUDA kernels (configure with -DCEMFRAC_CUDA=ON against a CUDA "
         "LibTorch)";
#else
  if (!torch::cuda::is_available()) return "no CUDA device is visible to LibTorch on this machine";
  return "";
#endif
}

}  // namespace cemfrac::test
