// Learning-rate schedules, evaluated per optimizer step: a pure function of
// (schedule, base lr, step, total steps), so a resumed run gets the same rate
// at the same global step with no scheduler state to checkpoint.
//
// Every schedule starts with `warmup_steps` of linear warm-up from 0 to the
// base rate: step s < W (0-based) uses lr * (s + 1) / W, so the first step
// already moves and step W - 1 uses the full rate. After warm-up:
//   constant  lr
//   step      lr * gamma ^ floor((s - W) / step_size)   (torch StepLR, per step)
//   cosine    min_lr + (lr - min_lr) * (1 + cos(pi * p)) / 2,
//             p = (s - W) / (T - W - 1), so step W uses lr and the last step
//             (s = T - 1) uses exactly min_lr.
//
// Called by the Trainer before every optimizer step. Stateless; thread-safe.
#pragma once

#include <cstdint>

#include "worker/trainer/rank_config.h"

namespace trainctl::trainer {

// Rate for 0-based optimizer step `step` of `total_steps`.
double LearningRateAt(const LrScheduleOptions& schedule, double base_lr, int64_t step,
                      int64_t total_steps);

}  // namespace trainctl::trainer
