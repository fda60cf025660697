// Health of running attempts (job_health.h) through the JobManager: hangs
// (adaptive and fixed), stragglers, rendezvous timeouts, and the blame of a
// lost peer for a collective failure.
#include "coordinator/jobs/job_manager_fixture.h"

namespace trainctl::coordinator {
namespace {

TEST_F(JobManagerTest, HangIsDetectedAndRestarted) {
  std::string id = RunningJob();
  v1::RankProgress p;
  p.set_job_id(id);
  p.set_attempt(1);
  for (int i = 1; i <= 3; ++i) {
    clock_.Advance(absl::Seconds(40));
    p.set_rank(0);
    p.set_step(i);
    ASSERT_TRUE(owners_->ingest.OnProgress("a", p).ok());
    p.set_rank(1);
    ASSERT_TRUE(owners_->ingest.OnProgress("b", p).ok());
    jobs_->Tick();
    ASSERT_EQ(Get(id).state(), v1::JOB_STATE_RUNNING) << "progressing is not hung";
  }
  clock_.Advance(absl::Seconds(40));
  p.set_rank(0);
  p.set_step(4);
  ASSERT_TRUE(owners_->ingest.OnProgress("a", p).ok());
  clock_.Advance(absl::Seconds(30));  // rank 1 silent 70 s > 60 s.
  jobs_->Tick();
  v1::Job j = Get(id);
  EXPECT_EQ(j.state(), v1::JOB_STATE_RESTARTING);
  EXPECT_THAT(j.attempts(0).reason(),
              HasSubstr("hung: no progress for 1m from rank(s) 1 (host-b, last step 3)"));
}

TEST_F(JobManagerTest, HeartbeatsBlameTheStoppedRankAndOnHangFailEndsTheJob) {
  a_ = AddWorker("a", 1);
  b_ = AddWorker("b", 1);
  v1::JobSpec spec = Spec(2);
  spec.mutable_restart()->set_on_hang(v1::HANG_POLICY_FAIL);
  const std::string id = RunTwoRanks(spec);
  ASSERT_FALSE(id.empty());
  for (int s = 1; s <= 3; ++s) {
    ASSERT_TRUE(owners_->ingest.OnProgress("a", Heartbeat(id, 0, s, 2 * s, 0)).ok());
    ASSERT_TRUE(owners_->ingest.OnProgress("b", Heartbeat(id, 1, s, 2 * s, 0)).ok());
    clock_.Advance(absl::Seconds(1));
    jobs_->Tick();
  }
  // Rank 1 goes silent; rank 0 waits in all-reduce #8 and says so each second.
  for (int s = 1; s <= 5; ++s) {
    ASSERT_TRUE(owners_->ingest.OnProgress("a", Heartbeat(id, 0, 3, 8, 8)).ok());
    clock_.Advance(absl::Seconds(1));
    jobs_->Tick();
    ASSERT_EQ(Get(id).state(), v1::JOB_STATE_RUNNING) << s << " s: within the 5 s bound";
  }
  ASSERT_TRUE(owners_->ingest.OnProgress("a", Heartbeat(id, 0, 3, 8, 8)).ok());
  clock_.Advance(absl::Milliseconds(500));
  jobs_->Tick();
  v1::Job j = Get(id);
  EXPECT_EQ(j.state(), v1::JOB_STATE_FAILED);
  EXPECT_EQ(j.attempts(0).failure_kind(), v1::FAILURE_KIND_HANG);
  EXPECT_THAT(
      j.attempts(0).reason(),
      HasSubstr("hung: rank 1 (worker b, pid 501) stopped before all-reduce #8 (step 4, bucket 0); "
                "rank 0 waiting in it for"));
  EXPECT_THAT(j.state_reason(), HasSubstr("(restart.on_hang: fail)"));
  EXPECT_THAT(StoredEvents(id),
              ::testing::Contains(HasSubstr("hang@1: rank 1 (worker b, pid 501) stopped before")));
}

// A heartbeat of an engine rank still starting (a resume's checkpoint
// broadcast): collective #seq issued, waiting in broadcast #waiting_seq.
v1::RankProgress StartingHeartbeat(const std::string& id, int rank, int64_t seq,
                                   int64_t waiting_seq) {
  v1::RankProgress p = Heartbeat(id, rank, 0, seq, waiting_seq);
  p.set_phase(v1::RANK_PHASE_INIT);
  p.set_op(v1::COLLECTIVE_OP_BROADCAST);
  p.set_op_step(0);
  p.set_op_bucket(-1);
  p.set_p99_step_ms(0);
  return p;
}

TEST_F(JobManagerTest, ARankSilentPastTheBoundWhileTheAttemptStartsIsAHang) {
  a_ = AddWorker("a", 1);
  b_ = AddWorker("b", 1);
  auto job = jobs_->Submit(Spec(2));
  ASSERT_TRUE(job.ok()) << job.status();
  const std::string id = job->id();
  ASSERT_TRUE(Rendezvous("a", id, 1).ok());
  ASSERT_TRUE(Status("a", id, 1, 0, v1::RANK_STATE_RUNNING).ok());
  // Rank 1 beats twice, then stops before the checkpoint broadcast (#2)
  // that rank 0 waits in; both workers keep heartbeating on their sessions.
  for (int s = 0; s <= 7; ++s) {
    ASSERT_TRUE(owners_->ingest.OnProgress("a", StartingHeartbeat(id, 0, 2, 2)).ok());
    if (s <= 1) {
      ASSERT_TRUE(owners_->ingest.OnProgress("b", StartingHeartbeat(id, 1, 1, 0)).ok());
    }
    ASSERT_TRUE(registry_->Heartbeat("a", a_).ok());
    ASSERT_TRUE(registry_->Heartbeat("b", b_).ok());
    clock_.Advance(absl::Seconds(1));
    jobs_->Tick();
    if (s < 7) {
      // Worker b heard at s, rank 1 last at 1: silent s - 1 s, within 5 s.
      ASSERT_EQ(Get(id).attempts(0).state(), v1::ATTEMPT_STATE_STARTING) << s;
    }
  }
  v1::Job j = Get(id);
  EXPECT_EQ(j.state(), v1::JOB_STATE_RESTARTING);
  EXPECT_EQ(j.attempts(0).failure_kind(), v1::FAILURE_KIND_HANG);
  EXPECT_THAT(
      j.attempts(0).reason(),
      HasSubstr(
          "hung: rank 1 (worker b, pid 501) stopped before broadcast #2 in its start-up phase "
          "(epoch 1, step 0); rank 0 waiting in it for"));
  EXPECT_THAT(StoredEvents(id),
              ::testing::Contains(HasSubstr("hang@1: rank 1 (worker b, pid 501) stopped before")));
  EXPECT_EQ(owners_->Gauges().hangs_detected, 1);
}

TEST_F(JobManagerTest, ACheckpointWriteLongerThanTheBoundWithItsHeartbeatIsNoHang) {
  std::string id = RunningJob();
  for (int s = 1; s <= 50; ++s) {
    // Rank 0 writes its checkpoint for 50 s, its heartbeat thread beating;
    // rank 1 waits for it in the next step's all-reduce.
    v1::RankProgress ck = Heartbeat(id, 0, 10, 20, 0);
    ck.set_phase(v1::RANK_PHASE_CHECKPOINT);
    ASSERT_TRUE(owners_->ingest.OnProgress("a", ck).ok());
    ASSERT_TRUE(owners_->ingest.OnProgress("b", Heartbeat(id, 1, 10, 21, 21)).ok());
    ASSERT_TRUE(registry_->Heartbeat("a", a_).ok());
    ASSERT_TRUE(registry_->Heartbeat("b", b_).ok());
    clock_.Advance(absl::Seconds(1));
    jobs_->Tick();
    ASSERT_EQ(Get(id).state(), v1::JOB_STATE_RUNNING) << s << " s";
  }
  for (const std::string& e : StoredEvents(id)) EXPECT_FALSE(absl::StartsWith(e, "hang@")) << e;
}

TEST_F(JobManagerTest, ConsistentlySlowRankRaisesOneStragglerEvent) {
  std::string id = RunningJob();
  for (int s = 1; s <= 8; ++s) {
    ASSERT_TRUE(owners_->ingest.OnProgress("a", Heartbeat(id, 0, s, s, 0, 10)).ok());
    ASSERT_TRUE(owners_->ingest.OnProgress("b", Heartbeat(id, 1, s, s, 0, 25)).ok());
    clock_.Advance(absl::Seconds(1));
    jobs_->Tick();
  }
  std::vector<std::string> stragglers;
  for (const std::string& e : StoredEvents(id)) {
    if (absl::StartsWith(e, "straggler@")) stragglers.push_back(e);
  }
  ASSERT_EQ(stragglers.size(), 1u);
  EXPECT_THAT(
      stragglers[0],
      HasSubstr("straggler@1: rank 1 (worker b, host host-b) is a straggler: 25.0 ms of "
                "compute per step, 150% slower than the median of the other ranks (10.0 ms)"));
  EXPECT_EQ(Get(id).state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(owners_->Gauges().straggler_events, 1);
}

TEST_F(JobManagerTest, StragglerPolicyAvoidPlacesTheNextAttemptOffItsWorker) {
  AddWorker("a", 1);
  AddWorker("b", 1);
  AddWorker("c", 1);
  AddWorker("d", 1);
  v1::JobSpec spec = Spec(2);
  spec.mutable_stragglers()->set_policy(v1::STRAGGLER_POLICY_AVOID);
  auto job = jobs_->Submit(spec);
  ASSERT_TRUE(job.ok()) << job.status();
  const std::string id = job->id();
  v1::Job j = Get(id);
  ASSERT_EQ(j.attempts(0).ranks(0).worker_id(), "a");
  ASSERT_EQ(j.attempts(0).ranks(1).worker_id(), "b");
  ASSERT_TRUE(Rendezvous("a", id, 1).ok());
  ASSERT_TRUE(Status("a", id, 1, 0, v1::RANK_STATE_RUNNING).ok());
  ASSERT_TRUE(Status("b", id, 1, 1, v1::RANK_STATE_RUNNING).ok());
  for (int s = 1; s <= 6; ++s) {
    ASSERT_TRUE(owners_->ingest.OnProgress("a", Heartbeat(id, 0, s, s, 0, 10)).ok());
    ASSERT_TRUE(owners_->ingest.OnProgress("b", Heartbeat(id, 1, s, s, 0, 30)).ok());
    clock_.Advance(absl::Seconds(1));
    jobs_->Tick();
  }
  EXPECT_THAT(StoredEvents(id),
              ::testing::Contains(HasSubstr("the next attempt avoids worker b if it can")));
  // Rank 1 crashes: b's slot is free again, and b would be the first choice.
  ASSERT_TRUE(Status("b", id, 1, 1, v1::RANK_STATE_FAILED, v1::FAILURE_KIND_EXIT, 1).ok());
  j = Get(id);
  ASSERT_EQ(j.attempts_size(), 2) << v1::JobState_Name(j.state()) << " " << j.state_reason();
  EXPECT_EQ(j.attempts(1).ranks(0).worker_id(), "c");
  EXPECT_EQ(j.attempts(1).ranks(1).worker_id(), "d");
}

TEST_F(JobManagerTest, ACommandJobThatSendsNothingIsCheckedOnlyWhenItSetsATimeout) {
  AddWorker("a", 2, {}, /*allow_commands=*/true);
  auto quiet = jobs_->Submit(CommandSpec(1));
  auto watched = jobs_->Submit(CommandSpec(1, "restart: {progress_timeout_s: 120}\n"));
  ASSERT_TRUE(quiet.ok() && watched.ok());
  for (const std::string& id : {quiet->id(), watched->id()}) {
    ASSERT_TRUE(Rendezvous("a", id, 1).ok());
    ASSERT_TRUE(Status("a", id, 1, 0, v1::RANK_STATE_RUNNING).ok());
    ASSERT_EQ(Get(id).state(), v1::JOB_STATE_RUNNING);
  }
  clock_.Advance(absl::Minutes(30));  // Far past the coordinator's 60 s default.
  jobs_->Tick();
  EXPECT_EQ(Get(quiet->id()).state(), v1::JOB_STATE_RUNNING)
      << "a rank that sends nothing (no report, no Python start-up hook) is not judged";
  v1::Job j = Get(watched->id());
  EXPECT_EQ(j.state(), v1::JOB_STATE_RESTARTING);
  EXPECT_THAT(j.attempts(0).reason(), HasSubstr("hung: no progress for 2m"));
}

// A script that reports (trainctl.report) with its start-up hook's
// heartbeats: no configuration, rank 1 stops while rank 0 waits in a torch
// collective. The hang names rank 1 once the learned bound (the 15 s floor)
// passes, and the ranks are asked for their stacks before they stop; the
// same job with restart.progress_timeout_s: -1 is left alone.
TEST_F(JobManagerTest, AScriptsStoppedRankIsNamedOnTheLearnedBoundAndDumpsItsStacks) {
  FakeChannel* ch = AddWorker("a", 4, {}, /*allow_commands=*/true);
  auto judged = jobs_->Submit(CommandSpec(2));
  auto off = jobs_->Submit(CommandSpec(2, "restart: {progress_timeout_s: -1}\n"));
  ASSERT_TRUE(judged.ok() && off.ok());
  for (const std::string& id : {judged->id(), off->id()}) {
    ASSERT_TRUE(Rendezvous("a", id, 1).ok());
    for (int r = 0; r < 2; ++r) ASSERT_TRUE(Status("a", id, 1, r, v1::RANK_STATE_RUNNING).ok());
    ASSERT_EQ(Get(id).state(), v1::JOB_STATE_RUNNING);
  }
  auto send = [&](const std::string& id, int rank, int64_t step, int64_t moves, int64_t torch_ms) {
    v1::RankProgress p;
    p.set_job_id(id);
    p.set_attempt(1);
    p.set_rank(rank);
    p.set_step(step);
    p.set_has_heartbeat(true);
    p.set_stack_moves(moves);
    p.set_torch_wait_ms(torch_ms);
    ASSERT_TRUE(owners_->ingest.OnProgress("a", p).ok());
  };
  for (int step = 1; step <= 10; ++step) {
    clock_.Advance(absl::Milliseconds(500));
    for (const std::string& id : {judged->id(), off->id()}) {
      for (int r = 0; r < 2; ++r) send(id, r, step, step, 0);
    }
    jobs_->Tick();
  }
  // Rank 1 stops at step 10; rank 0 waits in the next all-reduce.
  for (int s = 1; s <= 20; ++s) {
    clock_.Advance(absl::Seconds(1));
    for (const std::string& id : {judged->id(), off->id()}) {
      send(id, 0, 10, 11, s * 1000);
      send(id, 1, 10, 11, 0);
    }
    jobs_->Tick();
    if (Get(judged->id()).state() != v1::JOB_STATE_RUNNING) {
      EXPECT_GT(s, 15) << "not before the 15 s floor";
      break;
    }
  }
  v1::Job j = Get(judged->id());
  ASSERT_EQ(j.state(), v1::JOB_STATE_RESTARTING);
  EXPECT_EQ(j.attempts(0).failure_kind(), v1::FAILURE_KIND_HANG);
  EXPECT_THAT(j.attempts(0).reason(),
              HasSubstr("hung: rank 1 (worker a) at step 10 stopped outside torch's collectives "
                        "while rank 0 has waited in one for "));
  bool dumped = false;
  for (const v1::StopRanks& st : ch->Stops()) {
    if (st.job_id() == judged->id()) dumped = st.stack_dump_ms() == 1000;
  }
  EXPECT_TRUE(dumped) << "the ranks dump their stacks before they stop";
  EXPECT_EQ(Get(off->id()).state(), v1::JOB_STATE_RUNNING)
      << "progress_timeout_s: -1 turns the check off";
}

TEST_F(JobManagerTest, RendezvousTimeout) {
  AddWorker("a", 2);
  auto job = jobs_->Submit(Spec(2, 0));
  ASSERT_TRUE(job.ok());
  ASSERT_TRUE(Status("a", job->id(), 1, 0, v1::RANK_STATE_RUNNING).ok());
  clock_.Advance(absl::Seconds(31));
  jobs_->Tick();
  v1::Job j = Get(job->id());
  EXPECT_EQ(j.state(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(j.state_reason(), HasSubstr("rendezvous timed out after 30s; ranks not ready: 1"));
}

// Hang, silence and rendezvous timers run on the monotonic clock (#30
// finding 3): a wall clock stepped by minutes neither fails a healthy
// attempt nor delays finding a hung one.
TEST_F(JobManagerTest, AStepOfTheWallClockNeitherDeclaresNorHidesAHang) {
  std::string id = RunningJob();
  v1::RankProgress p;
  p.set_job_id(id);
  p.set_attempt(1);
  for (int i = 1; i <= 2; ++i) {
    clock_.Advance(absl::Seconds(10));
    for (const auto& [rank, worker] : {std::pair<int, const char*>{0, "a"}, {1, "b"}}) {
      p.set_rank(rank);
      p.set_step(i);
      ASSERT_TRUE(owners_->ingest.OnProgress(worker, p).ok());
    }
  }
  clock_.StepWall(absl::Minutes(10));  // forward: 10 min "without progress"
  jobs_->Tick();
  ASSERT_EQ(Get(id).state(), v1::JOB_STATE_RUNNING) << "a forward step is no hang";
  clock_.StepWall(-absl::Minutes(20));  // back: a wall-clock timer would wait 10 more minutes
  clock_.Advance(absl::Seconds(30));
  p.set_rank(0);
  p.set_step(3);
  ASSERT_TRUE(owners_->ingest.OnProgress("a", p).ok());
  clock_.Advance(absl::Seconds(31));  // rank 1 silent 61 s > 60 s, monotonic
  ASSERT_TRUE(registry_->Heartbeat("a", a_).ok());
  ASSERT_TRUE(registry_->Heartbeat("b", b_).ok());
  jobs_->Tick();
  v1::Job j = Get(id);
  EXPECT_EQ(j.state(), v1::JOB_STATE_RESTARTING);
  EXPECT_THAT(j.attempts(0).reason(), HasSubstr("hung: no progress for 1m from rank(s) 1"));
}

TEST_F(JobManagerTest, RendezvousTimeoutIgnoresWallClockSteps) {
  AddWorker("a", 2);
  auto job = jobs_->Submit(Spec(2, 0));
  ASSERT_TRUE(job.ok());
  ASSERT_TRUE(Status("a", job->id(), 1, 0, v1::RANK_STATE_RUNNING).ok());
  clock_.StepWall(absl::Hours(1));
  jobs_->Tick();
  ASSERT_EQ(Get(job->id()).state(), v1::JOB_STATE_SCHEDULED) << "an hour of wall clock is not 30 s";
  clock_.StepWall(-absl::Hours(2));
  clock_.Advance(absl::Seconds(31));
  jobs_->Tick();
  v1::Job j = Get(job->id());
  EXPECT_EQ(j.state(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(j.state_reason(), HasSubstr("rendezvous timed out after 30s"));
}

// --- a lost worker is named as the cause ---------------------------------

TEST_F(JobManagerTest, CollectiveFailureAfterAPeersStreamBrokeBlamesThePeer) {
  std::string id = RunningJob();
  // b's daemon is killed: its stream breaks; its lease has not expired yet.
  registry_->SessionEnded("b", b_, /*left=*/false);
  ASSERT_EQ(registry_->Find("b")->state(), v1::WORKER_STATE_ALIVE);
  ASSERT_TRUE(jobs_
                  ->OnRankStatus("a", Failed(id, 1, 0, v1::FAILURE_KIND_COLLECTIVE,
                                             "Connection reset by peer"))
                  .ok());
  v1::Job j = Get(id);
  EXPECT_EQ(j.state(), v1::JOB_STATE_RESTARTING);
  const std::string reason =
      "worker b (host host-b) was lost; rank 0 on host-a (worker a) then failed: "
      "Connection reset by peer";
  EXPECT_EQ(j.attempts(0).reason(), reason);
  EXPECT_EQ(j.attempts(0).failure_kind(), v1::FAILURE_KIND_WORKER_LOST);
  EXPECT_EQ(j.attempts(0).ranks(0).exit().kind(), v1::FAILURE_KIND_COLLECTIVE) << "as reported";
  EXPECT_THAT(StoredEvents(id), ::testing::Contains("attempt_failed@1: " + reason));
}

TEST_F(JobManagerTest, OwnFailureIsNotBlamedOnALostPeer) {
  std::string id = RunningJob();
  registry_->SessionEnded("b", b_, /*left=*/false);
  ASSERT_TRUE(jobs_->OnRankStatus("a", Failed(id, 1, 0, v1::FAILURE_KIND_EXIT, "ValueError")).ok());
  v1::Job j = Get(id);
  EXPECT_EQ(j.attempts(0).reason(), "rank 0 on host-a (worker a) exited with code 1: ValueError");
  EXPECT_EQ(j.attempts(0).failure_kind(), v1::FAILURE_KIND_EXIT);
}

TEST_F(JobManagerTest, HeldCollectiveFailureIsBlamedOnAPeerLostMomentsLater) {
  lost_worker_wait_ = absl::Seconds(1);
  Open();
  std::string id = RunningJob();
  // The survivor's error arrives first, while b still looks healthy: held.
  ASSERT_TRUE(jobs_
                  ->OnRankStatus("a", Failed(id, 1, 0, v1::FAILURE_KIND_COLLECTIVE,
                                             "Connection reset by peer"))
                  .ok());
  EXPECT_EQ(Get(id).state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(Get(id).attempts(0).ranks(0).state(), v1::RANK_STATE_RUNNING);
  clock_.Advance(absl::Milliseconds(100));
  jobs_->Tick();
  EXPECT_EQ(Get(id).state(), v1::JOB_STATE_RUNNING) << "still within the wait";
  // Then b's broken stream reaches the coordinator.
  registry_->SessionEnded("b", b_, /*left=*/false);
  clock_.Advance(absl::Milliseconds(100));
  jobs_->Tick();
  v1::Job j = Get(id);
  EXPECT_EQ(j.state(), v1::JOB_STATE_RESTARTING);
  EXPECT_EQ(j.attempts(0).reason(),
            "worker b (host host-b) was lost; rank 0 on host-a (worker a) then failed: "
            "Connection reset by peer");
  EXPECT_EQ(j.attempts(0).failure_kind(), v1::FAILURE_KIND_WORKER_LOST);
  // b's lease expires later: its rank is recorded, the attempt is not failed twice.
  clock_.Advance(absl::Seconds(1));
  for (const std::string& w : registry_->ExpireLeases()) owners_->health.OnWorkerLost(w);
  EXPECT_EQ(Get(id).attempts(0).ranks(1).exit().kind(), v1::FAILURE_KIND_WORKER_LOST);
  // Said as what happened: the stream broke, not a lease that ran out.
  EXPECT_EQ(Get(id).attempts(0).ranks(1).exit().message(),
            "its worker's stream broke without a goodbye and it did not reconnect within 1s "
            "(daemon killed, host or "
            "network down)");
  EXPECT_EQ(Get(id).restarts(), 1);
}

TEST_F(JobManagerTest, HeldCollectiveFailureWithHealthyPeersFailsAfterTheWait) {
  lost_worker_wait_ = absl::Seconds(1);
  Open();
  std::string id = RunningJob();
  ASSERT_TRUE(
      jobs_->OnRankStatus("a", Failed(id, 1, 0, v1::FAILURE_KIND_COLLECTIVE, "Gloo timeout")).ok());
  clock_.Advance(absl::Milliseconds(900));
  jobs_->Tick();
  EXPECT_EQ(Get(id).state(), v1::JOB_STATE_RUNNING);
  clock_.Advance(absl::Milliseconds(200));
  jobs_->Tick();
  v1::Job j = Get(id);
  EXPECT_EQ(j.state(), v1::JOB_STATE_RESTARTING);
  EXPECT_EQ(j.attempts(0).reason(), "rank 0 on host-a (worker a) exited with code 1: Gloo timeout");
  EXPECT_EQ(j.attempts(0).failure_kind(), v1::FAILURE_KIND_COLLECTIVE);
  ASSERT_EQ(b_->Stops().size(), 1u);
}

TEST_F(JobManagerTest, SingleWorkerCollectiveFailureIsNotHeld) {
  lost_worker_wait_ = absl::Seconds(1);
  Open();
  AddWorker("a", 2);
  auto job = jobs_->Submit(Spec(2));
  ASSERT_TRUE(job.ok());
  ASSERT_TRUE(
      jobs_->OnRankStatus("a", Failed(job->id(), 1, 0, v1::FAILURE_KIND_COLLECTIVE, "Gloo timeout"))
          .ok());
  EXPECT_EQ(Get(job->id()).state(), v1::JOB_STATE_RESTARTING) << "no peer worker to wait for";
}

// Which classes restart (docs/failures.md): one row per class.

}  // namespace
}  // namespace trainctl::coordinator
