// The one transition table (job, attempt, rank) and the check Commit runs
// on every change of a job.
#include "coordinator/jobs/job_transitions.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace trainctl::coordinator {
namespace {

using ::testing::HasSubstr;

TEST(JobTransitionsTest, OnlyTheLifecycleEdges) {
  using S = v1::JobState;
  EXPECT_TRUE(JobTransitionAllowed(S::JOB_STATE_UNSPECIFIED, S::JOB_STATE_PENDING));
  EXPECT_TRUE(JobTransitionAllowed(S::JOB_STATE_PENDING, S::JOB_STATE_SCHEDULED));
  EXPECT_TRUE(JobTransitionAllowed(S::JOB_STATE_SCHEDULED, S::JOB_STATE_RUNNING));
  EXPECT_TRUE(JobTransitionAllowed(S::JOB_STATE_RUNNING, S::JOB_STATE_RESTARTING));
  EXPECT_TRUE(JobTransitionAllowed(S::JOB_STATE_RESTARTING, S::JOB_STATE_SCHEDULED));
  EXPECT_TRUE(JobTransitionAllowed(S::JOB_STATE_RUNNING, S::JOB_STATE_RUNNING));
  EXPECT_FALSE(JobTransitionAllowed(S::JOB_STATE_PENDING, S::JOB_STATE_RUNNING));
  EXPECT_FALSE(JobTransitionAllowed(S::JOB_STATE_SUCCEEDED, S::JOB_STATE_RUNNING));
  EXPECT_FALSE(JobTransitionAllowed(S::JOB_STATE_CANCELLED, S::JOB_STATE_PENDING));
  EXPECT_FALSE(JobTransitionAllowed(S::JOB_STATE_FAILED, S::JOB_STATE_RESTARTING));
  EXPECT_FALSE(JobTransitionAllowed(S::JOB_STATE_RESTARTING, S::JOB_STATE_RUNNING));
}

TEST(JobTransitionsTest, AttemptsMoveForwardAndEndOnce) {
  using A = v1::AttemptState;
  EXPECT_TRUE(AttemptTransitionAllowed(A::ATTEMPT_STATE_STARTING, A::ATTEMPT_STATE_RUNNING));
  EXPECT_TRUE(AttemptTransitionAllowed(A::ATTEMPT_STATE_STARTING, A::ATTEMPT_STATE_SUCCEEDED));
  EXPECT_TRUE(AttemptTransitionAllowed(A::ATTEMPT_STATE_STARTING, A::ATTEMPT_STATE_CANCELLED));
  EXPECT_TRUE(AttemptTransitionAllowed(A::ATTEMPT_STATE_RUNNING, A::ATTEMPT_STATE_FAILED));
  EXPECT_FALSE(AttemptTransitionAllowed(A::ATTEMPT_STATE_RUNNING, A::ATTEMPT_STATE_STARTING));
  EXPECT_FALSE(AttemptTransitionAllowed(A::ATTEMPT_STATE_FAILED, A::ATTEMPT_STATE_RUNNING));
  EXPECT_FALSE(AttemptTransitionAllowed(A::ATTEMPT_STATE_SUCCEEDED, A::ATTEMPT_STATE_FAILED));
  EXPECT_FALSE(AttemptTransitionAllowed(A::ATTEMPT_STATE_UNSPECIFIED, A::ATTEMPT_STATE_RUNNING));
}

TEST(JobTransitionsTest, RanksMoveForwardAndEndOnce) {
  using R = v1::RankState;
  EXPECT_TRUE(RankTransitionAllowed(R::RANK_STATE_ASSIGNED, R::RANK_STATE_STARTING));
  EXPECT_TRUE(RankTransitionAllowed(R::RANK_STATE_ASSIGNED, R::RANK_STATE_RUNNING));
  EXPECT_TRUE(RankTransitionAllowed(R::RANK_STATE_ASSIGNED, R::RANK_STATE_STOPPED));
  EXPECT_TRUE(RankTransitionAllowed(R::RANK_STATE_STARTING, R::RANK_STATE_FAILED));
  EXPECT_TRUE(RankTransitionAllowed(R::RANK_STATE_RUNNING, R::RANK_STATE_SUCCEEDED));
  EXPECT_FALSE(RankTransitionAllowed(R::RANK_STATE_RUNNING, R::RANK_STATE_STARTING));
  EXPECT_FALSE(RankTransitionAllowed(R::RANK_STATE_STARTING, R::RANK_STATE_ASSIGNED));
  EXPECT_FALSE(RankTransitionAllowed(R::RANK_STATE_FAILED, R::RANK_STATE_RUNNING));
  EXPECT_FALSE(RankTransitionAllowed(R::RANK_STATE_SUCCEEDED, R::RANK_STATE_STOPPED));
}

v1::Job RunningJob(int ranks) {
  v1::Job j;
  j.set_id("j");
  j.set_state(v1::JOB_STATE_RUNNING);
  v1::Attempt* a = j.add_attempts();
  a->set_number(1);
  a->set_state(v1::ATTEMPT_STATE_RUNNING);
  for (int r = 0; r < ranks; ++r) {
    a->add_ranks()->set_rank(r);
    a->mutable_ranks(r)->set_state(v1::RANK_STATE_RUNNING);
  }
  return j;
}

TEST(JobTransitionsTest, ChangeOfAJobIsCheckedForItsAttemptsAndRanks) {
  const v1::Job from = RunningJob(2);
  // A rank's failure with its attempt's and the restart it causes: allowed.
  v1::Job to = from;
  to.set_state(v1::JOB_STATE_RESTARTING);
  to.mutable_attempts(0)->set_state(v1::ATTEMPT_STATE_FAILED);
  to.mutable_attempts(0)->mutable_ranks(1)->set_state(v1::RANK_STATE_FAILED);
  EXPECT_TRUE(CheckJobChange(from, to).ok());
  // Then a new attempt, STARTING with its ranks ASSIGNED: allowed.
  v1::Job again = to;
  again.set_state(v1::JOB_STATE_SCHEDULED);
  v1::Attempt* next = again.add_attempts();
  next->set_number(2);
  next->set_state(v1::ATTEMPT_STATE_STARTING);
  next->add_ranks()->set_state(v1::RANK_STATE_ASSIGNED);
  EXPECT_TRUE(CheckJobChange(to, again).ok());

  // A rank going back: refused, naming it.
  v1::Job back = from;
  back.mutable_attempts(0)->mutable_ranks(1)->set_state(v1::RANK_STATE_STARTING);
  absl::Status s = CheckJobChange(from, back);
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal);
  EXPECT_THAT(s.message(),
              HasSubstr("attempt 1 rank 1: RANK_STATE_RUNNING -> RANK_STATE_STARTING"));
  // An ended attempt running again.
  v1::Job revived = to;
  revived.mutable_attempts(0)->set_state(v1::ATTEMPT_STATE_RUNNING);
  EXPECT_THAT(CheckJobChange(to, revived).message(),
              HasSubstr("ATTEMPT_STATE_FAILED -> ATTEMPT_STATE_RUNNING"));
  // Attempts dropped, ranks added to an attempt, a new attempt already running.
  v1::Job dropped = from;
  dropped.clear_attempts();
  EXPECT_THAT(CheckJobChange(from, dropped).message(), HasSubstr("dropping attempts"));
  v1::Job grown = from;
  grown.mutable_attempts(0)->add_ranks()->set_state(v1::RANK_STATE_RUNNING);
  EXPECT_THAT(CheckJobChange(from, grown).message(), HasSubstr("changing its ranks from 2 to 3"));
  v1::Job skipped = again;
  skipped.mutable_attempts(1)->set_state(v1::ATTEMPT_STATE_RUNNING);
  EXPECT_THAT(CheckJobChange(to, skipped).message(),
              HasSubstr("a new attempt 2 in ATTEMPT_STATE_RUNNING"));
  // And the job's own table.
  v1::Job ended = from;
  ended.set_state(v1::JOB_STATE_SUCCEEDED);
  v1::Job reopened = ended;
  reopened.set_state(v1::JOB_STATE_RUNNING);
  EXPECT_THAT(CheckJobChange(ended, reopened).message(),
              HasSubstr("transition SUCCEEDED -> RUNNING"));
}

}  // namespace
}  // namespace trainctl::coordinator
