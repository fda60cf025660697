// The restart policy of a failed attempt, as a pure function of the job:
// which kinds fail the job at once, the restart and rollback budgets, and
// the steps a rollback skips.
#include "coordinator/jobs/attempt_failure.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "common/time_util.h"

namespace trainctl::coordinator {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;

v1::Job RunningJob(int max_restarts) {
  v1::Job j;
  j.set_id("j");
  j.set_state(v1::JOB_STATE_RUNNING);
  j.mutable_spec()->mutable_restart()->set_max_restarts(max_restarts);
  v1::Attempt* a = j.add_attempts();
  a->set_number(1);
  a->set_state(v1::ATTEMPT_STATE_RUNNING);
  for (int r = 0; r < 2; ++r) {
    v1::RankAssignment* ra = a->add_ranks();
    ra->set_rank(r);
    ra->set_worker_id(r == 0 ? "a" : "b");
    ra->set_state(v1::RANK_STATE_RUNNING);
  }
  return j;
}

std::vector<std::string> Types(const std::vector<JobEvent>& events) {
  std::vector<std::string> out;
  for (const JobEvent& e : events) out.push_back(e.type);
  return out;
}

TEST(AttemptFailureTest, RestartableKindRestartsAndStopsTheSurvivors) {
  v1::Job j = RunningJob(2);
  j.mutable_attempts(0)->mutable_ranks(1)->set_state(v1::RANK_STATE_FAILED);
  std::vector<JobEvent> events;
  RanksByWorker stop =
      BuildAttemptFailure(j, events, absl::Now(), v1::FAILURE_KIND_USER_CODE, "boom", 1);
  EXPECT_EQ(j.state(), v1::JOB_STATE_RESTARTING);
  EXPECT_EQ(j.restarts(), 1);
  EXPECT_EQ(j.attempts(0).state(), v1::ATTEMPT_STATE_FAILED);
  EXPECT_THAT(Types(events), ElementsAre("attempt_failed", "restarting"));
  ASSERT_EQ(stop.size(), 1u);
  EXPECT_EQ(stop[0].first, "a");
  EXPECT_THAT(stop[0].second, ElementsAre(0));
}

TEST(AttemptFailureTest, KindsThatARestartCannotHelpFailTheJob) {
  for (v1::FailureKind kind : {v1::FAILURE_KIND_OUT_OF_MEMORY, v1::FAILURE_KIND_DATA,
                               v1::FAILURE_KIND_PREFLIGHT, v1::FAILURE_KIND_CONFIG}) {
    v1::Job j = RunningJob(5);
    std::vector<JobEvent> events;
    BuildAttemptFailure(j, events, absl::Now(), kind, "x", 0);
    EXPECT_EQ(j.state(), v1::JOB_STATE_FAILED) << v1::FailureKind_Name(kind);
    EXPECT_EQ(j.restarts(), 0);
    EXPECT_THAT(Types(events), ElementsAre("attempt_failed", "failed"));
  }
}

TEST(AttemptFailureTest, BudgetsHangPolicyAndTheSecondFullDisk) {
  v1::Job spent = RunningJob(1);
  spent.set_restarts(1);
  std::vector<JobEvent> events;
  BuildAttemptFailure(spent, events, absl::Now(), v1::FAILURE_KIND_USER_CODE, "x", 0);
  EXPECT_EQ(spent.state(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(spent.state_reason(), HasSubstr("no restarts left: 1 of 1 used"));

  v1::Job hung = RunningJob(3);
  hung.mutable_spec()->mutable_restart()->set_on_hang(v1::HANG_POLICY_FAIL);
  events.clear();
  BuildAttemptFailure(hung, events, absl::Now(), v1::FAILURE_KIND_HANG, "x", 0);
  EXPECT_EQ(hung.state(), v1::JOB_STATE_FAILED);

  v1::Job disk = RunningJob(3);
  disk.mutable_spec()->mutable_restart()->set_disk_full_wait_s(0);  // no waiting for space
  events.clear();
  BuildAttemptFailure(disk, events, absl::Now(), v1::FAILURE_KIND_DISK_FULL, "x", 0);
  EXPECT_EQ(disk.state(), v1::JOB_STATE_RESTARTING);  // once: space may have been freed
  v1::Attempt* second = disk.add_attempts();
  *second = disk.attempts(0);
  second->set_number(2);
  second->set_state(v1::ATTEMPT_STATE_RUNNING);
  disk.set_state(v1::JOB_STATE_RUNNING);
  events.clear();
  BuildAttemptFailure(disk, events, absl::Now(), v1::FAILURE_KIND_DISK_FULL, "x", 0);
  EXPECT_EQ(disk.state(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(disk.state_reason(), HasSubstr("previous attempt too"));
  EXPECT_THAT(disk.state_reason(), Not(HasSubstr("resume"))) << "no checkpoint to resume from";
}

TEST(AttemptFailureTest, AJobWithACheckpointIsToldToResumeNotToSubmitAgain) {
  // A full disk at the third epoch's checkpoint, then pre-flight finds no
  // room for the restart: `resume` keeps the epochs done, a submit would not.
  v1::Job j = RunningJob(3);
  j.add_checkpoints()->set_global_step(200);
  std::vector<JobEvent> events;
  BuildAttemptFailure(j, events, absl::Now(), v1::FAILURE_KIND_PREFLIGHT, "no room", 0);
  EXPECT_EQ(j.state(), v1::JOB_STATE_FAILED);
  ASSERT_EQ(events.size(), 2u);
  EXPECT_THAT(events[1].message,
              HasSubstr("`trainctl resume j` goes on from its newest checkpoint"));
  EXPECT_THAT(events[1].message, Not(HasSubstr("submit again")));

  v1::Job disk = RunningJob(3);
  disk.mutable_spec()->mutable_restart()->set_disk_full_wait_s(0);
  disk.add_checkpoints()->set_global_step(200);
  disk.mutable_attempts(0)->set_failure_kind(v1::FAILURE_KIND_DISK_FULL);
  v1::Attempt* second = disk.add_attempts();
  *second = disk.attempts(0);
  second->set_number(2);
  second->set_state(v1::ATTEMPT_STATE_RUNNING);
  events.clear();
  BuildAttemptFailure(disk, events, absl::Now(), v1::FAILURE_KIND_DISK_FULL, "x", 0);
  EXPECT_EQ(disk.state(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(disk.state_reason(), HasSubstr("`trainctl resume j`"));
}

// A full disk waits for space (#47): each DISK_FULL attempt restarts after a
// growing backoff, not counted as a restart (max_restarts 0 here), until the
// first of the run ended restart.disk_full_wait_s ago; then the job fails.
TEST(AttemptFailureTest, AFullDiskWaitsForSpaceForDiskFullWaitS) {
  v1::Job disk = RunningJob(0);
  disk.mutable_spec()->mutable_restart()->set_disk_full_wait_s(60);
  const absl::Time t0 = absl::FromUnixSeconds(1'800'000'000);
  for (int attempt = 1; attempt <= 3; ++attempt) {
    if (attempt > 1) {
      v1::Attempt* next = disk.add_attempts();
      *next = disk.attempts(0);
      next->set_number(attempt);
      next->set_state(v1::ATTEMPT_STATE_RUNNING);
      next->clear_failure_kind();
      disk.set_state(v1::JOB_STATE_RUNNING);
    }
    std::vector<JobEvent> events;
    BuildAttemptFailure(disk, events, t0 + absl::Seconds(10 * (attempt - 1)),
                        v1::FAILURE_KIND_DISK_FULL,
                        "pre-flight: waiting for space: w1: checkpoint.dir /c: 0 bytes free", 0);
    EXPECT_EQ(disk.state(), v1::JOB_STATE_RESTARTING) << "attempt " << attempt;
    EXPECT_EQ(disk.restarts(), 0) << "waiting for space is not a restart";
    EXPECT_THAT(Types(events), ElementsAre("attempt_failed", "waiting_for_space"));
    EXPECT_THAT(disk.state_reason(), HasSubstr("waiting for space"));
    EXPECT_EQ(WaitForSpaceBackoff(disk), DiskFullBackoff(attempt));
  }
  EXPECT_EQ(DiskFullBackoff(1), absl::Seconds(2));
  EXPECT_EQ(DiskFullBackoff(2), absl::Seconds(4));
  EXPECT_EQ(DiskFullBackoff(9), absl::Seconds(30));

  // 70 s after the first one ended: past the wait.
  v1::Attempt* last = disk.add_attempts();
  *last = disk.attempts(0);
  last->set_number(4);
  last->set_state(v1::ATTEMPT_STATE_RUNNING);
  last->clear_failure_kind();
  disk.set_state(v1::JOB_STATE_RUNNING);
  std::vector<JobEvent> events;
  BuildAttemptFailure(disk, events, t0 + absl::Seconds(70), v1::FAILURE_KIND_DISK_FULL, "x", 0);
  EXPECT_EQ(disk.state(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(disk.state_reason(), HasSubstr("no space for 1m10s (restart.disk_full_wait_s: 60)"));
  EXPECT_EQ(WaitForSpaceBackoff(disk), absl::ZeroDuration()) << "not waiting any more";

  // Another kind in between starts a new run.
  v1::Job mixed = RunningJob(3);
  mixed.mutable_spec()->mutable_restart()->set_disk_full_wait_s(60);
  mixed.mutable_attempts(0)->set_failure_kind(v1::FAILURE_KIND_DISK_FULL);
  SetTimestamp(t0, mixed.mutable_attempts(0)->mutable_end_time());
  v1::Attempt* crash = mixed.add_attempts();
  *crash = mixed.attempts(0);
  crash->set_number(2);
  crash->set_failure_kind(v1::FAILURE_KIND_SIGNAL);
  v1::Attempt* cur = mixed.add_attempts();
  *cur = mixed.attempts(0);
  cur->set_number(3);
  cur->set_state(v1::ATTEMPT_STATE_RUNNING);
  cur->clear_failure_kind();
  events.clear();
  BuildAttemptFailure(mixed, events, t0 + absl::Hours(1), v1::FAILURE_KIND_DISK_FULL, "x", 0);
  EXPECT_EQ(mixed.state(), v1::JOB_STATE_RESTARTING) << mixed.state_reason();
}

TEST(AttemptFailureTest, NanRollsBackOnItsOwnBudgetAndSkipsTheStep) {
  v1::Job j = RunningJob(0);  // no restarts: rollbacks do not use them
  j.mutable_spec()->mutable_health()->set_max_rollbacks(1);
  j.mutable_attempts(0)->mutable_ranks(1)->mutable_exit()->set_kind(v1::FAILURE_KIND_NAN);
  j.mutable_attempts(0)->mutable_ranks(1)->mutable_exit()->set_step(42);
  std::vector<JobEvent> events;
  BuildAttemptFailure(j, events, absl::Now(), v1::FAILURE_KIND_NAN, "nan", 1);
  EXPECT_EQ(j.state(), v1::JOB_STATE_RESTARTING);
  EXPECT_THAT(Types(events), ElementsAre("attempt_failed", "rollback"));
  EXPECT_THAT(events[1].message, HasSubstr("skipping step 42 (rollback 1 of 1)"));
  EXPECT_THAT(RollbackSkipSteps(j), ElementsAre(42));
  // A second NaN with the budget spent fails the job.
  v1::Attempt* again = j.add_attempts();
  *again = j.attempts(0);
  again->set_number(2);
  again->set_state(v1::ATTEMPT_STATE_RUNNING);
  again->clear_failure_kind();
  again->mutable_ranks(1)->mutable_exit()->set_step(7);
  j.set_state(v1::JOB_STATE_RUNNING);
  events.clear();
  BuildAttemptFailure(j, events, absl::Now(), v1::FAILURE_KIND_NAN, "nan", 1);
  EXPECT_EQ(j.state(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(RollbackSkipSteps(j), ElementsAre(7, 42));
}

TEST(AttemptFailureTest, AnEndedAttemptIsNotFailedTwice) {
  v1::Job j = RunningJob(3);
  j.mutable_attempts(0)->set_state(v1::ATTEMPT_STATE_FAILED);
  std::vector<JobEvent> events;
  EXPECT_TRUE(
      BuildAttemptFailure(j, events, absl::Now(), v1::FAILURE_KIND_USER_CODE, "x", 0).empty());
  EXPECT_TRUE(events.empty());
  EXPECT_EQ(j.state(), v1::JOB_STATE_RUNNING);
}

TEST(AttemptFailureTest, ExitWordsNameTheRankTheCauseAndTheLastLines) {
  v1::RankAssignment r;
  r.set_rank(3);
  r.set_host("h");
  r.set_worker_id("w");
  v1::ExitInfo exit;
  exit.set_exit_code(2);
  exit.set_message("bad");
  for (int i = 0; i < 7; ++i) exit.add_last_log_lines("line " + std::to_string(i));
  std::string words = DescribeExit(r, exit);
  EXPECT_THAT(words, HasSubstr("rank 3 on h (worker w) exited with code 2: bad"));
  EXPECT_THAT(words, HasSubstr("line 6"));
  EXPECT_THAT(words, ::testing::Not(HasSubstr("line 1\n")));  // the last 5 only
  EXPECT_THAT(DescribeExit(r, exit, "worker x (host y) was lost"),
              HasSubstr("worker x (host y) was lost; rank 3 on h (worker w) then failed"));
}

TEST(AttemptFailureTest, AReasonSaysEachThingOnce) {
  v1::RankAssignment r;
  r.set_rank(1);
  r.set_host("h");
  r.set_worker_id("w");
  v1::ExitInfo exit;
  exit.set_exit_code(1);
  exit.set_message("rank 1 exited with code 1: RuntimeError: boom");
  EXPECT_EQ(DescribeExit(r, exit), "rank 1 on h (worker w) exited with code 1: RuntimeError: boom");
  exit.set_message("exited with code 1");
  EXPECT_EQ(DescribeExit(r, exit), "rank 1 on h (worker w) exited with code 1");
  exit.set_exit_code(0);
  exit.set_signal(9);
  exit.set_message("rank 1 killed by signal 9 (Killed)");
  EXPECT_EQ(DescribeExit(r, exit), "rank 1 on h (worker w) was killed by signal 9 (Killed)");
  // A message that says something else keeps all of its words.
  exit.set_message("rank 1 ran out of memory");
  EXPECT_EQ(DescribeExit(r, exit),
            "rank 1 on h (worker w) was killed by signal 9: rank 1 ran out of memory");
}

}  // namespace
}  // namespace trainctl::coordinator
