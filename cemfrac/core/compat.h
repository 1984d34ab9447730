// The few API differences between LibTorch 1.13 (Debian's libtorch-dev) and LibTorch 2.x (the CUDA
// builds on GPU machines) live here and nowhere else. Code calls the cemfrac::compat names.
#pragma once
#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>
#include <torch/version.h>

#define CEMFRAC_TORCH_VERSION_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) ||                  \
   (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))

namespace cemfrac::compat {

// "1.13.1" or "2.4.0".
inline const char* torch_version() {
  return TORCH_VERSION;
}

// Autocast (mixed precision) on one device type for the guard's lifetime, as Python's
// torch.autocast(device_type, dtype): ops on autocast's lists run in `dtype` (matrix products) or
// float32; parameters stay as they are. On exit the previous state returns and the cache of cast
// weights is cleared. LibTorch 1.13 names the setting per backend (set_cpu_enabled,
// set_autocast_cpu_dtype); 2.4+ takes the device type (compat.cpp).
class AutocastGuard {
 public:
  AutocastGuard(c10::DeviceType device_type, c10::ScalarType dtype);
  ~AutocastGuard();
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  c10::DeviceType device_type_;
  bool was_enabled_;
  c10::ScalarType was_dtype_;
};

}  // namespace cemfrac::compat

// c10d (distributed): only cemfrac/train/distributed.cpp defines CEMFRAC_COMPAT_C10D before
// including this header, with USE_C10D_GLOO set for that file by CMake. Differences handled here:
// - LibTorch 1.13: ProcessGroupGloo derives from c10d::ProcessGroup; 2.x: from c10d::Backend (the
//   collectives we call, allreduce / broadcast / barrier returning intrusive_ptr<c10d::Work>, are
//   on both).
// - 2.x builds with CUDA define USE_C10D_NCCL: CUDA tensors go through ProcessGroupNCCL, CPU
// tensors
//   through Gloo. Debian's 1.13 has no CUDA, so that branch is compiled only there.
#ifdef CEMFRAC_COMPAT_C10D
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#if defined(USE_C10D_NCCL)
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

namespace cemfrac::compat {

#if CEMFRAC_TORCH_VERSION_AT_LEAST(2, 0)
using C10dBackend = c10d::Backend;
#else
using C10dBackend = c10d::ProcessGroup;
#endif
using C10dBackendPtr = c10::intrusive_ptr<C10dBackend>;

inline constexpr bool kHaveNccl =
#if defined(USE_C10D_NCCL)
    true;
#else
    false;
#endif

// The process group for tensors on `device`: NCCL for CUDA (where built), Gloo otherwise.
inline C10dBackendPtr make_c10d_backend(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                        int size, std::chrono::milliseconds timeout,
                                        c10::Device device,
                                        std::shared_ptr<::gloo::transport::Device> gloo_device) {
#if defined(USE_C10D_NCCL)
  if (device.is_cuda()) {
    auto options = c10d::ProcessGroupNCCL::Options::create();
    options->timeout = timeout;
    return c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, size, options);
  }
#else
  (void)device;
#endif
  auto options = c10d::ProcessGroupGloo::Options::create(timeout);
  options->devices.push_back(std::move(gloo_device));
  return c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, size, options);
}

}  // namespace cemfrac::compat
#endif  // CEMFRAC_COMPAT_C10D
