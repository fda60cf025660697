// The ranges of the job.yaml integers that two readers check: the validator
// at submit (common/jobspec/validator.cc) and the rank's parser of its flat
// config (worker/trainer/rank_config.cc). One table, so that they cannot
// drift apart (they had: training.grad_accumulation passed the validator up
// to 2^20 and the rank refused it above 2^16, a runtime CONFIG failure for a
// job that had been accepted). spec_bounds_test.cc checks both readers
// against every row.
//
// Header only.
#pragma once

#include <cstdint>
#include <string_view>

namespace trainctl::spec_bounds {

struct IntBound {
  std::string_view key;  // the job.yaml path, as in the flat config
  int64_t lo;
  int64_t hi;
};

inline constexpr IntBound kIntBounds[] = {
    {"model.input_dim", 1, 1 << 24},
    {"model.classes", 1, 1 << 24},
    {"model.conv1_channels", 1, 4096},
    {"model.conv2_channels", 1, 4096},
    {"model.hidden", 1, 1 << 20},  // the CNN's hidden width (an MLP's is a list)
    {"model.image_size", 8, 4096},
    {"data.batch_size", 1, 1 << 20},
    {"data.num_workers", 0, 64},
    {"training.epochs", 1, 1000000},
    {"training.grad_accumulation", 1, 1 << 16},
    {"training.lr_schedule.warmup_steps", 0, 1 << 30},
    {"training.lr_schedule.step_size", 1, 1 << 30},  // 0 while the schedule is not `step`
    {"checkpoint.every_epochs", 0, 1000000},
    {"checkpoint.every_steps", 0, 1000000000},
    {"checkpoint.keep", 1, 1000},
    {"metrics.every_steps", 1, 1000000},
    {"health.max_skipped_steps", 0, 1 << 30},
    {"ddp.powersgd.rank", 1, 1024},
    {"ddp.powersgd.start_iter", 0, 1 << 30},
};

// The row of `key`, or nullptr (each reader says so as an error naming the
// key; spec_bounds_test reads every row through both readers).
inline const IntBound* FindBound(std::string_view key) {
  for (const IntBound& b : kIntBounds) {
    if (b.key == key) return &b;
  }
  return nullptr;
}

}  // namespace trainctl::spec_bounds
