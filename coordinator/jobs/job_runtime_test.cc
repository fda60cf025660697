// scheduling.max_runtime_s through the JobManager (Slurm's --time): a job
// whose running time reaches its limit ends TIMEOUT, its ranks stopped as a
// preemption stops them (checkpoint first, the preemption grace); the clock
// counts the attempts' time holding slots across restarts, not the waits
// between them; TIMEOUT is terminal, kept by a store reload, and the
// checkpoint the stop writes is still recorded (resume continues it).
#include "coordinator/jobs/job_manager_fixture.h"

#include "coordinator/jobs/job_transitions.h"

namespace trainctl::coordinator {
namespace {

class JobRuntimeTest : public JobManagerTest {
 protected:
  static v1::JobSpec Limited(double max_runtime_s, int max_restarts = 3) {
    v1::JobSpec spec = Spec(2, max_restarts);
    spec.mutable_scheduling()->set_max_runtime_s(max_runtime_s);
    return spec;
  }
  // Every StopRanks sent to workers a and b for `job`.
  std::vector<v1::StopRanks> StopsOf(const std::string& job) const {
    std::vector<v1::StopRanks> out;
    for (const FakeChannel* c : {a_, b_}) {
      for (const v1::StopRanks& s : c->Stops()) {
        if (s.job_id() == job) out.push_back(s);
      }
    }
    return out;
  }
};

TEST_F(JobRuntimeTest, AJobPastItsLimitIsStoppedAsAPreemptionAndEndsTimeout) {
  a_ = AddWorker("a", 1);
  b_ = AddWorker("b", 1);
  const std::string id = RunTwoRanks(Limited(10));
  ASSERT_FALSE(id.empty());

  clock_.Advance(absl::Seconds(9));
  jobs_->Tick();
  EXPECT_EQ(Get(id).state(), v1::JOB_STATE_RUNNING) << "9 s of 10";
  EXPECT_TRUE(StopsOf(id).empty());

  clock_.Advance(absl::Seconds(1));
  jobs_->Tick();
  const v1::Job timed_out = Get(id);
  ASSERT_EQ(timed_out.state(), v1::JOB_STATE_TIMEOUT) << timed_out.state_reason();
  EXPECT_TRUE(IsTerminal(timed_out.state()));
  EXPECT_THAT(timed_out.state_reason(),
              HasSubstr("ran past max_runtime_s=10 (10s of running time over 1 attempt)"));
  ASSERT_EQ(timed_out.attempts_size(), 1);
  EXPECT_EQ(timed_out.attempts(0).state(), v1::ATTEMPT_STATE_CANCELLED);
  EXPECT_THAT(timed_out.attempts(0).reason(), HasSubstr("ran past max_runtime_s=10"));
  EXPECT_EQ(timed_out.attempts(0).failure_kind(), v1::FAILURE_KIND_UNSPECIFIED)
      << "not cancelled by a user";
  // Stopped as a preemption: checkpoint first, with the preemption grace.
  const std::vector<v1::StopRanks> stops = StopsOf(id);
  ASSERT_EQ(stops.size(), 2u);
  for (const v1::StopRanks& s : stops) {
    EXPECT_TRUE(s.checkpoint_first());
    EXPECT_EQ(s.grace_period_ms(), 60000) << "PlacerOptions::preemption_grace, not --stop-grace-s";
    EXPECT_THAT(s.reason(), HasSubstr("ran past max_runtime_s=10"));
  }
  EXPECT_THAT(StoredEvents(id), Contains(HasSubstr("timeout@0: ran past max_runtime_s=10")));

  // The checkpoint the stop writes is recorded on the ended job (so that
  // `trainctl resume` continues from it), and the ranks' ends free their slots.
  ASSERT_TRUE(Checkpoint(*jobs_, "a", id, 1, 0, 0, 42, "/work/a").ok());
  EXPECT_EQ(Get(id).checkpoints_size(), 1);
  EXPECT_EQ(Get(id).state(), v1::JOB_STATE_TIMEOUT);
  ASSERT_TRUE(Status("a", id, 1, 0, v1::RANK_STATE_STOPPED).ok());
  ASSERT_TRUE(Status("b", id, 1, 1, v1::RANK_STATE_STOPPED).ok());
  EXPECT_TRUE(owners_->queries.BusySlots("a").empty());
  EXPECT_TRUE(owners_->queries.BusySlots("b").empty());

  // Terminal: a cancel is refused, later ticks change nothing, and a
  // coordinator restart reads it back as it was.
  EXPECT_EQ(jobs_->Cancel(id, "").status().code(), absl::StatusCode::kFailedPrecondition);
  clock_.Advance(absl::Seconds(30));
  jobs_->Tick();
  Open();
  const v1::Job reloaded = Get(id);
  EXPECT_EQ(reloaded.state(), v1::JOB_STATE_TIMEOUT);
  EXPECT_EQ(reloaded.state_reason(), timed_out.state_reason());
}

TEST_F(JobRuntimeTest, RestartsDoNotResetTheClockAndTheWaitBetweenAttemptsDoesNotCount) {
  a_ = AddWorker("a", 1);
  b_ = AddWorker("b", 1);
  const std::string id = RunTwoRanks(Limited(10));
  ASSERT_FALSE(id.empty());

  // Attempt 1 runs 6 s, then rank 1 fails: the job restarts.
  clock_.Advance(absl::Seconds(6));
  ASSERT_TRUE(Status("b", id, 1, 1, v1::RANK_STATE_FAILED, v1::FAILURE_KIND_EXIT, 1).ok());
  EXPECT_EQ(Get(id).state(), v1::JOB_STATE_RESTARTING);
  // Rank 0 takes 20 s to stop: the slots are held, so the next attempt waits
  // and that wait is not the job's running time.
  clock_.Advance(absl::Seconds(20));
  jobs_->Tick();
  EXPECT_EQ(Get(id).state(), v1::JOB_STATE_RESTARTING) << Get(id).state_reason();
  ASSERT_TRUE(Status("a", id, 1, 0, v1::RANK_STATE_STOPPED).ok());
  owners_->placer.Schedule();
  ASSERT_EQ(Get(id).attempts_size(), 2) << Get(id).state_reason();
  ASSERT_TRUE(Rendezvous("a", id, 2).ok());
  ASSERT_TRUE(Status("a", id, 2, 0, v1::RANK_STATE_RUNNING).ok());
  ASSERT_TRUE(Status("b", id, 2, 1, v1::RANK_STATE_RUNNING).ok());

  // 6 s + 3 s: still within 10 s.
  clock_.Advance(absl::Seconds(3));
  jobs_->Tick();
  EXPECT_EQ(Get(id).state(), v1::JOB_STATE_RUNNING);
  // 6 s + 4 s: the restart did not reset the clock.
  clock_.Advance(absl::Seconds(1));
  jobs_->Tick();
  const v1::Job j = Get(id);
  ASSERT_EQ(j.state(), v1::JOB_STATE_TIMEOUT) << j.state_reason();
  EXPECT_THAT(j.state_reason(),
              HasSubstr("ran past max_runtime_s=10 (10s of running time over 2 attempts)"));
  EXPECT_EQ(j.attempts(1).state(), v1::ATTEMPT_STATE_CANCELLED);
  EXPECT_EQ(j.attempts(0).state(), v1::ATTEMPT_STATE_FAILED)
      << "the earlier attempt keeps its own end";
}

// A job whose attempts already used up its time times out while it waits
// for its next attempt, instead of being placed to be stopped at once.
TEST_F(JobRuntimeTest, ARestartingJobWhoseTimeIsUsedUpEndsTimeoutWithoutAnotherAttempt) {
  a_ = AddWorker("a", 1);
  b_ = AddWorker("b", 1);
  const std::string id = RunTwoRanks(Limited(5));
  ASSERT_FALSE(id.empty());
  clock_.Advance(absl::Seconds(5));
  // The failure lands before the tick: the job is RESTARTING, its rank 0
  // still stopping.
  ASSERT_TRUE(Status("b", id, 1, 1, v1::RANK_STATE_FAILED, v1::FAILURE_KIND_EXIT, 1).ok());
  ASSERT_EQ(Get(id).state(), v1::JOB_STATE_RESTARTING);
  jobs_->Tick();
  const v1::Job j = Get(id);
  ASSERT_EQ(j.state(), v1::JOB_STATE_TIMEOUT) << j.state_reason();
  EXPECT_EQ(j.attempts_size(), 1);
  ASSERT_TRUE(Status("a", id, 1, 0, v1::RANK_STATE_STOPPED).ok());
  owners_->placer.Schedule();
  EXPECT_EQ(Get(id).attempts_size(), 1) << "never placed again";
}

TEST_F(JobRuntimeTest, AJobThatEndsInTimeBackfillsOnTheSlotsTheHeadHolds) {
  // a has 2 slots. `running` (limit 100 s) holds one; `head` (2 ranks, no
  // limit) holds the other until `running` ends: by 100 s and the 60 s
  // preemption grace. A job whose limit and grace end within that starts
  // on the held slot; a longer one waits and is told the bound that fits.
  a_ = AddWorker("a", 2);
  v1::JobSpec running_spec = Spec(1);
  running_spec.mutable_scheduling()->set_max_runtime_s(100);
  auto running = jobs_->Submit(running_spec);
  ASSERT_TRUE(running.ok()) << running.status();
  ASSERT_TRUE(Rendezvous("a", running->id(), 1).ok());
  ASSERT_TRUE(Status("a", running->id(), 1, 0, v1::RANK_STATE_RUNNING).ok());
  clock_.Advance(absl::Seconds(10));  // 90 s of its limit left: bound 150 s

  auto head = jobs_->Submit(Spec(2));
  ASSERT_TRUE(head.ok()) << head.status();
  v1::JobSpec long_spec = Spec(1);
  long_spec.mutable_scheduling()->set_max_runtime_s(91);  // 151 s with the grace
  auto too_long = jobs_->Submit(long_spec);
  ASSERT_TRUE(too_long.ok()) << too_long.status();
  EXPECT_EQ(Get(too_long->id()).state(), v1::JOB_STATE_PENDING);
  EXPECT_THAT(Get(too_long->id()).state_reason(),
              HasSubstr("at most 150 s would let it start now (backfill)"));

  v1::JobSpec short_spec = Spec(1);
  short_spec.mutable_scheduling()->set_max_runtime_s(90);  // 150 s with the grace
  auto in_time = jobs_->Submit(short_spec);
  ASSERT_TRUE(in_time.ok()) << in_time.status();
  const v1::Job placed = Get(in_time->id());
  EXPECT_EQ(placed.state(), v1::JOB_STATE_SCHEDULED) << placed.state_reason();
  EXPECT_THAT(StoredEvents(in_time->id()),
              Contains(HasSubstr(absl::StrCat("backfilled on slots held for job ", head->id()))));
  EXPECT_EQ(Get(head->id()).state(), v1::JOB_STATE_PENDING);
  EXPECT_EQ(Get(too_long->id()).state(), v1::JOB_STATE_PENDING);
}

TEST_F(JobRuntimeTest, WithoutALimitAJobRunsOn) {
  a_ = AddWorker("a", 1);
  b_ = AddWorker("b", 1);
  const std::string id = RunTwoRanks(Limited(0));
  ASSERT_FALSE(id.empty());
  // Under the hang detector's 60 s (the ranks report no progress here).
  for (int i = 0; i < 5; ++i) {
    clock_.Advance(absl::Seconds(10));
    jobs_->Tick();
  }
  EXPECT_EQ(Get(id).state(), v1::JOB_STATE_RUNNING);
}

}  // namespace
}  // namespace trainctl::coordinator
