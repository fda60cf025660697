// The job's progress from the ranks' latest train points (the slowest
// rank's position, summed throughput, ETA at the slowest rate).
#include "coordinator/jobs/telemetry_ingest.h"

#include <gtest/gtest.h>

namespace trainctl::coordinator {
namespace {

v1::MetricPoint Point(int rank, int epoch, int step, double rate) {
  v1::MetricPoint p;
  p.set_rank(rank);
  p.set_epoch(epoch);
  p.set_step(step);
  p.set_steps_per_epoch(100);
  p.set_samples_per_sec(rate);
  p.set_samples_seen(1000);
  p.set_loss(0.5 + rank);
  return p;
}

TEST(TelemetryIngestTest, GlobalStepCountsWholeEpochs) {
  EXPECT_EQ(GlobalStep(Point(0, 2, 7, 1)), 207);
  v1::MetricPoint no_epoch_length = Point(0, 2, 7, 1);
  no_epoch_length.set_steps_per_epoch(0);
  EXPECT_EQ(GlobalStep(no_epoch_length), 9);
}

TEST(TelemetryIngestTest, ProgressIsTheSlowestRanksWithSummedThroughput) {
  v1::Job job;
  job.mutable_spec()->mutable_training()->set_epochs(3);
  job.mutable_spec()->mutable_training()->set_grad_accumulation(1);
  job.mutable_spec()->mutable_data()->set_batch_size(10);
  absl::flat_hash_map<int32_t, v1::MetricPoint> last;
  last[0] = Point(0, 1, 50, 200);
  last[1] = Point(1, 1, 40, 100);  // slowest
  v1::Progress p = ProgressFromPoints(job, last, v1::Progress());
  EXPECT_EQ(p.epoch(), 1);
  EXPECT_EQ(p.step(), 40);
  EXPECT_EQ(p.samples_seen(), 2000);
  EXPECT_DOUBLE_EQ(p.samples_per_sec(), 300);
  EXPECT_DOUBLE_EQ(p.last_loss(), 0.5);  // rank 0's
  // 300 steps in all, 140 done by the slowest rank, at 100/10 steps/s.
  EXPECT_DOUBLE_EQ(p.eta_seconds(), 16);
  // No points: the progress given is kept.
  v1::Progress before;
  before.set_eta_seconds(-1);
  EXPECT_DOUBLE_EQ(ProgressFromPoints(job, {}, before).eta_seconds(), -1);
}

// A script's windows carry what it reported: one without a rate adds no 0
// to the throughput (nor a 0 minimum to the ETA), one without a loss keeps
// the last loss reported.
TEST(TelemetryIngestTest, ProgressTakesOnlyReportedFields) {
  v1::Job job;
  job.mutable_spec()->mutable_training()->set_epochs(3);
  job.mutable_spec()->mutable_training()->set_grad_accumulation(1);
  job.mutable_spec()->mutable_data()->set_batch_size(10);
  absl::flat_hash_map<int32_t, v1::MetricPoint> last;
  last[0] = Point(0, 1, 50, 200);
  last[0].clear_loss();
  last[1] = Point(1, 1, 40, 100);
  last[1].clear_samples_per_sec();
  v1::Progress before;
  before.set_last_loss(0.25);
  v1::Progress p = ProgressFromPoints(job, last, before);
  EXPECT_DOUBLE_EQ(p.samples_per_sec(), 200) << "rank 1 reported no rate";
  EXPECT_DOUBLE_EQ(p.last_loss(), 0.25) << "rank 0 reported no loss this time";
  // 160 steps left at rank 0's 200/10 steps/s (the only rate there is).
  EXPECT_DOUBLE_EQ(p.eta_seconds(), 8);
  EXPECT_FALSE(ProgressFromPoints(job, last, v1::Progress()).has_last_loss());
}

}  // namespace
}  // namespace trainctl::coordinator
