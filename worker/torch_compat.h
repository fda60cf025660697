// torch_compat: the one place where trainctl's code meets the differences
// between the LibTorch versions it builds against — Debian 12's 1.13 (CPU),
// Debian 13's 2.6 (CPU) and the 2.x CUDA LibTorch inside a PyTorch wheel on
// GPU machines (2.11 with CUDA 13). Everything else in worker/ spells LibTorch
// the same way for all of them; a version check anywhere but here is a bug.
//
// Versions come from <torch/version.h> (TORCH_VERSION_MAJOR/MINOR). Where a
// difference can be detected from the types themselves (a struct member that
// exists or not) it is, instead of being assumed from the version. (The rank
// rendezvous store is trainctl's own, not c10d's TCPStore, so the TCPStore
// libuv/classic backend choice of 2.x is no longer ours to make.)
//
// Header only; include it from LibTorch code only (it pulls in c10 headers).
// Threading: stateless, except the autocast functions, which act on the
// calling thread's autocast state as LibTorch's own do.
#pragma once

#include <ATen/autocast_mode.h>
#include <c10/core/DeviceType.h>
#include <c10/core/GradMode.h>
#include <c10/core/ScalarType.h>
#include <torch/version.h>

#include <type_traits>
#include <utility>

#if TRAINCTL_NCCL_TORCH_CUDA
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#endif

// True when the LibTorch being compiled against is at least major.minor.
#define TRAINCTL_TORCH_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) ||           \
   (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))

namespace trainctl::torch_compat {

// Autograd off for a scope. `at::NoGradGuard` is reachable from <ATen/ATen.h>
// in 1.13 but not in 2.x; c10's guard is the same class in both.
using NoGradGuard = c10::NoGradGuard;

// ---- autocast (torch.autocast's thread-local state) ----
// 2.4 replaced the per-device functions (is_cpu_enabled, get_autocast_gpu_dtype,
// ...) with one entry point taking the device type; 2.x removed some of the old.
#if TRAINCTL_TORCH_AT_LEAST(2, 4)
inline bool IsAutocastEnabled(c10::DeviceType d) { return at::autocast::is_autocast_enabled(d); }
inline void SetAutocastEnabled(c10::DeviceType d, bool on) {
  at::autocast::set_autocast_enabled(d, on);
}
inline c10::ScalarType GetAutocastDtype(c10::DeviceType d) {
  return at::autocast::get_autocast_dtype(d);
}
inline void SetAutocastDtype(c10::DeviceType d, c10::ScalarType t) {
  at::autocast::set_autocast_dtype(d, t);
}
#else
// 1.x - 2.3: CPU and GPU (CUDA) have separate functions.
inline bool IsAutocastEnabled(c10::DeviceType d) {
  return d == c10::DeviceType::CPU ? at::autocast::is_cpu_enabled() : at::autocast::is_enabled();
}
inline void SetAutocastEnabled(c10::DeviceType d, bool on) {
  if (d == c10::DeviceType::CPU) {
    at::autocast::set_cpu_enabled(on);
  } else {
    at::autocast::set_enabled(on);
  }
}
inline c10::ScalarType GetAutocastDtype(c10::DeviceType d) {
  return d == c10::DeviceType::CPU ? at::autocast::get_autocast_cpu_dtype()
                                   : at::autocast::get_autocast_gpu_dtype();
}
inline void SetAutocastDtype(c10::DeviceType d, c10::ScalarType t) {
  if (d == c10::DeviceType::CPU) {
    at::autocast::set_autocast_cpu_dtype(t);
  } else {
    at::autocast::set_autocast_gpu_dtype(t);
  }
}
#endif

// ---- optimizer ----
namespace internal {
template <typename O, typename = void>
struct ZeroGradTakesSetToNone : std::false_type {};
template <typename O>
struct ZeroGradTakesSetToNone<O, std::void_t<decltype(std::declval<O&>().zero_grad(false))>>
    : std::true_type {};
}  // namespace internal

// optimizer.zero_grad() that keeps every gradient tensor and zeroes it in
// place. 1.x's zero_grad() only does that; 2.x's zero_grad(set_to_none =
// true) drops the tensors by default, and with them gradient_as_bucket_view's
// bucket slices (each would be attached again, at the cost of a copy, every
// step). Told apart by the signature rather than the version.
template <typename Optimizer>
void ZeroGradInPlace(Optimizer& optimizer) {
  if constexpr (internal::ZeroGradTakesSetToNone<Optimizer>::value) {
    optimizer.zero_grad(/*set_to_none=*/false);
  } else {
    optimizer.zero_grad();
  }
}

#if TRAINCTL_NCCL_TORCH_CUDA
// ---- CUDA (only with a CUDA LibTorch) ----
// The stream LibTorch's kernels on `device` are queued on for this thread.
// c10::DeviceIndex is a narrow integer (int8_t in 1.13 and 2.x); the cast
// keeps -Wconversion-style narrowing explicit. The c10::cuda::CUDAStream API
// used here (getCurrentCUDAStream(DeviceIndex), stream()) is unchanged from
// 1.13 to 2.11.
inline cudaStream_t CurrentCudaStream(int device) {
  return c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device)).stream();
}
#endif

}  // namespace trainctl::torch_compat
