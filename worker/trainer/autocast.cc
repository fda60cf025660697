#include "worker/trainer/autocast.h"

#include <ATen/autocast_mode.h>

#include "worker/torch_compat.h"

namespace trainctl::trainer {

using torch_compat::GetAutocastDtype;
using torch_compat::IsAutocastEnabled;
using torch_compat::SetAutocastDtype;
using torch_compat::SetAutocastEnabled;

AutocastGuard::AutocastGuard(bool enabled, c10::DeviceType device, c10::ScalarType dtype)
    : active_(enabled), device_(device) {
  if (!active_) return;
  prev_enabled_ = IsAutocastEnabled(device_);
  prev_dtype_ = GetAutocastDtype(device_);
  SetAutocastEnabled(device_, true);
  SetAutocastDtype(device_, dtype);
  at::autocast::increment_nesting();
}

AutocastGuard::~AutocastGuard() {
  if (!active_) return;
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  SetAutocastEnabled(device_, prev_enabled_);
  SetAutocastDtype(device_, prev_dtype_);
}

}  // namespace trainctl::trainer
