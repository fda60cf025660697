#include "worker/trainer/training_policy.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

namespace trainctl::trainer {
namespace {

using ::testing::HasSubstr;

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
  EXPECT_EQ(LossScaleCollapse(h, 4, 1.0),
            "4 steps in a row had NaN/Inf gradients (health.max_skipped_steps: 3)");
  EXPECT_EQ(LossScaleCollapse(h, 0, 1e-5),
            "the loss scale fell to 1e-05, below health.min_loss_scale 0.0001");
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

TEST(DivergenceDetectorTest, ARunThatExplodesInItsFirstWindowIsCaughtAgainstTheFirstStep) {
  // Adam at lr 1e6 (issue #30): the first step's loss is ln(10), the first
  // window's mean already ~3e6.
  DivergenceDetector d(1e4);
  d.SetBaseline(2.3);
  const std::string why = d.AddWindow(3.02e6);
  EXPECT_THAT(why, HasSubstr("health.divergence.factor 10000"));
  EXPECT_THAT(why, HasSubstr("running median 2.3"));
}

TEST(DivergenceDetectorTest, ANormalRunAndASmallLossRisingAgainAreNotDivergence) {
  DivergenceDetector d(1e4);
  d.SetBaseline(2.3);
  for (double loss : {1.2, 0.6, 0.3, 0.1, 0.01, 1e-4, 1e-6, 1e-8})
    EXPECT_EQ(d.AddWindow(loss), "") << loss;
  // 1e4 times the recent losses, but still below where the run started.
  EXPECT_EQ(d.AddWindow(0.5), "");
  // A spike far above the median and the start is caught.
  EXPECT_THAT(d.AddWindow(1e5), HasSubstr("above health.divergence.factor"));
}

TEST(DivergenceDetectorTest, ANonFiniteWindowLossIsDivergenceAndFactorZeroIsOff) {
  DivergenceDetector d(1e4);
  d.SetBaseline(2.3);
  EXPECT_THAT(d.AddWindow(std::numeric_limits<double>::infinity()), HasSubstr("is inf"));
  EXPECT_EQ(d.AddWindow(1.0), "") << "the non-finite value stays out of the median";
  DivergenceDetector off(0);
  off.SetBaseline(2.3);
  EXPECT_FALSE(off.enabled());
  EXPECT_EQ(off.AddWindow(1e30), "");
  EXPECT_EQ(off.AddWindow(std::nan("")), "");
}

TEST(DivergenceDetectorTest, TheMedianSpansEarlierWindowsSoASteadyClimbIsCaught) {
  DivergenceDetector d(100);
  d.SetBaseline(1.0);
  // Ten times per window: the median of what came before lags behind.
  EXPECT_EQ(d.AddWindow(10), "");   // median 1: 10 is not above 100
  EXPECT_EQ(d.AddWindow(100), "");  // median 5.5
  EXPECT_EQ(d.AddWindow(1e3), "");  // median 10: 1000 is not above 1000
  EXPECT_THAT(d.AddWindow(1e4), HasSubstr("running median 55 "));  // (10 + 100) / 2
}

}  // namespace
}  // namespace trainctl::trainer
