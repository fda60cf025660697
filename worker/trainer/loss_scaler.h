// LossScaler: dynamic loss scaling for fp16 mixed precision, with PyTorch's
// torch.cuda.amp.GradScaler defaults and update rule:
//   scale starts at 2^16; a step whose gradients hold an inf/NaN is skipped
//   and the scale is multiplied by 0.5 (backoff); after 2000 consecutive
//   clean steps it is multiplied by 2 (growth).
//
// The Trainer uses it once per optimizer step:
//   (scaler.Scale(loss) / k).backward();   // every micro-batch
//   ddp->FinalizeBackward();               // all-reduces the *scaled* grads
//   bool found_inf = scaler.Unscale(grads); // grads /= scale, in place
//   if (!found_inf) { clip; optimizer.step(); }
//   scaler.Update(found_inf);
// Gradients are identical on every rank after the all-reduce (an inf on one
// rank propagates through the sum), so every rank skips the same steps.
//
// A disabled scaler scales by 1 and never changes its scale; Unscale still
// reports non-finite gradients. The Trainer enables it for fp16 autocast
// only and does not consult it otherwise (bf16 and fp32 runs take every
// step, as in PyTorch without a GradScaler).
//
// Threading: not thread-safe; owned by the training thread.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace trainctl::trainer {

struct LossScalerOptions {
  bool enabled = true;
  double init_scale = 65536.0;
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int64_t growth_interval = 2000;
};

class LossScaler {
 public:
  explicit LossScaler(const LossScalerOptions& options = {});

  bool enabled() const { return options_.enabled; }
  // Current scale (1 when disabled).
  double scale() const { return options_.enabled ? scale_ : 1.0; }
  // Consecutive clean steps since the last growth or backoff.
  int64_t growth_tracker() const { return growth_tracker_; }

  // loss * scale (the loss itself when disabled).
  at::Tensor Scale(const at::Tensor& loss) const;

  // Divides every defined gradient by the scale in place and returns true
  // when any of them holds an inf or NaN (checked after unscaling, as
  // GradScaler does; on CUDA through at::_amp_foreach_non_finite_check_and_unscale_).
  bool Unscale(const std::vector<at::Tensor>& grads) const;

  // After each optimizer step (taken or skipped): backoff on inf/NaN, growth
  // after growth_interval clean steps.
  void Update(bool found_inf);

  // Checkpointed state.
  void Restore(double scale, int64_t growth_tracker);

 private:
  LossScalerOptions options_;
  double scale_;
  int64_t growth_tracker_ = 0;
};

}  // namespace trainctl::trainer
