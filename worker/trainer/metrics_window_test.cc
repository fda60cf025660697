#include "worker/trainer/metrics_window.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

namespace trainctl::trainer {
namespace {

using Clock = MetricsWindow::Clock;

at::Tensor Loss(double v) { return at::full({}, v, at::TensorOptions().dtype(at::kDouble)); }

TEST(MetricsWindowTest, MeansOverMicroBatchesAndSteps) {
  const Clock::time_point t0 = Clock::now();
  MetricsWindow w(c10::Device(c10::kCPU), t0);
  w.AddMicroBatch(Loss(1.0), 8);
  w.AddMicroBatch(Loss(2.0), 8);
  w.AddStep(/*data_ms=*/2, /*comm_ms=*/4, /*step_ms=*/20);
  w.AddMicroBatch(Loss(6.0), 4);
  w.AddStep(4, 2, 10);
  EXPECT_EQ(w.steps(), 2);
  EXPECT_DOUBLE_EQ(w.MeanLoss(), 3.0);
  EXPECT_DOUBLE_EQ(w.SamplesPerSec(t0 + std::chrono::seconds(2)), 10.0);
  EXPECT_DOUBLE_EQ(w.SamplesPerSec(t0), 0.0);  // no time passed yet
  rankproto::RankMetric m;
  w.FillStepTimes(2, &m);
  EXPECT_DOUBLE_EQ(m.data_ms, 3.0);
  EXPECT_DOUBLE_EQ(m.comm_ms, 3.0);
  EXPECT_DOUBLE_EQ(m.compute_ms, 9.0);  // (30 - 6 - 6) / 2
  // An epoch's divisor may count rolled-back steps too.
  w.FillStepTimes(3, &m);
  EXPECT_DOUBLE_EQ(m.compute_ms, 6.0);
}

TEST(MetricsWindowTest, ComputeTimeNeverNegativeAndEmptyLossIsZero) {
  MetricsWindow w(c10::Device(c10::kCPU), Clock::now());
  EXPECT_DOUBLE_EQ(w.MeanLoss(), 0.0);
  w.AddStep(5, 6, 10);  // clock skew: data + comm above the step
  rankproto::RankMetric m;
  w.FillStepTimes(1, &m);
  EXPECT_DOUBLE_EQ(m.compute_ms, 0.0);
}

TEST(MetricsWindowTest, ResetEmptiesTheWindowAndRestartsItsClock) {
  const Clock::time_point t0 = Clock::now();
  MetricsWindow w(c10::Device(c10::kCPU), t0);
  w.AddMicroBatch(Loss(4.0), 10);
  w.AddStep(1, 1, 5);
  const Clock::time_point t1 = t0 + std::chrono::seconds(5);
  w.Reset(t1);
  EXPECT_EQ(w.steps(), 0);
  EXPECT_DOUBLE_EQ(w.MeanLoss(), 0.0);
  w.AddMicroBatch(Loss(1.0), 6);
  EXPECT_DOUBLE_EQ(w.SamplesPerSec(t1 + std::chrono::seconds(3)), 2.0);
  EXPECT_DOUBLE_EQ(w.MeanLoss(), 1.0);
}

}  // namespace
}  // namespace trainctl::trainer
