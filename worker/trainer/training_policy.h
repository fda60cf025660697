// The training loop's decisions, as pure functions of its options and
// position: when to checkpoint, when to report metrics, which steps a NaN
// rollback passes over, when fp16 loss scaling has collapsed, and how much of
// an epoch's sample order a checkpoint records as consumed. The Trainer
// (trainer.cc, trainer_step.cc) asks these; training_policy_test.cc pins
// them down.
//
// Threading: stateless functions; thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "worker/trainer/rank_config.h"

namespace trainctl::trainer {

// Whether the checkpoint writer saves after the optimizer step that made the
// global step count `global_step`, inside an epoch (the epoch's last step
// is covered by CheckpointDueAfterEpoch instead).
bool CheckpointDueAfterStep(const CheckpointOptions& c, int64_t global_step, bool epoch_done);

// Whether the checkpoint writer saves after epoch `epoch` (0-based) of
// `epochs`: every checkpoint.every_epochs epochs, and always after the last.
bool CheckpointDueAfterEpoch(const CheckpointOptions& c, int64_t epoch, int64_t epochs);

// Whether a "train" metric is due after the step that brought the epoch to
// `step_in_epoch` steps: every `every_steps` steps and at the epoch's end.
bool MetricsDue(int64_t step_in_epoch, int64_t every_steps, bool epoch_done);

// Whether a rollback passes over `global_step` (`skip_steps` sorted).
bool IsRolledBackStep(const std::vector<int64_t>& skip_steps, int64_t global_step);

// Whether this rank injects the health.debug_nan_at_step NaN (rank 0 only).
bool InjectsNanAt(const HealthOptions& h, int rank, int64_t global_step);

// Why fp16 loss scaling counts as collapsed after a step, "" when it has
// not: more than health.max_skipped_steps skipped steps in a row, or a scale
// below health.min_loss_scale (each check off at 0).
std::string LossScaleCollapse(const HealthOptions& h, int64_t skipped_in_a_row, double scale);

// Divergence (health.divergence.factor): fed the loss of an attempt's first
// step, then each "train" window's mean loss over every rank, it says when
// a window's loss ran away: above `factor` times the median of the values
// before it (the first step's among them, so a run that diverges within its
// first window is caught) and above the first step's loss (a run still below
// where it started has not diverged, however small its median). Every rank
// feeds it the same all-reduced values, so every rank decides alike.
class DivergenceDetector {
 public:
  // `factor` <= 0: never diverges.
  explicit DivergenceDetector(double factor) : factor_(factor) {}

  bool enabled() const { return factor_ > 0; }
  bool has_baseline() const { return has_baseline_; }
  // The attempt's first step's loss (mean over every rank).
  void SetBaseline(double first_step_loss);
  // A window's mean loss: "" when it did not diverge, else why it did. The
  // value joins the history either way (the median is over at most the
  // last kHistory values).
  std::string AddWindow(double window_loss);

  static constexpr size_t kHistory = 1000;

 private:
  double factor_;
  bool has_baseline_ = false;
  double baseline_ = 0;
  std::vector<double> history_;  // oldest first, at most kHistory
};

// How many positions of the epoch's sampler order all ranks together have
// consumed after `batches_done` batches of this attempt (every rank takes the
// same number of positions, skipped steps too), counted from
// `consumed_base`, where the epoch was continued; 0 once the epoch is done.
int64_t EpochConsumed(int64_t consumed_base, int64_t batches_done, int64_t batch_size,
                      int64_t rank_samples, int64_t world_size, bool epoch_done);

}  // namespace trainctl::trainer
