#include "cemfrac/core/compat.h"

#include <ATen/autocast_mode.h>

#include "cemfrac/core/check.h"

namespace cemfrac::compat {

namespace {

#if CEMFRAC_TORCH_VERSION_AT_LEAST(2, 4)
bool autocast_enabled(c10::DeviceType t) {
  return at::autocast::is_autocast_enabled(t);
}
c10::ScalarType autocast_dtype(c10::DeviceType t) {
  return at::autocast::get_autocast_dtype(t);
}
void set_autocast(c10::DeviceType t, bool enabled, c10::ScalarType dtype) {
  at::autocast::set_autocast_enabled(t, enabled);
  at::autocast::set_autocast_dtype(t, dtype);
}
#else
bool autocast_enabled(c10::DeviceType t) {
  return t == c10::DeviceType::CUDA ? at::autocast::is_enabled() : at::autocast::is_cpu_enabled();
}
c10::ScalarType autocast_dtype(c10::DeviceType t) {
  return t == c10::DeviceType::CUDA ? at::autocast::get_autocast_gpu_dtype()
                                    : at::autocast::get_autocast_cpu_dtype();
}
void set_autocast(c10::DeviceType t, bool enabled, c10::ScalarType dtype) {
  if (t == c10::DeviceType::CUDA) {
    at::autocast::set_enabled(enabled);
    at::autocast::set_autocast_gpu_dtype(dtype);
  } else {
    at::autocast::set_cpu_enabled(enabled);
    at::autocast::set_autocast_cpu_dtype(dtype);
  }
}
#endif

}  // namespace

AutocastGuard::AutocastGuard(c10::DeviceType device_type, c10::ScalarType dtype)
    : device_type_(device_type), was_enabled_(autocast_enabled(device_type)),
      was_dtype_(autocast_dtype(device_type)) {
  CEMFRAC_CHECK(device_type == c10::DeviceType::CPU || device_type == c10::DeviceType::CUDA,
                "mixed precision runs on cpu or cuda, not on {}", c10::DeviceTypeName(device_type));
  set_autocast(device_type, true, dtype);
  at::autocast::increment_nesting();
}

AutocastGuard::~AutocastGuard() {
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  set_autocast(device_type_, was_enabled_, was_dtype_);
}

}  // namespace cemfrac::compat
