#include "worker/trainer/autocast.h"

#include <ATen/autocast_mode.h>
#include <torch/version.h>

namespace trainctl::trainer {
namespace {

#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
// 2.4+: one entry point per device type.
bool IsEnabled(c10::DeviceType d) { return at::autocast::is_autocast_enabled(d); }
void SetEnabled(c10::DeviceType d, bool on) { at::autocast::set_autocast_enabled(d, on); }
c10::ScalarType GetDtype(c10::DeviceType d) { return at::autocast::get_autocast_dtype(d); }
void SetDtype(c10::DeviceType d, c10::ScalarType t) { at::autocast::set_autocast_dtype(d, t); }
#else
// 1.x - 2.3: separate CPU and GPU (CUDA) functions.
bool IsEnabled(c10::DeviceType d) {
  return d == c10::DeviceType::CPU ? at::autocast::is_cpu_enabled() : at::autocast::is_enabled();
}
void SetEnabled(c10::DeviceType d, bool on) {
  if (d == c10::DeviceType::CPU) {
    at::autocast::set_cpu_enabled(on);
  } else {
    at::autocast::set_enabled(on);
  }
}
c10::ScalarType GetDtype(c10::DeviceType d) {
  return d == c10::DeviceType::CPU ? at::autocast::get_autocast_cpu_dtype()
                                   : at::autocast::get_autocast_gpu_dtype();
}
void SetDtype(c10::DeviceType d, c10::ScalarType t) {
  if (d == c10::DeviceType::CPU) {
    at::autocast::set_autocast_cpu_dtype(t);
  } else {
    at::autocast::set_autocast_gpu_dtype(t);
  }
}
#endif

}  // namespace

AutocastGuard::AutocastGuard(bool enabled, c10::DeviceType device, c10::ScalarType dtype)
    : active_(enabled), device_(device) {
  if (!active_) return;
  prev_enabled_ = IsEnabled(device_);
  prev_dtype_ = GetDtype(device_);
  SetEnabled(device_, true);
  SetDtype(device_, dtype);
  at::autocast::increment_nesting();
}

AutocastGuard::~AutocastGuard() {
  if (!active_) return;
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  SetEnabled(device_, prev_enabled_);
  SetDtype(device_, prev_dtype_);
}

}  // namespace trainctl::trainer
