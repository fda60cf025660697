// Placement (job_placer.h) through the JobManager: command jobs on workers
// that allow them, resuming from the checkpoint a holder keeps, elastic
// shrink and grow, and resume_from another job.
#include "coordinator/jobs/job_manager_fixture.h"

#include "absl/strings/match.h"
#include "coordinator/jobs/attempt_failure.h"

namespace trainctl::coordinator {
namespace {

TEST_F(JobManagerTest, CommandJobsRunOnlyOnWorkersThatAllowThem) {
  FakeChannel* plain = AddWorker("a", 2);
  auto cmd = jobs_->Submit(CommandSpec(1));
  ASSERT_TRUE(cmd.ok()) << cmd.status();
  EXPECT_EQ(Get(cmd->id()).state(), v1::JOB_STATE_PENDING);
  EXPECT_EQ(Get(cmd->id()).state_reason(),
            "no worker allows commands (start trainctl-worker with --allow-commands)");
  EXPECT_TRUE(plain->Starts().empty());

  // An engine job takes the allowing worker's only slot in the same pass:
  // the command job waits for a slot there, not on the plain worker.
  auto engine = jobs_->Submit(Spec(3));
  ASSERT_TRUE(engine.ok());
  FakeChannel* allowing = AddWorker("c", 1, {}, /*allow_commands=*/true);
  EXPECT_EQ(Get(engine->id()).state(), v1::JOB_STATE_SCHEDULED);
  EXPECT_EQ(Get(cmd->id()).state(), v1::JOB_STATE_PENDING);
  EXPECT_THAT(Get(cmd->id()).state_reason(),
              ::testing::StartsWith("on workers that allow commands: needs 1 cpu slots"));

  ASSERT_TRUE(jobs_->Cancel(engine->id(), "make room").ok());
  for (int r = 0; r < 3; ++r) {
    const std::string w = Get(engine->id()).attempts(0).ranks(r).worker_id();
    ASSERT_TRUE(Status(w, engine->id(), 1, r, v1::RANK_STATE_STOPPED).ok());
  }
  v1::Job j = Get(cmd->id());
  ASSERT_EQ(j.state(), v1::JOB_STATE_SCHEDULED) << j.state_reason();
  EXPECT_EQ(j.attempts(0).ranks(0).worker_id(), "c");
  ASSERT_FALSE(allowing->Starts().empty());
  EXPECT_TRUE(allowing->Starts().back().spec().has_command());
  EXPECT_TRUE(allowing->Starts().back().produce_rendezvous());

  // The dry run gives the same answer.
  auto dry = owners_->queries.DryRun(CommandSpec(2));
  ASSERT_TRUE(dry.ok());
  EXPECT_TRUE(dry->planned().empty());
  EXPECT_THAT(dry->pending_reason(), ::testing::StartsWith("on workers that allow commands: "));
}

TEST_F(JobManagerTest, CheckpointRecordsDecideWhereAndFromWhatARestartResumes) {
  std::string id = RunningJob();
  // Only the assigned worker may report a rank's checkpoint, with an absolute path.
  EXPECT_EQ(Checkpoint(*jobs_, "b", id, 1, 0, 1, 10, "/w/a/ck1").code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(Checkpoint(*jobs_, "a", id, 1, 0, 1, 10, "relative/ck1").code(),
            absl::StatusCode::kInvalidArgument);
  for (int e = 1; e <= 3; ++e) {
    ASSERT_TRUE(Checkpoint(*jobs_, "a", id, 1, 0, e, 10 * e, absl::StrCat("/w/a/ck", e)).ok());
  }
  ASSERT_TRUE(Checkpoint(*jobs_, "b", id, 1, 1, 2, 20, "/w/b/ck2").ok());
  v1::Job j = Get(id);
  std::vector<std::string> paths;
  for (const auto& r : j.checkpoints()) {
    paths.push_back(r.path());
    EXPECT_EQ(r.job_id(), id);
    EXPECT_EQ(r.spec_hash(), CheckpointSpecHash(j.spec()));
  }
  EXPECT_EQ(paths, (std::vector<std::string>{CkPath("/w/a/ck2", id, 2), CkPath("/w/a/ck3", id, 3),
                                             CkPath("/w/b/ck2", id, 2)}));

  // Worker a (holding the newest) is lost; the restart runs on b and c.
  ASSERT_NO_FATAL_FAILURE(LoseWorker("a", "b", b_, id, 1));
  ASSERT_EQ(Get(id).state(), v1::JOB_STATE_RESTARTING);
  FakeChannel* c = AddWorker("c", 1);
  j = Get(id);
  ASSERT_EQ(j.attempts_size(), 2);
  const v1::Attempt& a2 = j.attempts(1);
  EXPECT_EQ(a2.ranks(0).worker_id(), "b") << "rank 0 moves to the host with a copy";
  ASSERT_TRUE(a2.has_resume());
  EXPECT_EQ(a2.resume().path(), CkPath("/w/b/ck2", id, 2));
  EXPECT_EQ(a2.resume().global_step(), 20);
  ASSERT_FALSE(b_->Starts().empty());
  EXPECT_EQ(b_->Starts().back().resume().path(), CkPath("/w/b/ck2", id, 2));
  EXPECT_EQ(b_->Starts().back().resume().checksum(), "crc32:0000abcd");
  EXPECT_TRUE(b_->Starts().back().produce_rendezvous());
  ASSERT_FALSE(c->Starts().empty());
  EXPECT_EQ(c->Starts().back().resume().path(), CkPath("/w/b/ck2", id, 2))
      << "every rank learns the same record";
  bool said = false;
  auto events = store_->jobs().ListEvents(id, 0, 1000);
  ASSERT_TRUE(events.ok());
  for (const auto& e : *events) {
    if (e.type() == "scheduled" && e.attempt() == 2) {
      said = true;
      EXPECT_THAT(e.message(), HasSubstr("resuming from the checkpoint of job " + id +
                                         " at epoch 2 (step 20) on worker b"));
      EXPECT_THAT(
          e.message(),
          HasSubstr("the newer the checkpoint of job " + id +
                    " at epoch 3 (step 30) on worker a is unreachable (worker a is not alive)"));
    }
  }
  EXPECT_TRUE(said);
}

// Elastic (docs/elastic.md): after a lost worker the restart waits
// replace_timeout_s for the old size, then runs smaller; a checkpoint taken
// while a slot is free stops the attempt and the job grows back from it,
// without counting a restart.
TEST_F(JobManagerTest, ElasticJobShrinksAfterTheReplaceTimeoutAndGrowsBackAtACheckpoint) {
  a_ = AddWorker("a", 1);
  b_ = AddWorker("b", 1);
  v1::JobSpec spec = Spec(2);
  spec.mutable_training()->set_epochs(3);
  spec.mutable_elastic()->set_min_ranks(1);
  spec.mutable_elastic()->set_replace_timeout_s(10);
  const std::string id = RunTwoRanks(spec);
  ASSERT_FALSE(id.empty());
  ASSERT_TRUE(Checkpoint(*jobs_, "a", id, 1, 0, 0, 5, "/w/a/ck-0-5").ok())
      << "inside the first epoch";

  // b is lost; a's rank stops. One slot is free: the job waits for two.
  ASSERT_NO_FATAL_FAILURE(LoseWorker("b", "a", a_, id, 0));
  jobs_->Tick();
  EXPECT_EQ(Get(id).attempts_size(), 1);
  EXPECT_EQ(Get(id).state(), v1::JOB_STATE_RESTARTING);

  // The replace timeout runs out: attempt 2 runs on a alone, from the checkpoint.
  clock_.Advance(absl::Seconds(11));
  ASSERT_TRUE(registry_->Heartbeat("a", a_).ok());
  jobs_->Tick();
  v1::Job j = Get(id);
  ASSERT_EQ(j.attempts_size(), 2);
  ASSERT_EQ(j.attempts(1).ranks_size(), 1);
  EXPECT_EQ(j.attempts(1).ranks(0).world_size(), 1);
  EXPECT_EQ(j.attempts(1).resume().path(), CkPath("/w/a/ck-0-5", id, 0));
  EXPECT_EQ(a_->Starts().back().ranks(0).world_size(), 1);
  ASSERT_TRUE(Rendezvous("a", id, 2).ok());
  ASSERT_TRUE(Status("a", id, 2, 0, v1::RANK_STATE_RUNNING).ok());

  // c joins; nothing changes until the next checkpoint, which grows the job.
  FakeChannel* c = AddWorker("c", 1);
  EXPECT_EQ(Get(id).state(), v1::JOB_STATE_RUNNING);
  EXPECT_TRUE(c->Starts().empty());
  ASSERT_TRUE(Checkpoint(*jobs_, "a", id, 2, 0, 1, 12, "/w/a/ck-1").ok());
  j = Get(id);
  EXPECT_EQ(j.state(), v1::JOB_STATE_RESTARTING);
  EXPECT_EQ(j.attempts(1).state(), v1::ATTEMPT_STATE_CANCELLED);
  EXPECT_EQ(j.attempts(1).grow_to(), 2);
  EXPECT_EQ(j.restarts(), 1) << "growing is not a restart";
  ASSERT_FALSE(a_->Stops().empty());
  EXPECT_EQ(a_->Stops().back().attempt(), 2);
  ASSERT_TRUE(Status("a", id, 2, 0, v1::RANK_STATE_STOPPED).ok());
  j = Get(id);
  ASSERT_EQ(j.attempts_size(), 3);
  EXPECT_EQ(j.attempts(2).ranks_size(), 2);
  EXPECT_EQ(j.attempts(2).resume().path(), CkPath("/w/a/ck-1", id, 1));
  ASSERT_FALSE(c->Starts().empty());

  std::vector<std::string> events = StoredEvents(id);
  std::vector<std::string> sized;
  for (const std::string& e : events) {
    if (absl::StartsWith(e, "resiz")) sized.push_back(e);
  }
  ASSERT_EQ(sized.size(), 3u) << absl::StrJoin(events, "\n");
  EXPECT_THAT(
      sized[0],
      HasSubstr(
          "resized@2: world size 2 -> 1 (no replacement within elastic.replace_timeout_s = 10 s"));
  EXPECT_THAT(sized[1], HasSubstr("resizing@2: elastic: growing from 1 to 2 ranks (1 slot(s) free) "
                                  "at the checkpoint of step 12"));
  EXPECT_THAT(sized[2], HasSubstr("resized@3: world size 1 -> 2 (slots freed up"));
}

// Fencing (#30): the files of records `keep` drops are deleted by the
// worker that reported them, on the coordinator's word; a stale attempt's
// report is refused (and counted); a resume that cannot read its record
// forgets it and the next attempt goes on from the next older one, without
// counting a restart.
TEST_F(JobManagerTest, FencingDropsStaleReportsAndFallsBackFromAnUnreadableResume) {
  std::string id = RunningJob();
  for (int e = 1; e <= 3; ++e) {
    ASSERT_TRUE(Checkpoint(*jobs_, "a", id, 1, 0, e, 10 * e, absl::StrCat("/w/a/ck", e)).ok());
    ASSERT_TRUE(Checkpoint(*jobs_, "b", id, 1, 1, e, 10 * e, absl::StrCat("/w/b/ck", e)).ok());
  }
  auto drops = [](const FakeChannel* ch) {
    std::vector<std::string> out;
    for (const auto& m : ch->sent) {
      if (m.has_drop_checkpoints())
        out.insert(out.end(), m.drop_checkpoints().paths().begin(),
                   m.drop_checkpoints().paths().end());
    }
    return out;
  };
  EXPECT_EQ(drops(a_), std::vector<std::string>{CkPath("/w/a/ck1", id, 1)})
      << "keep 2: a's step 10 goes";
  EXPECT_EQ(drops(b_), std::vector<std::string>{CkPath("/w/b/ck1", id, 1)});

  // Worker a is lost; attempt 2 runs on b and c, resuming b's step-30 copy.
  ASSERT_NO_FATAL_FAILURE(LoseWorker("a", "b", b_, id, 1));
  AddWorker("c", 1);
  v1::Job j = Get(id);
  ASSERT_EQ(j.attempts_size(), 2);
  ASSERT_TRUE(j.attempts(1).has_resume());
  EXPECT_EQ(j.attempts(1).resume().global_step(), 30);
  EXPECT_EQ(j.restarts(), 1);

  // Attempt 1's late report (its ranks ran on) is refused: no record, no drop.
  const size_t records = j.checkpoints_size();
  EXPECT_EQ(Checkpoint(*jobs_, "b", id, 1, 1, 4, 40, "/w/b/ck4").code(),
            absl::StatusCode::kAborted);
  EXPECT_EQ(Get(id).checkpoints_size(), static_cast<int>(records));
  EXPECT_EQ(owners_->Gauges().stale_reports_refused, 1);

  // Rank 0 cannot read the step-30 copy (a stale rank replaced it): the
  // record is forgotten, the next attempt resumes step 20, no restart counted.
  ASSERT_TRUE(
      jobs_->OnRankStatus("b", Failed(id, 2, 0, v1::FAILURE_KIND_RESUME, "checkpoint is corrupt"))
          .ok());
  j = Get(id);
  EXPECT_EQ(j.state(), v1::JOB_STATE_RESTARTING) << j.state_reason();
  EXPECT_EQ(j.restarts(), 1);
  for (const auto& r : j.checkpoints())
    EXPECT_NE(r.path(), CkPath("/w/b/ck3", id, 3)) << "forgotten";
  std::string fallback;
  for (const auto& e : StoredEvents(id)) {
    if (absl::StrContains(e, "resume_fallback")) fallback = e;
  }
  EXPECT_THAT(
      fallback,
      HasSubstr(
          "could not be read; forgotten: the next attempt resumes from the checkpoint at step 30"))
      << "a's step-30 record is still newest";
  ASSERT_TRUE(Status("c", id, 2, 1, v1::RANK_STATE_STOPPED).ok());
  j = Get(id);
  ASSERT_EQ(j.attempts_size(), 3);
  ASSERT_TRUE(j.attempts(2).has_resume());
  EXPECT_EQ(j.attempts(2).resume().global_step(), 20)
      << "a's newer copy is unreachable; b's step 20 remains";
}

// A resume_from checkpoint of another job that cannot be read is what the
// user asked for: the job fails, it does not start from scratch.
TEST_F(JobManagerTest, AnUnreadableCheckpointOfAnotherJobFailsTheJob) {
  std::string id = RunningJob();
  v1::Job next = Get(id);
  v1::Attempt a;
  a.set_number(1);
  a.mutable_resume()->set_job_id("older-job");
  std::vector<JobEvent> events;
  *next.mutable_attempts(0)->mutable_resume() = a.resume();
  BuildAttemptFailure(next, events, absl::Now(), v1::FAILURE_KIND_RESUME, "cannot open checkpoint",
                      0);
  EXPECT_EQ(next.state(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(next.state_reason(), HasSubstr("of job older-job, cannot be read: not restarted"));
}

TEST_F(JobManagerTest, RestartWithoutAReachableCheckpointSaysItStartsFromScratch) {
  std::string id = RunningJob();
  ASSERT_TRUE(Checkpoint(*jobs_, "a", id, 1, 0, 1, 10, "/w/a/ck1").ok());
  ASSERT_NO_FATAL_FAILURE(LoseWorker("a", "b", b_, id, 1));
  AddWorker("c", 1);
  v1::Job j = Get(id);
  ASSERT_EQ(j.attempts_size(), 2);
  EXPECT_FALSE(j.attempts(1).has_resume());
  auto events = store_->jobs().ListEvents(id, 0, 1000);
  ASSERT_TRUE(events.ok());
  std::string scheduled;
  for (const auto& e : *events) {
    if (e.type() == "scheduled" && e.attempt() == 2) scheduled = e.message();
  }
  EXPECT_THAT(
      scheduled,
      HasSubstr("starting from scratch: the checkpoint of job " + id +
                " at epoch 1 (step 10) on worker a is unreachable (worker a is not alive)"));
}

TEST_F(JobManagerTest, ResumeFromAnotherJobChecksStateAndCompatibility) {
  std::string id = RunningJob();
  v1::JobSpec cont = Spec(2);
  cont.mutable_training()->set_epochs(3);
  cont.mutable_resume_from()->set_job(id);
  EXPECT_EQ(jobs_->Submit(cont).status().code(), absl::StatusCode::kFailedPrecondition)
      << "still running";
  ASSERT_TRUE(Checkpoint(*jobs_, "a", id, 1, 0, 1, 10, "/w/a/ck1").ok());
  ASSERT_TRUE(jobs_->Cancel(id, "").ok());
  ASSERT_TRUE(Status("a", id, 1, 0, v1::RANK_STATE_STOPPED).ok());
  ASSERT_TRUE(Status("b", id, 1, 1, v1::RANK_STATE_STOPPED).ok());

  v1::JobSpec other_model = cont;
  other_model.mutable_model()->mutable_mlp()->add_hidden(8);
  auto refused = jobs_->Submit(other_model);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("model"));
  v1::JobSpec other_opt = cont;
  other_opt.mutable_training()->mutable_optimizer()->set_name(v1::OPTIMIZER_SGD);
  refused = jobs_->Submit(other_opt);
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("training.optimizer.name"));
  v1::JobSpec done = cont;
  done.mutable_training()->set_epochs(1);
  refused = jobs_->Submit(done);
  EXPECT_THAT(std::string(refused.status().message()),
              HasSubstr("training.epochs: 1, but job " + id));
  v1::JobSpec missing = cont;
  missing.mutable_resume_from()->set_job("no-such-job");
  EXPECT_THAT(std::string(jobs_->Submit(missing).status().message()),
              HasSubstr("resume_from.job: no job"));

  auto next = jobs_->Submit(cont);
  ASSERT_TRUE(next.ok()) << next.status();
  v1::Job j = Get(next->id());
  ASSERT_EQ(j.attempts_size(), 1);
  ASSERT_TRUE(j.attempts(0).has_resume());
  EXPECT_EQ(j.attempts(0).resume().job_id(), id);
  EXPECT_EQ(j.attempts(0).ranks(0).worker_id(), "a");
  EXPECT_EQ(a_->Starts().back().resume().path(), CkPath("/w/a/ck1", id, 1));
}

// Issue #27 item 9: a continuation writes its TensorBoard events into the
// run directory of the job it continues, whatever its own checkpoint.dir.
TEST_F(JobManagerTest, AContinuationWritesTensorBoardIntoItsSourcesRun) {
  a_ = AddWorker("a", 1);
  b_ = AddWorker("b", 1);
  v1::JobSpec first = Spec(2);
  first.mutable_checkpoint()->set_dir("/ck/{job_id}");
  first.mutable_tensorboard()->set_enabled(true);
  const std::string id = RunTwoRanks(first);
  ASSERT_FALSE(id.empty());
  ASSERT_TRUE(Checkpoint(*jobs_, "a", id, 1, 0, 1, 10,
                         absl::StrCat("/ck/", id, "/", id, ".ckpt-epoch-000001.pt"))
                  .ok());
  ASSERT_TRUE(jobs_->Cancel(id, "").ok());
  ASSERT_TRUE(Status("a", id, 1, 0, v1::RANK_STATE_STOPPED).ok());
  ASSERT_TRUE(Status("b", id, 1, 1, v1::RANK_STATE_STOPPED).ok());
  v1::JobSpec cont = first;
  cont.mutable_training()->set_epochs(3);
  cont.mutable_resume_from()->set_job(id);
  auto next = jobs_->Submit(cont);
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ(next->spec().checkpoint().dir(), "/ck/" + next->id())
      << "its own checkpoints, in its own directory";
  EXPECT_EQ(next->spec().tensorboard().dir(), "/ck/" + id + "/tensorboard")
      << "the source's TensorBoard run";
  // An explicit tensorboard.dir is the user's choice.
  cont.mutable_tensorboard()->set_dir("/tb/mine");
  auto mine = jobs_->Submit(cont);
  ASSERT_TRUE(mine.ok()) << mine.status();
  EXPECT_EQ(mine->spec().tensorboard().dir(), "/tb/mine");
}

// A script's continuation runs the code of the job it continues unless its
// spec ships code of its own (issue #44 item 2).
TEST_F(JobManagerTest, AScriptsContinuationKeepsItsSourcesCodeUnlessItNamesItsOwn) {
  a_ = AddWorker("a", 1, {}, /*allow_commands=*/true);
  b_ = AddWorker("b", 1, {}, /*allow_commands=*/true);
  v1::JobSpec first = CommandSpec(2);
  first.mutable_command()->mutable_code()->set_digest("sha256:" + std::string(64, 'a'));
  first.mutable_command()->mutable_code()->set_size_bytes(10);
  const std::string id = RunTwoRanks(first);
  ASSERT_FALSE(id.empty());
  ASSERT_TRUE(Checkpoint(*jobs_, "a", id, 1, 0, 1, 10, "/w/a/ck1").ok());
  ASSERT_TRUE(jobs_->Cancel(id, "").ok());
  ASSERT_TRUE(Status("a", id, 1, 0, v1::RANK_STATE_STOPPED).ok());
  ASSERT_TRUE(Status("b", id, 1, 1, v1::RANK_STATE_STOPPED).ok());
  v1::JobSpec cont = CommandSpec(2);
  cont.mutable_resume_from()->set_job(id);
  auto next = jobs_->Submit(cont);
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ(next->spec().command().code().digest(), first.command().code().digest());
  EXPECT_EQ(next->spec().command().code().size_bytes(), 10);
  cont.mutable_command()->mutable_code()->set_digest("sha256:" + std::string(64, 'b'));
  auto own = jobs_->Submit(cont);
  ASSERT_TRUE(own.ok()) << own.status();
  EXPECT_EQ(own->spec().command().code().digest(), "sha256:" + std::string(64, 'b'));
}
// Issue #27 item 7: a job the cluster as it is can never run is refused at
// submit (saying why and what to do), unless it waits for capacity; a
// cluster nobody joined yet takes it.
TEST_F(JobManagerTest, AJobThatCanNeverFitIsRefusedUnlessItWaitsForCapacity) {
  refuse_unschedulable_ = true;
  Open();
  EXPECT_TRUE(jobs_->Submit(Spec(16)).ok()) << "no worker has joined yet: it waits";
  a_ = AddWorker("a", 2);
  b_ = AddWorker("b", 2);
  absl::StatusOr<v1::Job> big = jobs_->Submit(Spec(16));
  ASSERT_EQ(big.status().code(), absl::StatusCode::kFailedPrecondition) << big.status();
  EXPECT_THAT(
      std::string(big.status().message()),
      HasSubstr(
          "the cluster as it is can never run this job: needs 16 cpu slots, the cluster has 4 in "
          "total across 2 workers"));
  EXPECT_THAT(std::string(big.status().message()), HasSubstr("--wait-for-capacity"));
  absl::StatusOr<v1::Job> cmd = jobs_->Submit(CommandSpec(1));
  EXPECT_EQ(cmd.status().code(), absl::StatusCode::kFailedPrecondition)
      << "no worker allows commands";

  v1::JobSpec waits = Spec(16);
  waits.mutable_scheduling()->set_wait_for_capacity(true);
  absl::StatusOr<v1::Job> w = jobs_->Submit(waits);
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ(w->state(), v1::JOB_STATE_PENDING);
  // One that fits once slots free up is taken, as before.
  EXPECT_TRUE(jobs_->Submit(Spec(4)).ok());
}

// Issue #44 item 8: scheduling.nodes (submit --nnodes) puts the ranks on
// exactly that many workers, the same number on each, and a cluster with
// too few such workers refuses it at submit, saying so.
TEST_F(JobManagerTest, SchedulingNodesSpreadsTheRanksOverThatManyWorkers) {
  refuse_unschedulable_ = true;
  Open();
  a_ = AddWorker("a", 2);
  b_ = AddWorker("b", 2);
  v1::JobSpec spec = Spec(2);
  spec.mutable_scheduling()->set_nodes(2);
  absl::StatusOr<v1::Job> j = jobs_->Submit(spec);
  ASSERT_TRUE(j.ok()) << j.status();
  owners_->placer.Schedule();
  const v1::Job placed = Get(j->id());
  ASSERT_EQ(placed.attempts_size(), 1) << placed.state_reason();
  const v1::Attempt& a = placed.attempts(0);
  ASSERT_EQ(a.ranks_size(), 2);
  EXPECT_NE(a.ranks(0).worker_id(), a.ranks(1).worker_id())
      << "a plain job of 2 would share one worker";
  for (const v1::RankAssignment& r : a.ranks()) {
    EXPECT_EQ(r.num_nodes(), 2);
    EXPECT_EQ(r.local_world_size(), 1);
    EXPECT_EQ(r.local_rank(), 0);
    EXPECT_EQ(r.node_rank(), r.rank());
  }

  v1::JobSpec three = Spec(3);
  three.mutable_scheduling()->set_nodes(3);
  absl::StatusOr<v1::Job> refused = jobs_->Submit(three);
  ASSERT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition) << refused.status();
  EXPECT_THAT(std::string(refused.status().message()),
              HasSubstr("can never run this job: needs 3 cpu slots on 3 workers, 1 on each "
                        "(scheduling.nodes), and 2 "
                        "of the 2 schedulable workers of its kind have 1 slot or more"));
  EXPECT_THAT(std::string(refused.status().message()),
              HasSubstr("lower world_size or scheduling.nodes (--nnodes)"));
}

TEST_F(JobManagerTest, AJobPendingPastItsTimeoutFailsWithItsPendingReason) {
  Open();
  a_ = AddWorker("a", 1);
  v1::JobSpec spec = Spec(2);
  spec.mutable_scheduling()->set_pending_timeout_s(30);
  absl::StatusOr<v1::Job> j = jobs_->Submit(spec);
  ASSERT_TRUE(j.ok()) << j.status();
  owners_->placer.Schedule();
  clock_.Advance(absl::Seconds(29));
  jobs_->Tick();
  EXPECT_EQ(Get(j->id()).state(), v1::JOB_STATE_PENDING);
  clock_.Advance(absl::Seconds(2));
  jobs_->Tick();
  v1::Job failed = Get(j->id());
  EXPECT_EQ(failed.state(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(failed.state_reason(),
              HasSubstr("still pending after scheduling.pending_timeout_s (30s): needs 2"));
  EXPECT_THAT(StoredEvents(j->id()),
              ::testing::Contains(HasSubstr("failed@0: still pending after")));
}

}  // namespace
}  // namespace trainctl::coordinator
