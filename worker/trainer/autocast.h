// AutocastGuard: torch.autocast(device_type, dtype) as a C++ scope, for the
// Trainer's forward passes (training and eval).
//
// LibTorch has no RAII autocast guard; this sets the thread-local autocast
// state the way torch.autocast.__enter__/__exit__ do and restores it on exit,
// clearing the cast-weight cache when the outermost guard ends (a stale cache
// would feed the previous step's weights to the next forward). The autocast
// API moved in 2.4 (set_autocast_enabled(device, ...)); worker/torch_compat.h
// hides that, so this guard is the same for LibTorch 1.13 and 2.x.
//
// Threading: autocast state is thread-local; a guard must be destroyed on the
// thread that created it.
#pragma once

#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>

namespace trainctl::trainer {

class AutocastGuard {
 public:
  // enabled == false: a no-op guard.
  AutocastGuard(bool enabled, c10::DeviceType device, c10::ScalarType dtype);
  ~AutocastGuard();
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  const bool active_;
  const c10::DeviceType device_;
  bool prev_enabled_ = false;
  c10::ScalarType prev_dtype_ = c10::ScalarType::Undefined;
};

}  // namespace trainctl::trainer
