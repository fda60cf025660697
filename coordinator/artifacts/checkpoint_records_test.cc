// Checkpoint records: validation of a reported record, `keep` per holder,
// and the newest records.
#include "coordinator/artifacts/checkpoint_records.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"

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

// Fencing: the records keep drops are the files to delete, never the one
// the current attempt resumed from, never another job's.
TEST(CheckpointRecordsTest, DroppedRecordsAreTheFilesToDeleteButNeverTheResumedOne) {
  v1::Job j;
  j.set_id("j");
  j.mutable_spec()->mutable_checkpoint()->set_keep(1);
  auto at = [](const std::string& w, int64_t step) {
    v1::CheckpointRecord r = Record(w, step);
    r.set_path(absl::StrCat("/ck/j.ckpt-epoch-", step, ".", w, ".pt"));
    return r;
  };
  std::vector<v1::CheckpointRecord> dropped;
  AddCheckpointRecord(j, at("a", 10), &dropped);
  EXPECT_TRUE(dropped.empty());
  AddCheckpointRecord(j, at("a", 20), &dropped);
  ASSERT_EQ(dropped.size(), 1u);
  EXPECT_EQ(dropped[0].path(), "/ck/j.ckpt-epoch-10.a.pt");
  // The same step again replaces its record; the file was overwritten, not orphaned.
  dropped.clear();
  AddCheckpointRecord(j, at("a", 20), &dropped);
  EXPECT_TRUE(dropped.empty());
  // Attempt 2 resumed from step 20: that record and file stay while it is current.
  v1::Attempt* a2 = j.add_attempts();
  a2->set_number(2);
  *a2->mutable_resume() = at("a", 20);
  AddCheckpointRecord(j, at("a", 30), &dropped);
  EXPECT_TRUE(dropped.empty());
  EXPECT_THAT(Steps(j, "a"), ::testing::UnorderedElementsAre(20, 30));
  AddCheckpointRecord(j, at("a", 40), &dropped);
  ASSERT_EQ(dropped.size(), 1u);
  EXPECT_EQ(dropped[0].global_step(), 30);
  EXPECT_THAT(Steps(j, "a"), ::testing::UnorderedElementsAre(20, 40));
  // Attempt 3 resumes elsewhere: step 20 goes with the next record.
  v1::Attempt* a3 = j.add_attempts();
  a3->set_number(3);
  *a3->mutable_resume() = at("a", 40);
  dropped.clear();
  AddCheckpointRecord(j, at("a", 50), &dropped);
  std::vector<int64_t> gone;
  for (const auto& d : dropped) gone.push_back(d.global_step());
  EXPECT_THAT(gone, ::testing::UnorderedElementsAre(20));
  EXPECT_THAT(Steps(j, "a"), ::testing::UnorderedElementsAre(40, 50));
}

TEST(CheckpointRecordsTest, EventWordsSayWhereAndInsideWhichEpoch) {
  v1::Job j;
  EXPECT_EQ(AddCheckpointRecord(j, Record("a", 20)),
            "checkpoint at epoch 2 (step 20) on worker a: /ck/j.pt (0 bytes)");
  v1::CheckpointRecord inside = Record("a", 25);
  inside.set_epoch_consumed(640);
  inside.set_shared(true);
  EXPECT_THAT(
      AddCheckpointRecord(j, inside),
      HasSubstr(
          "checkpoint inside epoch 3 after 640 samples (step 25) on the shared checkpoint dir"));
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

namespace trainctl::coordinator {
namespace {

v1::Job JobWithDir(const std::string& id, const std::string& owner, const std::string& dir,
                   int64_t submitted = 0) {
  v1::Job j;
  j.set_id(id);
  j.set_owner(owner);
  j.mutable_spec()->mutable_checkpoint()->set_dir(dir);
  j.mutable_submit_time()->set_seconds(submitted);
  return j;
}

TEST(CheckArtifactPathTest, OnlyTheJobsFilesInItsResolvedDirectoryAreRecorded) {
  const std::string f = "checkpoint.record.path";
  // Absolute checkpoint.dir: that directory, lexically.
  v1::Job abs = JobWithDir("j-1", "alice", "/mnt/ck/");
  EXPECT_TRUE(CheckArtifactPath(abs, "/mnt/ck/j-1.ckpt-epoch-000001.pt", false, f).ok());
  EXPECT_TRUE(CheckArtifactPath(abs, "/mnt/ck/j-1.model.pt", true, f).ok());
  for (const char* bad :
       {"/var/lib/trainctl-worker/worker.key", "/mnt/ck/j-1.model.pt",
        "/mnt/ck/j-2.ckpt-epoch-000001.pt", "/mnt/ck/sub/j-1.ckpt-epoch-000001.pt",
        "/mnt/other/j-1.ckpt-epoch-000001.pt", "/mnt/ck/../ck/j-1.ckpt-epoch-000001.pt"}) {
    absl::Status s = CheckArtifactPath(abs, bad, false, f);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(s.message(), HasSubstr("checkpoint.record.path: '" + std::string(bad) +
                                       "' is not a checkpoint of job j-1"));
    EXPECT_THAT(s.message(), HasSubstr("expected /mnt/ck/j-1.ckpt-epoch-NNNNNN[-CCCCCCCCCC].pt"));
  }
  // Unset: the worker's per-job directory, or <root>/<owner>/<job>.
  v1::Job def = JobWithDir("j-1", "a b", "");
  EXPECT_TRUE(
      CheckArtifactPath(def, "/w/jobs/j-1/checkpoints/j-1.ckpt-epoch-000002.pt", false, f).ok());
  EXPECT_TRUE(CheckArtifactPath(def, "/roots/a_b/j-1/j-1.model.pt", true, f).ok());
  EXPECT_FALSE(CheckArtifactPath(def, "/w/j-1.model.pt", true, f).ok());
  EXPECT_FALSE(CheckArtifactPath(def, "/w/jobs/j-2/checkpoints/j-1.model.pt", true, f).ok());
  // Relative: a directory ending in it (the worker's base is not known here).
  v1::Job rel = JobWithDir("j-1", "alice", "./out/../ck");
  EXPECT_TRUE(CheckArtifactPath(rel, "/home/w/ck/j-1.model.pt", true, f).ok());
  EXPECT_FALSE(CheckArtifactPath(rel, "/home/w/out/j-1.model.pt", true, f).ok());
}

TEST(DirOwnerFromRecordsTest, TheEarliestJobOfADirectoryOwnsIt) {
  v1::Job a = JobWithDir("a-1", "alice", "/ck/shared/", 10);
  v1::Job b = JobWithDir("b-1", "bob", "/ck/shared", 20);
  v1::Job c = JobWithDir("c-1", "carol", "/ck/other", 5);
  v1::Job rel = JobWithDir("r-1", "rita", "ck/shared", 1);
  std::vector<const v1::Job*> jobs = {&b, &c, &a, &rel};
  auto owner = DirOwnerFromRecords(jobs, "/ck/shared");
  ASSERT_TRUE(owner.has_value());
  EXPECT_EQ(owner->first, "alice");
  EXPECT_EQ(owner->second, "a-1");
  EXPECT_FALSE(DirOwnerFromRecords(jobs, "/ck/none").has_value());
}

}  // namespace
}  // namespace trainctl::coordinator
