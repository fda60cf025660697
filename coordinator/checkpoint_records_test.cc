// Checkpoint records: validation of a reported record, `keep` per holder,
// and the newest records.
#include "coordinator/checkpoint_records.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace trainctl::coordinator {
namespace {

using ::testing::HasSubstr;

v1::CheckpointRecord Record(const std::string& worker, int64_t step) {
  v1::CheckpointRecord r;
  r.set_job_id("j");
  r.set_worker_id(worker);
  r.set_global_step(step);
  r.set_epochs_done(step / 10);
  r.set_path("/ck/j.pt");
  return r;
}

std::vector<int64_t> Steps(const v1::Job& j, const std::string& worker) {
  std::vector<int64_t> out;
  for (const v1::CheckpointRecord& r : j.checkpoints()) {
    if (r.worker_id() == worker) out.push_back(r.global_step());
  }
  return out;
}

TEST(CheckpointRecordsTest, KeepsTheNewestPerHolder) {
  v1::Job j;
  j.mutable_spec()->mutable_checkpoint()->set_keep(2);
  for (int64_t step : {10, 20, 30}) AddCheckpointRecord(j, Record("a", step));
  AddCheckpointRecord(j, Record("b", 10));
  EXPECT_THAT(Steps(j, "a"), ::testing::UnorderedElementsAre(20, 30));
  EXPECT_THAT(Steps(j, "b"), ::testing::ElementsAre(10));
  // The same step again replaces its record.
  AddCheckpointRecord(j, Record("a", 30));
  EXPECT_THAT(Steps(j, "a"), ::testing::UnorderedElementsAre(20, 30));
  // Records of another job (a resume's source) stay.
  v1::CheckpointRecord source = Record("a", 5);
  source.set_job_id("older");
  *j.add_checkpoints() = source;
  AddCheckpointRecord(j, Record("a", 40));
  EXPECT_EQ(j.checkpoints_size(), 4);  // a: 30, 40; b: 10; older: 5
  std::vector<const v1::CheckpointRecord*> newest = NewestRecords(j);
  ASSERT_EQ(newest.size(), 1u);
  EXPECT_EQ(newest[0]->global_step(), 40);
}

TEST(CheckpointRecordsTest, EventWordsSayWhereAndInsideWhichEpoch) {
  v1::Job j;
  EXPECT_EQ(AddCheckpointRecord(j, Record("a", 20)), "checkpoint at epoch 2 (step 20) on worker a: /ck/j.pt (0 bytes)");
  v1::CheckpointRecord inside = Record("a", 25);
  inside.set_epoch_consumed(640);
  inside.set_shared(true);
  EXPECT_THAT(AddCheckpointRecord(j, inside),
              HasSubstr("checkpoint inside epoch 3 after 640 samples (step 25) on the shared checkpoint dir"));
}

TEST(CheckpointRecordsTest, ReportedRecordsAreValidated) {
  v1::CheckpointRecord r = Record("a", 1);
  EXPECT_TRUE(ValidateReportedCheckpoint(r).ok());
  r.set_path("relative.pt");
  EXPECT_THAT(ValidateReportedCheckpoint(r).message(), HasSubstr("checkpoint.record.path"));
  r = Record("a", 0);
  EXPECT_THAT(ValidateReportedCheckpoint(r).message(), HasSubstr("global_step >= 1"));
  r = Record("a", 1);
  r.set_checksum(std::string(65, 'f'));
  EXPECT_THAT(ValidateReportedCheckpoint(r).message(), HasSubstr("checkpoint.record.checksum"));
}

}  // namespace
}  // namespace trainctl::coordinator
