// Failure classes through the JobManager: each class's action, out of memory,
// NaN rollbacks and their budget, cancel, and pre-flight.
#include "coordinator/jobs/job_manager_fixture.h"

#include "coordinator/jobs/attempt_failure.h"

namespace trainctl::coordinator {
namespace {

TEST_F(JobManagerTest, EachFailureClassHasItsAction) {
  struct Row {
    v1::FailureKind kind;
    bool restarts;
  };
  const std::vector<Row> rows = {
      {v1::FAILURE_KIND_CONFIG, false},
      {v1::FAILURE_KIND_DATA, false},
      {v1::FAILURE_KIND_OUT_OF_MEMORY, false},
      {v1::FAILURE_KIND_PREFLIGHT, false},
      {v1::FAILURE_KIND_EXIT, true},
      {v1::FAILURE_KIND_SIGNAL, true},
      {v1::FAILURE_KIND_COLLECTIVE, true},
      {v1::FAILURE_KIND_RENDEZVOUS, true},
      {v1::FAILURE_KIND_LAUNCH, true},
      {v1::FAILURE_KIND_USER_CODE, true},
      {v1::FAILURE_KIND_HANG, true},
      {v1::FAILURE_KIND_DISK_FULL, true},
      {v1::FAILURE_KIND_NAN, true},
  };
  for (size_t i = 0; i < rows.size(); ++i) {
    const Row& row = rows[i];
    SCOPED_TRACE(v1::FailureKind_Name(row.kind));
    AddWorker(absl::StrCat("w", i), 1);  // a free slot for this row's job
    auto job = jobs_->Submit(Spec(1));
    ASSERT_TRUE(job.ok()) << job.status();
    ASSERT_EQ(Get(job->id()).attempts_size(), 1);
    const std::string worker = Get(job->id()).attempts(0).ranks(0).worker_id();
    ASSERT_TRUE(Status(worker, job->id(), 1, 0, v1::RANK_STATE_FAILED, row.kind, 1).ok());
    v1::Job j = Get(job->id());
    EXPECT_EQ(j.attempts(0).failure_kind(), row.kind);
    EXPECT_EQ(j.state() != v1::JOB_STATE_FAILED, row.restarts) << j.state_reason();
    // A full disk waits for space: the next attempt after a backoff (2 s),
    // not counted as a restart.
    const bool waits_for_space = row.kind == v1::FAILURE_KIND_DISK_FULL;
    EXPECT_EQ(j.attempts_size(), row.restarts && !waits_for_space ? 2 : 1);
    // NaN rollbacks have their own budget.
    EXPECT_EQ(j.restarts(),
              row.restarts && row.kind != v1::FAILURE_KIND_NAN && !waits_for_space ? 1 : 0);
  }
}

// Restart backoff (#27): a counted restart waits 1 s, then 2 s, ... (at
// most 30 s) on the monotonic clock; a NaN rollback does not wait.
TEST_F(JobManagerTest, RestartsBackOffExponentially) {
  EXPECT_EQ(RestartBackoff(1, absl::Seconds(1)), absl::Seconds(1));
  EXPECT_EQ(RestartBackoff(2, absl::Seconds(1)), absl::Seconds(2));
  EXPECT_EQ(RestartBackoff(5, absl::Seconds(1)), absl::Seconds(16));
  EXPECT_EQ(RestartBackoff(6, absl::Seconds(1)), absl::Seconds(30));
  EXPECT_EQ(RestartBackoff(1000, absl::Seconds(1)), absl::Seconds(30));
  EXPECT_EQ(RestartBackoff(3, absl::ZeroDuration()), absl::ZeroDuration());

  restart_backoff_ = absl::Seconds(1);
  Open();
  a_ = AddWorker("a", 1);
  auto job = jobs_->Submit(Spec(1));
  ASSERT_TRUE(job.ok()) << job.status();
  const std::string id = job->id();
  for (int restart = 1; restart <= 2; ++restart) {
    ASSERT_TRUE(
        Status("a", id, restart, 0, v1::RANK_STATE_FAILED, v1::FAILURE_KIND_SIGNAL, -1).ok());
    const absl::Duration wait = absl::Seconds(restart == 1 ? 1 : 2);
    EXPECT_THAT(StoredEvents(id),
                Contains(absl::StrCat("restarting@", restart, ": restart ", restart, " of 3 in ",
                                      absl::FormatDuration(wait),
                                      ", from scratch (no checkpoint recorded yet)")));
    clock_.StepWall(absl::Hours(1));  // the wall clock does not count
    clock_.Advance(wait - absl::Milliseconds(10));
    jobs_->Tick();
    ASSERT_EQ(Get(id).attempts_size(), restart) << "restart " << restart << " waits its backoff";
    EXPECT_THAT(Get(id).state_reason(), HasSubstr("restarting after"));
    clock_.Advance(absl::Milliseconds(20));
    jobs_->Tick();
    ASSERT_EQ(Get(id).attempts_size(), restart + 1) << "placed once the backoff is over";
  }
}

TEST_F(JobManagerTest, OutOfMemoryFailsAtOnceAndSaysWhy) {
  std::string id = RunningJob();
  ASSERT_TRUE(
      Status("b", id, 1, 1, v1::RANK_STATE_FAILED, v1::FAILURE_KIND_OUT_OF_MEMORY, -1).ok());
  v1::Job j = Get(id);
  EXPECT_EQ(j.state(), v1::JOB_STATE_FAILED);
  EXPECT_EQ(j.restarts(), 0);
  EXPECT_EQ(j.attempts(0).failure_kind(), v1::FAILURE_KIND_OUT_OF_MEMORY);
  EXPECT_THAT(j.state_reason(), HasSubstr("out of memory: not restarted"));
  EXPECT_THAT(StoredEvents(id), Contains("failed@1: out of memory; lower data.batch_size"));
}

TEST_F(JobManagerTest, NanRollsBackWithSkippedStepsUntilTheBudgetIsSpent) {
  a_ = AddWorker("a", 1);
  v1::JobSpec spec = Spec(1);
  spec.mutable_health()->set_max_rollbacks(2);
  auto job = jobs_->Submit(spec);
  ASSERT_TRUE(job.ok()) << job.status();
  const std::string id = job->id();
  auto nan_at = [&](int attempt, int64_t step) {
    v1::RankStatus st;
    st.set_job_id(id);
    st.set_attempt(attempt);
    st.set_rank(0);
    st.set_state(v1::RANK_STATE_FAILED);
    st.mutable_exit()->set_kind(v1::FAILURE_KIND_NAN);
    st.mutable_exit()->set_step(step);
    st.mutable_exit()->set_message(absl::StrCat("NaN/Inf gradients at step ", step));
    return jobs_->OnRankStatus("a", st);
  };
  ASSERT_TRUE(Rendezvous("a", id, 1).ok());
  ASSERT_TRUE(Status("a", id, 1, 0, v1::RANK_STATE_RUNNING).ok());
  ASSERT_TRUE(Checkpoint(*jobs_, "a", id, 1, 0, 1, 40, "/w/a/ck1").ok());
  ASSERT_TRUE(nan_at(1, 57).ok());
  v1::Job j = Get(id);
  ASSERT_EQ(j.attempts_size(), 2) << "rolled back at once: the slot is free";
  EXPECT_EQ(j.restarts(), 0) << "a rollback is not a restart";
  EXPECT_EQ(j.attempts(0).failure_kind(), v1::FAILURE_KIND_NAN);
  EXPECT_THAT(j.attempts(1).skip_steps(), ElementsAre(57));
  EXPECT_EQ(j.attempts(1).resume().global_step(), 40);
  ASSERT_FALSE(a_->Starts().empty());
  EXPECT_THAT(a_->Starts().back().skip_steps(), ElementsAre(57));
  EXPECT_THAT(
      StoredEvents(id),
      Contains(
          "rollback@1: NaN/Inf at step 57: rolling back to the checkpoint at step 40 and skipping "
          "step 57 (rollback 1 of 2)"));

  // A crash in between keeps the list; the next NaN adds its step.
  ASSERT_TRUE(Status("a", id, 2, 0, v1::RANK_STATE_FAILED, v1::FAILURE_KIND_SIGNAL).ok());
  j = Get(id);
  ASSERT_EQ(j.attempts_size(), 3);
  EXPECT_THAT(j.attempts(2).skip_steps(), ElementsAre(57));
  ASSERT_TRUE(nan_at(3, 61).ok());
  j = Get(id);
  ASSERT_EQ(j.attempts_size(), 4);
  EXPECT_THAT(j.attempts(3).skip_steps(), ElementsAre(57, 61));

  // The third NaN exceeds health.max_rollbacks: 2.
  ASSERT_TRUE(nan_at(4, 70).ok());
  j = Get(id);
  EXPECT_EQ(j.state(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(j.state_reason(), HasSubstr("no rollbacks left: 2 of 2 used"));
}

TEST_F(JobManagerTest, NanWithOnNanFailFailsTheJob) {
  a_ = AddWorker("a", 1);
  v1::JobSpec spec = Spec(1);
  spec.mutable_health()->set_on_nan(v1::HealthSpec::ON_NAN_FAIL);
  auto job = jobs_->Submit(spec);
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_TRUE(Status("a", job->id(), 1, 0, v1::RANK_STATE_FAILED, v1::FAILURE_KIND_NAN).ok());
  v1::Job j = Get(job->id());
  EXPECT_EQ(j.state(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(j.state_reason(), HasSubstr("health.on_nan: fail"));
}

TEST_F(JobManagerTest, CancelRecordsTheCancelledClass) {
  std::string id = RunningJob();
  ASSERT_TRUE(jobs_->Cancel(id, "").ok());
  EXPECT_EQ(Get(id).attempts(0).failure_kind(), v1::FAILURE_KIND_CANCELLED);
}

absl::Status PreflightReport(AttemptStarter& starter, const std::string& worker,
                             const std::string& job, int attempt,
                             std::vector<std::string> problems) {
  v1::PreflightReport r;
  r.set_job_id(job);
  r.set_attempt(attempt);
  for (auto& p : problems) r.add_problems(p);
  return starter.OnPreflightReport(worker, r);
}

TEST_F(JobManagerTest, PreflightProblemOnOneWorkerFailsTheAttemptBeforeAnyRankStarts) {
  const std::string id = SubmitWithPreflight();
  ASSERT_FALSE(id.empty());
  EXPECT_EQ(a_->Preflights(), 1);
  EXPECT_EQ(b_->Preflights(), 1);
  EXPECT_TRUE(a_->Starts().empty()) << "no StartRanks before every worker passed";
  // Only the attempt's workers may answer, for the current attempt.
  AddWorker("c", 1);
  EXPECT_EQ(PreflightReport(owners_->starter, "c", id, 1, {}).code(),
            absl::StatusCode::kPermissionDenied);
  ASSERT_TRUE(PreflightReport(owners_->starter, "a", id, 1, {}).ok());
  EXPECT_EQ(Get(id).state(), v1::JOB_STATE_SCHEDULED) << "waits for b";
  ASSERT_TRUE(
      PreflightReport(owners_->starter, "b", id, 1, {"data.train.path /x/train.csv: no such file"})
          .ok());
  v1::Job j = Get(id);
  EXPECT_EQ(j.state(), v1::JOB_STATE_FAILED);
  EXPECT_EQ(j.attempts(0).failure_kind(), v1::FAILURE_KIND_PREFLIGHT);
  EXPECT_EQ(j.attempts(0).reason(),
            "pre-flight failed: b: data.train.path /x/train.csv: no such file");
  EXPECT_TRUE(a_->Starts().empty());
  EXPECT_TRUE(b_->Starts().empty());
  EXPECT_TRUE(a_->Stops().empty()) << "nothing started, nothing to stop";
  for (const auto& r : j.attempts(0).ranks()) EXPECT_EQ(r.state(), v1::RANK_STATE_STOPPED);
  int failures = 0;
  for (const std::string& e : StoredEvents(id)) {
    if (absl::StartsWith(e, "attempt_failed@1: ")) {
      ++failures;
      EXPECT_EQ(
          e, "attempt_failed@1: pre-flight failed: b: data.train.path /x/train.csv: no such file");
    }
  }
  EXPECT_EQ(failures, 1);
  // The slots are free again: the next job is placed (and checked) at once.
  auto next = jobs_->Submit(Spec(2));
  ASSERT_TRUE(next.ok());
  EXPECT_EQ(Get(next->id()).state(), v1::JOB_STATE_SCHEDULED);
}

TEST_F(JobManagerTest, PreflightPassedOnEveryWorkerStartsTheRanks) {
  const std::string id = SubmitWithPreflight();
  ASSERT_FALSE(id.empty());
  ASSERT_TRUE(PreflightReport(owners_->starter, "b", id, 1, {}).ok());
  EXPECT_TRUE(b_->Starts().empty());
  ASSERT_TRUE(PreflightReport(owners_->starter, "a", id, 1, {}).ok());
  ASSERT_EQ(a_->Starts().size(), 1u);
  ASSERT_EQ(b_->Starts().size(), 1u);
  EXPECT_TRUE(a_->Starts()[0].produce_rendezvous());
  // A late duplicate changes nothing.
  ASSERT_TRUE(PreflightReport(owners_->starter, "a", id, 1, {"late"}).ok());
  EXPECT_EQ(a_->Starts().size(), 1u);
  EXPECT_EQ(Get(id).state(), v1::JOB_STATE_SCHEDULED);
}

}  // namespace
}  // namespace trainctl::coordinator
