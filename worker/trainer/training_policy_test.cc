#include "worker/trainer/training_policy.h"

#include <gtest/gtest.h>

namespace trainctl::trainer {
namespace {

TEST(TrainingPolicyTest, StepCheckpointsEveryNStepsInsideAnEpochOnly) {
  CheckpointOptions c;
  EXPECT_FALSE(CheckpointDueAfterStep(c, 10, false));  // every_steps 0: never
  c.every_steps = 5;
  EXPECT_TRUE(CheckpointDueAfterStep(c, 5, false));
  EXPECT_TRUE(CheckpointDueAfterStep(c, 10, false));
  EXPECT_FALSE(CheckpointDueAfterStep(c, 7, false));
  // The epoch's last step: the epoch checkpoint decides.
  EXPECT_FALSE(CheckpointDueAfterStep(c, 10, true));
}

TEST(TrainingPolicyTest, EpochCheckpointsEveryNEpochsAndAfterTheLast) {
  CheckpointOptions c;
  c.every_epochs = 2;
  EXPECT_FALSE(CheckpointDueAfterEpoch(c, 0, 5));
  EXPECT_TRUE(CheckpointDueAfterEpoch(c, 1, 5));
  EXPECT_FALSE(CheckpointDueAfterEpoch(c, 2, 5));
  EXPECT_TRUE(CheckpointDueAfterEpoch(c, 3, 5));
  EXPECT_TRUE(CheckpointDueAfterEpoch(c, 4, 5));  // the last
  c.every_epochs = 0;
  EXPECT_FALSE(CheckpointDueAfterEpoch(c, 1, 5));
  EXPECT_TRUE(CheckpointDueAfterEpoch(c, 4, 5));
}

TEST(TrainingPolicyTest, MetricsEveryNStepsAndAtTheEpochsEnd) {
  EXPECT_TRUE(MetricsDue(20, 20, false));
  EXPECT_FALSE(MetricsDue(21, 20, false));
  EXPECT_TRUE(MetricsDue(21, 20, true));
  EXPECT_TRUE(MetricsDue(3, 1, false));
}

TEST(TrainingPolicyTest, RolledBackStepsAreThoseListed) {
  const std::vector<int64_t> skip = {3, 17, 40};
  EXPECT_TRUE(IsRolledBackStep(skip, 17));
  EXPECT_FALSE(IsRolledBackStep(skip, 16));
  EXPECT_FALSE(IsRolledBackStep({}, 0));
}

TEST(TrainingPolicyTest, NanIsInjectedOnRankZeroAtTheConfiguredStepOnly) {
  HealthOptions h;
  EXPECT_FALSE(InjectsNanAt(h, 0, 0));  // 0 = never, even at step 0
  h.debug_nan_at_step = 7;
  EXPECT_TRUE(InjectsNanAt(h, 0, 7));
  EXPECT_FALSE(InjectsNanAt(h, 1, 7));
  EXPECT_FALSE(InjectsNanAt(h, 0, 8));
}

TEST(TrainingPolicyTest, LossScaleCollapsesOnTooManySkipsOrATooSmallScale) {
  HealthOptions h;
  h.max_skipped_steps = 3;
  h.min_loss_scale = 1e-4;
  EXPECT_EQ(LossScaleCollapse(h, 3, 1.0), "");
  EXPECT_EQ(LossScaleCollapse(h, 4, 1.0), "4 steps in a row had NaN/Inf gradients (health.max_skipped_steps: 3)");
  EXPECT_EQ(LossScaleCollapse(h, 0, 1e-5), "the loss scale fell to 1e-05, below health.min_loss_scale 0.0001");
  h.max_skipped_steps = 0;
  h.min_loss_scale = 0;
  EXPECT_EQ(LossScaleCollapse(h, 1000, 1e-30), "");  // both checks off
}

TEST(TrainingPolicyTest, EpochConsumedCountsEveryRanksPositions) {
  // 3 batches of 4 on each of 2 ranks, continued after 10 positions.
  EXPECT_EQ(EpochConsumed(10, 3, 4, 100, 2, false), 10 + 12 * 2);
  // The last batch is short: no more than the rank's samples count.
  EXPECT_EQ(EpochConsumed(0, 3, 4, 10, 2, false), 20);
  EXPECT_EQ(EpochConsumed(10, 3, 4, 100, 2, true), 0);
}

}  // namespace
}  // namespace trainctl::trainer
