#include "worker/trainer/training_policy.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace trainctl::trainer {

bool CheckpointDueAfterStep(const CheckpointOptions& c, int64_t global_step, bool epoch_done) {
  return !epoch_done && c.every_steps > 0 && global_step % c.every_steps == 0;
}

bool CheckpointDueAfterEpoch(const CheckpointOptions& c, int64_t epoch, int64_t epochs) {
  const bool last = epoch + 1 == epochs;
  return last || (c.every_epochs > 0 && (epoch + 1) % c.every_epochs == 0);
}

bool MetricsDue(int64_t step_in_epoch, int64_t every_steps, bool epoch_done) {
  return step_in_epoch % every_steps == 0 || epoch_done;
}

bool IsRolledBackStep(const std::vector<int64_t>& skip_steps, int64_t global_step) {
  return std::binary_search(skip_steps.begin(), skip_steps.end(), global_step);
}

bool InjectsNanAt(const HealthOptions& h, int rank, int64_t global_step) {
  return rank == 0 && h.debug_nan_at_step > 0 && global_step == h.debug_nan_at_step;
}

std::string LossScaleCollapse(const HealthOptions& h, int64_t skipped_in_a_row, double scale) {
  if (h.max_skipped_steps > 0 && skipped_in_a_row > h.max_skipped_steps) {
    return absl::StrCat(skipped_in_a_row,
                        " steps in a row had NaN/Inf gradients (health.max_skipped_steps: ",
                        h.max_skipped_steps, ")");
  }
  if (h.min_loss_scale > 0 && scale < h.min_loss_scale) {
    return absl::StrFormat("the loss scale fell to %g, below health.min_loss_scale %g", scale,
                           h.min_loss_scale);
  }
  return "";
}

void DivergenceDetector::SetBaseline(double first_step_loss) {
  has_baseline_ = true;
  baseline_ = first_step_loss;
  history_.assign(1, first_step_loss);
}

std::string DivergenceDetector::AddWindow(double window_loss) {
  if (!enabled()) return "";
  std::string why;
  if (!std::isfinite(window_loss)) {
    why = absl::StrFormat("the mean loss over the window is %g", window_loss);
  } else if (has_baseline_ && std::isfinite(baseline_) && !history_.empty()) {
    std::vector<double> sorted = history_;
    const size_t mid = sorted.size() / 2;
    std::nth_element(sorted.begin(), sorted.begin() + static_cast<std::ptrdiff_t>(mid),
                     sorted.end());
    double median = sorted[mid];
    if (sorted.size() % 2 == 0) {
      median = (median + *std::max_element(sorted.begin(),
                                           sorted.begin() + static_cast<std::ptrdiff_t>(mid))) /
               2;
    }
    if (median > 0 && window_loss > factor_ * median && window_loss > baseline_) {
      why = absl::StrFormat(
          "the mean loss over the window, %g, is above health.divergence.factor %g times the "
          "running median %g "
          "(and above the first step's %g)",
          window_loss, factor_, median, baseline_);
    }
  }
  if (std::isfinite(window_loss)) history_.push_back(window_loss);
  if (history_.size() > kHistory) history_.erase(history_.begin());
  return why;
}

int64_t EpochConsumed(int64_t consumed_base, int64_t batches_done, int64_t batch_size,
                      int64_t rank_samples, int64_t world_size, bool epoch_done) {
  if (epoch_done) return 0;
  return consumed_base + std::min(batches_done * batch_size, rank_samples) * world_size;
}

}  // namespace trainctl::trainer
