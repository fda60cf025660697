#include "worker/trainer/lr_schedule.h"

#include <algorithm>
#include <cmath>

namespace trainctl::trainer {

double LearningRateAt(const LrScheduleOptions& schedule, double base_lr, int64_t step,
                      int64_t total_steps) {
  const int64_t warmup = schedule.warmup_steps;
  if (step < 0) step = 0;
  if (step < warmup) {
    return base_lr * static_cast<double>(step + 1) / static_cast<double>(warmup);
  }
  const int64_t after = step - warmup;
  switch (schedule.kind) {
    case ScheduleKind::kConstant:
      return base_lr;
    case ScheduleKind::kStep: {
      const int64_t period = std::max<int64_t>(schedule.step_size, 1);
      return base_lr * std::pow(schedule.gamma, static_cast<double>(after / period));
    }
    case ScheduleKind::kCosine: {
      const int64_t span = total_steps - warmup - 1;
      if (span <= 0)
        return step >= total_steps - 1 && total_steps > warmup ? schedule.min_lr : base_lr;
      const double p = std::min(1.0, static_cast<double>(after) / static_cast<double>(span));
      return schedule.min_lr + (base_lr - schedule.min_lr) * 0.5 * (1.0 + std::cos(M_PI * p));
    }
  }
  return base_lr;
}

}  // namespace trainctl::trainer
