// The few API differences between LibTorch 1.13 (Debian's libtorch-dev) and LibTorch 2.x (the CUDA
// builds on GPU machines) live here and nowhere else. Code calls the cemfrac::compat names.
#pragma once
#include <torch/version.h>

#define CEMFRAC_TORCH_VERSION_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) ||                  \
   (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))

namespace cemfrac::compat {

// "1.13.1" or "2.4.0".
inline const char* torch_version() { return TORCH_VERSION; }

}  // namespace cemfrac::compat
