// The few API differences between LibTorch 1.13 (Debian 12's libtorch-dev) and LibTorch 2.x (Debian
// 13's 2.6, measured once; PyPI's 2.11.0+cu130, the pip leg, scripts/pip-leg.sh) live here and
// nowhere else (and in CMakeLists.txt where the difference is in the build: torch's fmt, libtorch.so). Code calls
// the cemfrac::compat names. The top-level CMakeLists.txt checks the version it finds (1.13 or 2.x) and
// says which one it builds against. Measured differences (1.13.1 vs 2.6.0):
// - <torch/linalg.h> is not shipped by Debian's 2.6: code calls the ATen functions
//   (at::linalg_cholesky, at::linalg_solve, at::linalg_solve_triangular), the same in both versions.
// - c10::MemoryReportingInfoBase::reportMemoryUsage takes the two totals as int64_t (1.13) or size_t
//   (2.x): MemoryReportTotal below.
// - c10d: Backend vs ProcessGroup, TCPStoreOptions::useLibUV, glog (the c10d section below).
// - The legacy autograd profiler (cli/step_profile.cpp) is deprecated in 2.x but still built and
//   unchanged in 2.6 (torch/csrc/autograd/profiler_legacy.h), so it needs no branch here.
#pragma once
#include <c10/core/Allocator.h>
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

namespace detail {
template <class C, class R, class P, class A, class T, class U, class D>
T third_parameter(R (C::*)(P, A, T, U, D));
}  // namespace detail

// The type of the totals in c10::MemoryReportingInfoBase::reportMemoryUsage (int64_t in 1.13, size_t
// in 2.x), read from the declaration itself, so an override compiles against either.
using MemoryReportTotal =
    decltype(detail::third_parameter(&c10::MemoryReportingInfoBase::reportMemoryUsage));

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

// c10d (distributed): only cemfrac/dist/process_group.cpp defines CEMFRAC_COMPAT_C10D before
// including this header, with USE_C10D_GLOO set for that file by CMake. Differences handled here:
// - LibTorch 1.13: ProcessGroupGloo derives from c10d::ProcessGroup; 2.x: from c10d::Backend (the
//   collectives we call, allreduce / broadcast / barrier returning intrusive_ptr<c10d::Work>, are
//   on both).
// - 2.x builds with CUDA define USE_C10D_NCCL: CUDA tensors go through ProcessGroupNCCL, CPU
//   tensors through Gloo. Debian's LibTorch has no CUDA, so that branch is compiled only on GPU builds.
// - TCPStoreOptions::useLibUV (2.2+) defaults to true from 2.4, but Debian's 2.6 is built without
//   libuv, so every rendezvous would fail ("use_libuv was requested but PyTorch was build without
//   libuv support"): tcp_store_options() turns it off wherever the field exists.
// - Debian 12's LibTorch logs through glog, Debian 13's through c10's own logger (no glog):
//   QuietTorchLogs silences whichever one is built in.
#ifdef CEMFRAC_COMPAT_C10D
#include <c10/util/Logging.h>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#if defined(C10_USE_GLOG) && __has_include(<glog/logging.h>)
#include <glog/logging.h>
#define CEMFRAC_COMPAT_GLOG 1
#endif
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

namespace detail {
template <class O>
auto no_libuv(O& o, int) -> decltype(o.useLibUV = false, void()) {
  o.useLibUV = false;
}
template <class O>
void no_libuv(O&, long) {}  // 1.13 - 2.1: no libuv option, the classic TCPStore server
}  // namespace detail

// Default TCPStore options, with the libuv server off where LibTorch has the option.
inline c10d::TCPStoreOptions tcp_store_options() {
  c10d::TCPStoreOptions o;
  detail::no_libuv(o, 0);
  return o;
}

// LibTorch's own log messages below fatal are dropped while it lives (c10d logs each failed store
// connection attempt to stderr; the failure becomes our one error line instead).
class QuietTorchLogs {
 public:
#ifdef CEMFRAC_COMPAT_GLOG
  QuietTorchLogs() : old_(FLAGS_minloglevel) {
    FLAGS_minloglevel = google::GLOG_FATAL;
  }
  ~QuietTorchLogs() {
    FLAGS_minloglevel = old_;
  }
#else
  QuietTorchLogs() : old_(FLAGS_caffe2_log_level) {
    FLAGS_caffe2_log_level = c10::GLOG_FATAL;
  }
  ~QuietTorchLogs() {
    FLAGS_caffe2_log_level = old_;
  }
#endif
  QuietTorchLogs(const QuietTorchLogs&) = delete;
  QuietTorchLogs& operator=(const QuietTorchLogs&) = delete;

 private:
  int old_;
};

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
