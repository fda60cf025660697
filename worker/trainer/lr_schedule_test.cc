#include "worker/trainer/lr_schedule.h"

#include <cmath>

#include "gtest/gtest.h"

namespace trainctl::trainer {
namespace {

TEST(LrScheduleTest, ConstantWithWarmup) {
  LrScheduleOptions s;
  s.kind = ScheduleKind::kConstant;
  s.warmup_steps = 4;
  EXPECT_DOUBLE_EQ(LearningRateAt(s, 0.1, 0, 100), 0.025);
  EXPECT_DOUBLE_EQ(LearningRateAt(s, 0.1, 1, 100), 0.05);
  EXPECT_DOUBLE_EQ(LearningRateAt(s, 0.1, 3, 100), 0.1);
  EXPECT_DOUBLE_EQ(LearningRateAt(s, 0.1, 4, 100), 0.1);
  EXPECT_DOUBLE_EQ(LearningRateAt(s, 0.1, 99, 100), 0.1);
  s.warmup_steps = 0;
  EXPECT_DOUBLE_EQ(LearningRateAt(s, 0.1, 0, 100), 0.1);
}

TEST(LrScheduleTest, StepDecaysEveryStepSizeAfterWarmup) {
  LrScheduleOptions s;
  s.kind = ScheduleKind::kStep;
  s.step_size = 10;
  s.gamma = 0.5;
  EXPECT_DOUBLE_EQ(LearningRateAt(s, 1.0, 0, 100), 1.0);
  EXPECT_DOUBLE_EQ(LearningRateAt(s, 1.0, 9, 100), 1.0);
  EXPECT_DOUBLE_EQ(LearningRateAt(s, 1.0, 10, 100), 0.5);
  EXPECT_DOUBLE_EQ(LearningRateAt(s, 1.0, 25, 100), 0.25);
  s.warmup_steps = 5;
  EXPECT_DOUBLE_EQ(LearningRateAt(s, 1.0, 4, 100), 1.0);
  EXPECT_DOUBLE_EQ(LearningRateAt(s, 1.0, 14, 100), 1.0);
  EXPECT_DOUBLE_EQ(LearningRateAt(s, 1.0, 15, 100), 0.5);
}

TEST(LrScheduleTest, CosineWithLinearWarmupEndsAtMinLr) {
  LrScheduleOptions s;
  s.kind = ScheduleKind::kCosine;
  s.warmup_steps = 10;
  s.min_lr = 0.001;
  const double lr = 0.1;
  const int64_t total = 110;  // 10 warm-up steps + 100 cosine steps (span 99)
  // Warm-up: linear from lr/10 to lr.
  EXPECT_NEAR(LearningRateAt(s, lr, 0, total), 0.01, 1e-15);
  EXPECT_NEAR(LearningRateAt(s, lr, 4, total), 0.05, 1e-15);
  EXPECT_NEAR(LearningRateAt(s, lr, 9, total), 0.1, 1e-15);
  // First cosine step: the full rate.
  EXPECT_NEAR(LearningRateAt(s, lr, 10, total), 0.1, 1e-15);
  // p = 1/3 and 2/3 of the decay: min + (lr - min) * (1 + cos(p * pi)) / 2.
  EXPECT_NEAR(LearningRateAt(s, lr, 10 + 33, total), 0.001 + 0.099 * 0.75, 1e-12);
  EXPECT_NEAR(LearningRateAt(s, lr, 10 + 66, total), 0.001 + 0.099 * 0.25, 1e-12);
  // Last step: exactly min_lr; monotone in between.
  EXPECT_DOUBLE_EQ(LearningRateAt(s, lr, total - 1, total), 0.001);
  double prev = 1;
  for (int64_t step = 10; step < total; ++step) {
    double v = LearningRateAt(s, lr, step, total);
    EXPECT_LE(v, prev) << step;
    prev = v;
  }
}

TEST(LrScheduleTest, CosineWithoutWarmupAndDegenerateLengths) {
  LrScheduleOptions s;
  s.kind = ScheduleKind::kCosine;
  EXPECT_DOUBLE_EQ(LearningRateAt(s, 1.0, 0, 3), 1.0);
  EXPECT_NEAR(LearningRateAt(s, 1.0, 1, 3), 0.5, 1e-15);
  EXPECT_NEAR(LearningRateAt(s, 1.0, 2, 3), 0.0, 1e-15);
  // One step in total: it is the last one.
  EXPECT_DOUBLE_EQ(LearningRateAt(s, 1.0, 0, 1), 0.0);
}

}  // namespace
}  // namespace trainctl::trainer
