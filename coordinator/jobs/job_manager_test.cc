// The job lifecycle through the JobManager (job_manager_fixture.h): placement,
// rendezvous, rank ends, restarts and their budget, cancel from each state,
// paging, recovery and reconnects, and one write per transition under store
// faults.
#include "coordinator/jobs/job_manager_fixture.h"

#include <set>
#include <tuple>

namespace trainctl::coordinator {
namespace {

TEST_F(JobManagerTest, PendingUntilWorkersJoinThenGangPlaced) {
  auto job = jobs_->Submit(Spec(2));
  ASSERT_TRUE(job.ok());
  EXPECT_EQ(Get(job->id()).state(), v1::JOB_STATE_PENDING);
  EXPECT_FALSE(Get(job->id()).state_reason().empty());
  FakeChannel* a = AddWorker("a", 1);
  EXPECT_EQ(Get(job->id()).state(), v1::JOB_STATE_PENDING) << "gang: one slot is not enough";
  EXPECT_TRUE(a->Starts().empty());
  FakeChannel* b = AddWorker("b", 1);
  v1::Job j = Get(job->id());
  EXPECT_EQ(j.state(), v1::JOB_STATE_SCHEDULED);
  ASSERT_EQ(j.attempts_size(), 1);
  ASSERT_EQ(j.attempts(0).ranks_size(), 2);
  EXPECT_EQ(j.attempts(0).ranks(0).worker_id(), "a");
  EXPECT_EQ(j.attempts(0).ranks(1).worker_id(), "b");
  EXPECT_EQ(j.attempts(0).ranks(1).node_rank(), 1);
  ASSERT_EQ(a->Starts().size(), 1u);
  ASSERT_EQ(b->Starts().size(), 1u);
  EXPECT_TRUE(a->Starts()[0].produce_rendezvous());
  EXPECT_FALSE(b->Starts()[0].produce_rendezvous());
  EXPECT_EQ(a->Starts()[0].spec().data().batch_size(), 32) << "workers get the resolved spec";
}

TEST_F(JobManagerTest, WholeLifeWithRendezvousMetricsAndEvents) {
  FakeChannel* a = AddWorker("a", 2);
  auto job = jobs_->Submit(Spec(2));
  ASSERT_TRUE(job.ok());
  std::string id = job->id();
  RecordingSubscriber sub;
  hub_.Subscribe(id, &sub);
  EXPECT_EQ(Get(id).attempts(0).ranks(1).local_rank(), 1) << "both ranks on one worker";

  EXPECT_EQ(Rendezvous("a", id, 1).code(), absl::StatusCode::kOk);
  EXPECT_EQ(a->Rendezvous(), 1);
  EXPECT_EQ(Get(id).attempts(0).rendezvous().gloo_store_address(), "127.0.0.1:29500");
  ASSERT_TRUE(Status("a", id, 1, 0, v1::RANK_STATE_STARTING).ok());
  ASSERT_TRUE(Status("a", id, 1, 0, v1::RANK_STATE_RUNNING).ok());
  EXPECT_EQ(Get(id).state(), v1::JOB_STATE_SCHEDULED);
  ASSERT_TRUE(Status("a", id, 1, 1, v1::RANK_STATE_RUNNING).ok());
  EXPECT_EQ(Get(id).state(), v1::JOB_STATE_RUNNING);

  v1::MetricBatch batch;
  batch.set_job_id(id);
  batch.set_attempt(1);
  for (int r = 0; r < 2; ++r) {
    v1::MetricPoint* p = batch.add_points();
    p->set_kind(v1::MetricPoint::KIND_TRAIN);
    p->set_rank(r);
    p->set_epoch(0);
    p->set_step(2);
    p->set_steps_per_epoch(4);
    p->set_loss(0.5);
    p->set_samples_per_sec(64);
    p->set_samples_seen(64);
  }
  v1::MetricPoint* end = batch.add_points();
  end->set_kind(v1::MetricPoint::KIND_EPOCH_END);
  end->set_rank(0);
  end->set_epoch(0);
  end->set_step(4);
  end->set_steps_per_epoch(4);
  end->mutable_eval()->set_accuracy(0.75);
  ASSERT_TRUE(owners_->ingest.OnMetrics("a", batch).ok());
  v1::Job j = Get(id);
  EXPECT_EQ(j.progress().step(), 2) << "the slowest rank";
  EXPECT_EQ(j.progress().samples_seen(), 128);
  EXPECT_DOUBLE_EQ(j.progress().samples_per_sec(), 128);
  EXPECT_GT(j.progress().eta_seconds(), 0);
  EXPECT_DOUBLE_EQ(j.progress().last_eval().accuracy(), 0.75);
  auto stored = store_->telemetry().ListMetrics(id, 100);
  ASSERT_TRUE(stored.ok());
  EXPECT_EQ(stored->size(), 3u);
  EXPECT_EQ(j.metric_summary().train_points(), 2);
  EXPECT_DOUBLE_EQ(j.metric_summary().mean_samples_per_sec(), 128) << "both ranks together";
  EXPECT_DOUBLE_EQ(j.metric_summary().last_loss(), 0.5);
  EXPECT_DOUBLE_EQ(j.metric_summary().best_eval().accuracy(), 0.75);

  // Rank 0's final model: only rank 0, only the job's file in its
  // checkpoint dir; shown once the job SUCCEEDED.
  const std::string model_path = absl::StrCat("/w/jobs/", id, "/checkpoints/", id, ".model.pt");
  v1::FinalModelReport model;
  model.set_job_id(id);
  model.set_attempt(1);
  model.set_rank(1);
  model.set_path(model_path);
  EXPECT_EQ(jobs_->OnFinalModel("a", model).code(), absl::StatusCode::kInvalidArgument);
  model.set_rank(0);
  model.set_path("relative/model.pt");
  EXPECT_EQ(jobs_->OnFinalModel("a", model).code(), absl::StatusCode::kInvalidArgument);
  // Not the job's file, or not in its directory: never recorded, so no
  // fetch can follow it (a worker's key, another job's model).
  for (const std::string& bad :
       {std::string("/w/worker.key"), absl::StrCat("/w/jobs/", id, "/checkpoints/model.pt"),
        absl::StrCat("/w/jobs/other/checkpoints/", id, ".model.pt"),
        absl::StrCat("/w/jobs/", id, "/checkpoints/../", id, ".model.pt")}) {
    model.set_path(bad);
    absl::Status s = jobs_->OnFinalModel("a", model);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(s.message(),
                HasSubstr("is not the final model of job " + id + " in its checkpoint.dir"))
        << bad;
  }
  model.set_path(model_path);
  ASSERT_TRUE(jobs_->OnFinalModel("a", model).ok());
  EXPECT_EQ(Get(id).final_model(), "");

  ASSERT_TRUE(Status("a", id, 1, 0, v1::RANK_STATE_SUCCEEDED).ok());
  EXPECT_EQ(Get(id).state(), v1::JOB_STATE_RUNNING);
  ASSERT_TRUE(Status("a", id, 1, 1, v1::RANK_STATE_SUCCEEDED).ok());
  EXPECT_EQ(Get(id).state(), v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(Get(id).final_model(), model_path);
  EXPECT_EQ(Get(id).final_model_worker(), "a");
  // Stored with the job: a restarted coordinator still knows it.
  auto snapshot = store_->LoadAll();
  ASSERT_TRUE(snapshot.ok());
  EXPECT_EQ(snapshot->jobs.back().final_model(), model_path);
  EXPECT_EQ(snapshot->jobs.back().metric_summary().train_points(), 2);
  EXPECT_TRUE(Get(id).has_end_time());
  EXPECT_TRUE(sub.ended);
  EXPECT_THAT(sub.EventTypes(), ::testing::ElementsAre("running", "epoch_end", "succeeded"));
  auto events = store_->jobs().ListEvents(id, 0, 100);
  ASSERT_TRUE(events.ok());
  std::vector<std::string> types;
  for (const auto& e : *events) types.push_back(e.type());
  EXPECT_THAT(
      types, ::testing::ElementsAre("submitted", "scheduled", "running", "epoch_end", "succeeded"));
  EXPECT_TRUE(owners_->queries.BusySlots("a").empty());
}

// A script's points carry only what it reported: the summary and the
// progress take what is there (a loss without a rate, no invented 0s), and
// its eval reports (KIND_EVAL) are the job's last and best eval.
TEST_F(JobManagerTest, AScriptsPartialPointsAndEvalReportsFoldIntoTheSummary) {
  AddWorker("a", 1);
  auto job = jobs_->Submit(Spec(1));
  ASSERT_TRUE(job.ok());
  const std::string id = job->id();
  ASSERT_EQ(Rendezvous("a", id, 1).code(), absl::StatusCode::kOk);
  ASSERT_TRUE(Status("a", id, 1, 0, v1::RANK_STATE_RUNNING).ok());
  auto send = [&](std::vector<v1::MetricPoint> points) {
    v1::MetricBatch batch;
    batch.set_job_id(id);
    batch.set_attempt(1);
    for (v1::MetricPoint& p : points) *batch.add_points() = std::move(p);
    ASSERT_TRUE(owners_->ingest.OnMetrics("a", batch).ok());
  };
  auto point = [](v1::MetricPoint::Kind kind, int step) {
    v1::MetricPoint p;
    p.set_kind(kind);
    p.set_step(step);
    return p;
  };
  v1::MetricPoint train = point(v1::MetricPoint::KIND_TRAIN, 1);
  train.set_loss(0.75);
  v1::MetricPoint eval_a = point(v1::MetricPoint::KIND_EVAL, 1);
  eval_a.mutable_eval()->set_accuracy(0.5);
  (*eval_a.mutable_scalars())["val_f1"] = 0.25;
  v1::MetricPoint eval_b = point(v1::MetricPoint::KIND_EVAL, 2);
  eval_b.mutable_eval()->set_accuracy(0.25);
  send({train, eval_a, eval_b});
  v1::Job j = Get(id);
  EXPECT_EQ(j.metric_summary().train_points(), 1);
  EXPECT_DOUBLE_EQ(j.metric_summary().last_loss(), 0.75);
  EXPECT_FALSE(j.metric_summary().has_mean_samples_per_sec()) << "no rate was reported";
  EXPECT_DOUBLE_EQ(j.progress().last_loss(), 0.75);
  EXPECT_EQ(j.progress().samples_per_sec(), 0);
  EXPECT_DOUBLE_EQ(j.metric_summary().best_eval().accuracy(), 0.5);
  EXPECT_FALSE(j.metric_summary().best_eval().has_loss());
  EXPECT_DOUBLE_EQ(j.progress().last_eval().accuracy(), 0.25);

  // A window without a loss keeps the last one; a rate starts the mean.
  v1::MetricPoint rate = point(v1::MetricPoint::KIND_TRAIN, 2);
  rate.set_samples_per_sec(100);
  send({rate, point(v1::MetricPoint::KIND_TRAIN, 3)});
  j = Get(id);
  EXPECT_EQ(j.metric_summary().train_points(), 3);
  EXPECT_DOUBLE_EQ(j.metric_summary().last_loss(), 0.75);
  EXPECT_DOUBLE_EQ(j.metric_summary().mean_samples_per_sec(), 100)
      << "over the windows that had a rate";
  EXPECT_EQ(j.metric_summary().rate_points(), 1);
  auto stored = store_->telemetry().ListMetrics(id, 100);
  ASSERT_TRUE(stored.ok());
  ASSERT_EQ(stored->size(), 5u);
}

TEST_F(JobManagerTest, ALeaseDoesNotRunOutWhileTheWorkersMessagesWaitForTheLoop) {
  std::string id = RunningJob();
  // The loop stalled 4 s (a slow commit) while b's heartbeats were read and
  // queued behind it; the lease timer runs first: b is not silent.
  clock_.Advance(absl::Seconds(4));
  ASSERT_TRUE(registry_->Heartbeat("a", a_).ok());
  b_->unhandled = true;
  EXPECT_TRUE(registry_->ExpireLeases().empty());
  EXPECT_EQ(Get(id).state(), v1::JOB_STATE_RUNNING);
  // Handled: the heartbeat renews the lease.
  b_->unhandled = false;
  ASSERT_TRUE(registry_->Heartbeat("b", b_).ok());
  EXPECT_TRUE(registry_->ExpireLeases().empty());
  // Silent for real past its lease (3 s): lost.
  clock_.Advance(absl::Seconds(4));
  ASSERT_TRUE(registry_->Heartbeat("a", a_).ok());
  EXPECT_THAT(registry_->ExpireLeases(), ::testing::ElementsAre("b"));
}

TEST_F(JobManagerTest, WorkerLeasesRunOnTheMonotonicClock) {
  std::string id = RunningJob();
  // The wall clock stepped 5 s forward: no lease is cut short.
  clock_.StepWall(absl::Seconds(5));
  EXPECT_TRUE(registry_->ExpireLeases().empty());
  EXPECT_EQ(Get(id).state(), v1::JOB_STATE_RUNNING);
  // Stepped 120 s back: a worker that stops heartbeating is still lost when
  // its lease (3 s) runs out, not 120 s later.
  clock_.StepWall(absl::Seconds(-120));
  clock_.Advance(absl::Seconds(2));
  ASSERT_TRUE(registry_->Heartbeat("a", a_).ok());
  clock_.Advance(absl::Seconds(2));
  EXPECT_THAT(registry_->ExpireLeases(), ::testing::ElementsAre("b"));
}

TEST_F(JobManagerTest, ARetriedSubmitWithTheSameRequestIdReturnsTheFirstJob) {
  auto first = jobs_->Submit(Spec(2), "ann", "tok-ann", "req-1");
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->request_id(), "req-1");
  // The answer was lost; the client sends the same request again.
  auto again = jobs_->Submit(Spec(2), "ann", "tok-ann", "req-1");
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->id(), first->id());
  // Another owner's id is its own; another id is another job.
  auto bob = jobs_->Submit(Spec(2), "bob", "tok-bob", "req-1");
  ASSERT_TRUE(bob.ok());
  EXPECT_NE(bob->id(), first->id());
  auto other = jobs_->Submit(Spec(2), "ann", "tok-ann", "req-2");
  ASSERT_TRUE(other.ok());
  EXPECT_NE(other->id(), first->id());
  // Kept across a coordinator restart (from the stored job).
  Open();
  auto after_restart = jobs_->Submit(Spec(2), "ann", "tok-ann", "req-1");
  ASSERT_TRUE(after_restart.ok());
  EXPECT_EQ(after_restart->id(), first->id());
  auto listed = owners_->queries.List(v1::ListJobsRequest());
  ASSERT_TRUE(listed.ok());
  EXPECT_EQ(listed->jobs_size(), 3);
  // For a day.
  clock_.Advance(JobManager::kRequestIdLifetime);
  auto next_day = jobs_->Submit(Spec(2), "ann", "tok-ann", "req-1");
  ASSERT_TRUE(next_day.ok());
  EXPECT_NE(next_day->id(), first->id());
  // A bad id is named.
  auto bad = jobs_->Submit(Spec(2), "ann", "tok-ann", "has space");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(), HasSubstr("request_id"));
}

TEST_F(JobManagerTest, RankFailureRestartsFromANewAttemptOnceSlotsFree) {
  std::string id = RunningJob();
  ASSERT_TRUE(Status("b", id, 1, 1, v1::RANK_STATE_FAILED, v1::FAILURE_KIND_SIGNAL).ok());
  v1::Job j = Get(id);
  EXPECT_EQ(j.state(), v1::JOB_STATE_RESTARTING);
  EXPECT_EQ(j.restarts(), 1);
  EXPECT_EQ(j.attempts(0).state(), v1::ATTEMPT_STATE_FAILED);
  EXPECT_THAT(j.attempts(0).reason(), HasSubstr("rank 1 on host-b (worker b)"));
  EXPECT_THAT(j.attempts(0).reason(), HasSubstr("Traceback: boom"));
  ASSERT_EQ(a_->Stops().size(), 1u) << "the surviving rank is stopped";
  EXPECT_EQ(a_->Stops()[0].ranks(0), 0);
  EXPECT_EQ(j.attempts_size(), 1) << "rank 0 still holds its slot";
  // A stale attempt's non-final report is refused; its end is recorded.
  EXPECT_EQ(Status("a", id, 1, 0, v1::RANK_STATE_RUNNING).code(), absl::StatusCode::kAborted);
  ASSERT_TRUE(Status("a", id, 1, 0, v1::RANK_STATE_STOPPED).ok());
  j = Get(id);
  EXPECT_EQ(j.state(), v1::JOB_STATE_SCHEDULED);
  ASSERT_EQ(j.attempts_size(), 2);
  EXPECT_EQ(a_->Starts().back().attempt(), 2);
  // Rendezvous for the old attempt is refused.
  EXPECT_EQ(Rendezvous("a", id, 1).code(), absl::StatusCode::kAborted);
  EXPECT_TRUE(Rendezvous("a", id, 2).ok());
}

TEST_F(JobManagerTest, RestartBudgetIsRespected) {
  std::string id = RunningJob(/*max_restarts=*/1);
  ASSERT_TRUE(Status("b", id, 1, 1, v1::RANK_STATE_FAILED, v1::FAILURE_KIND_EXIT, 1).ok());
  ASSERT_TRUE(Status("a", id, 1, 0, v1::RANK_STATE_STOPPED).ok());
  ASSERT_EQ(Get(id).attempts_size(), 2);
  ASSERT_TRUE(Status("a", id, 2, 0, v1::RANK_STATE_FAILED, v1::FAILURE_KIND_EXIT, 3).ok());
  v1::Job j = Get(id);
  EXPECT_EQ(j.state(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(j.state_reason(), HasSubstr("exited with code 3"));
  EXPECT_THAT(j.state_reason(), HasSubstr("no restarts left: 1 of 1 used"));
}

TEST_F(JobManagerTest, ConfigErrorFailsAtOnce) {
  std::string id = RunningJob();
  ASSERT_TRUE(Status("a", id, 1, 0, v1::RANK_STATE_FAILED, v1::FAILURE_KIND_CONFIG, 2).ok());
  v1::Job j = Get(id);
  EXPECT_EQ(j.state(), v1::JOB_STATE_FAILED);
  EXPECT_EQ(j.restarts(), 0);
  EXPECT_THAT(j.state_reason(), HasSubstr("not restarted"));
}

TEST_F(JobManagerTest, LostWorkerFailsItsRanksAndRestarts) {
  std::string id = RunningJob();
  clock_.Advance(absl::Seconds(2));
  ASSERT_TRUE(registry_->Heartbeat("a", a_).ok());
  clock_.Advance(absl::Seconds(2));  // b silent for 4 s > 3 s lease.
  std::vector<std::string> lost = registry_->ExpireLeases();
  ASSERT_EQ(lost, std::vector<std::string>{"b"});
  EXPECT_TRUE(b_->closed);
  for (const auto& w : lost) owners_->health.OnWorkerLost(w);
  v1::Job j = Get(id);
  EXPECT_EQ(j.state(), v1::JOB_STATE_RESTARTING);
  EXPECT_EQ(j.attempts(0).ranks(1).exit().kind(), v1::FAILURE_KIND_WORKER_LOST);
  EXPECT_THAT(j.attempts(0).reason(), HasSubstr("lost with its worker"));
  EXPECT_EQ(registry_->Find("b")->state(), v1::WORKER_STATE_LOST);
  // b comes back: the job runs again once a's old rank has stopped.
  ASSERT_TRUE(Status("a", id, 1, 0, v1::RANK_STATE_STOPPED).ok());
  FakeChannel* b2 = AddWorker("b", 1);
  EXPECT_EQ(registry_->Find("b")->state(), v1::WORKER_STATE_ALIVE);
  EXPECT_EQ(Get(id).attempts_size(), 2);
  EXPECT_EQ(b2->Starts().size(), 1u);
}

TEST_F(JobManagerTest, BrokenSessionIsLostAfterTheDisconnectGraceUnlessItReconnects) {
  std::string id = RunningJob();
  // b's stream breaks without a goodbye (daemon killed): LOST 1 s later,
  // long before its 3 s lease.
  registry_->SessionEnded("b", b_, /*left=*/false);
  clock_.Advance(absl::Milliseconds(900));
  EXPECT_TRUE(registry_->ExpireLeases().empty());
  clock_.Advance(absl::Milliseconds(200));
  ASSERT_EQ(registry_->ExpireLeases(), std::vector<std::string>{"b"});
  owners_->health.OnWorkerLost("b");
  EXPECT_EQ(Get(id).state(), v1::JOB_STATE_RESTARTING);
  // a's stream breaks too, but a reconnects within the grace: nothing lost.
  registry_->SessionEnded("a", a_, /*left=*/false);
  clock_.Advance(absl::Milliseconds(300));
  AddWorker("a", 1);
  clock_.Advance(absl::Seconds(2));
  ASSERT_TRUE(registry_->Heartbeat("a", channels_.back().get()).ok());
  EXPECT_TRUE(registry_->ExpireLeases().empty());
  EXPECT_EQ(registry_->Find("a")->state(), v1::WORKER_STATE_ALIVE);
}

TEST_F(JobManagerTest, SecondSessionForALiveWorkerIsRefused) {
  AddWorker("a", 1);
  FakeChannel other;
  v1::Register reg;
  reg.set_worker_id("a");
  reg.set_hostname("imposter");
  reg.add_slots()->set_kind(v1::Slot::KIND_CPU);
  EXPECT_EQ(registry_->Register(reg, &other).status().code(), absl::StatusCode::kAlreadyExists);
  reg.clear_slots();
  EXPECT_EQ(registry_->Register(reg, &other).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(JobManagerTest, CancelFromEveryState) {
  // PENDING.
  auto p = jobs_->Submit(Spec(4));
  ASSERT_TRUE(p.ok());
  ASSERT_TRUE(jobs_->Cancel(p->id(), "").ok());
  EXPECT_EQ(Get(p->id()).state(), v1::JOB_STATE_CANCELLED);
  EXPECT_EQ(jobs_->Cancel(p->id(), "").status().code(), absl::StatusCode::kFailedPrecondition);
  // RUNNING: ranks are told to stop and their slots stay busy until they report.
  std::string id = RunningJob();
  ASSERT_TRUE(jobs_->Cancel(id, "no longer needed").ok());
  v1::Job j = Get(id);
  EXPECT_EQ(j.state(), v1::JOB_STATE_CANCELLED);
  EXPECT_EQ(j.attempts(0).state(), v1::ATTEMPT_STATE_CANCELLED);
  EXPECT_EQ(a_->Stops().size(), 1u);
  EXPECT_EQ(b_->Stops().size(), 1u);
  EXPECT_EQ(owners_->queries.BusySlots("a").size(), 1u);
  ASSERT_TRUE(Status("a", id, 1, 0, v1::RANK_STATE_STOPPED).ok());
  EXPECT_TRUE(owners_->queries.BusySlots("a").empty());
  // SCHEDULED.
  auto s = jobs_->Submit(Spec(1));
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(Get(s->id()).state(), v1::JOB_STATE_SCHEDULED);
  ASSERT_TRUE(jobs_->Cancel(s->id(), "").ok());
  EXPECT_EQ(Get(s->id()).state(), v1::JOB_STATE_CANCELLED);
  // RESTARTING.
  ASSERT_TRUE(Status("b", id, 1, 1, v1::RANK_STATE_STOPPED).ok());
  ASSERT_TRUE(Status("a", s->id(), 1, 0, v1::RANK_STATE_STOPPED).ok());
  auto r = jobs_->Submit(Spec(2));
  ASSERT_TRUE(r.ok());
  ASSERT_TRUE(Status("a", r->id(), 1, 0, v1::RANK_STATE_FAILED, v1::FAILURE_KIND_EXIT, 1).ok());
  EXPECT_EQ(Get(r->id()).state(), v1::JOB_STATE_RESTARTING);
  ASSERT_TRUE(jobs_->Cancel(r->id(), "").ok());
  EXPECT_EQ(Get(r->id()).state(), v1::JOB_STATE_CANCELLED);
  EXPECT_EQ(jobs_->Cancel("nope", "").status().code(), absl::StatusCode::kNotFound);
}

// CancelJobs (JobManager::CancelMatching): every filter narrows; ended jobs
// never match; a dry run changes nothing; each job gets its `cancelled`
// event with the reason and a running one's ranks are told to stop.
TEST_F(JobManagerTest, CancelMatchingCancelsExactlyTheMatchingJobsNotEnded) {
  auto in = [&](const std::string& queue, const std::string& owner, const std::string& token,
                int world) {
    v1::JobSpec spec = Spec(world);
    spec.set_queue(queue);
    auto j = jobs_->Submit(spec, owner, token);
    EXPECT_TRUE(j.ok()) << j.status();
    return j.ok() ? j->id() : std::string();
  };
  const std::string running = RunningJob();  // queue "" ("default"), 2 ranks on a and b
  const std::string a1 = in("a", "alice", "t-alice", 4);
  const std::string a2 = in("a", "bob", "t-bob", 4);
  const std::string b1 = in("b", "alice", "t-alice", 4);
  const std::string ended = in("a", "alice", "t-alice", 4);
  ASSERT_TRUE(jobs_->Cancel(ended, "before").ok());

  using Filter = JobManager::CancelFilter;
  auto ids = jobs_->CancelMatching(Filter{"a", "", {}, ""}, "", /*dry_run=*/true);
  ASSERT_TRUE(ids.ok()) << ids.status();
  EXPECT_THAT(*ids, ::testing::UnorderedElementsAre(a1, a2));
  EXPECT_EQ(Get(a1).state(), v1::JOB_STATE_PENDING) << "a dry run cancels nothing";
  ids = jobs_->CancelMatching(Filter{"a", "alice", {}, ""}, "", true);
  ASSERT_TRUE(ids.ok());
  EXPECT_THAT(*ids, ::testing::ElementsAre(a1));
  ids = jobs_->CancelMatching(Filter{"", "", {}, "t-alice"}, "", true);
  ASSERT_TRUE(ids.ok());
  EXPECT_THAT(*ids, ::testing::UnorderedElementsAre(a1, b1)) << "a submitter's own jobs, by token";
  ids = jobs_->CancelMatching(
      Filter{"default", "", {v1::JOB_STATE_RUNNING, v1::JOB_STATE_SCHEDULED}, ""}, "", true);
  ASSERT_TRUE(ids.ok());
  EXPECT_THAT(*ids, ::testing::ElementsAre(running)) << "\"default\" matches a job naming no queue";

  EXPECT_EQ(jobs_->CancelMatching(Filter{"", "", {v1::JOB_STATE_SUCCEEDED}, ""}, "", true)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      jobs_->CancelMatching(Filter{"a", "", {}, ""}, std::string(1025, 'x'), false).status().code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Get(a1).state(), v1::JOB_STATE_PENDING);

  ids = jobs_->CancelMatching(Filter{"a", "", {}, ""}, "queue a is closing", false);
  ASSERT_TRUE(ids.ok()) << ids.status();
  EXPECT_THAT(*ids, ::testing::UnorderedElementsAre(a1, a2));
  for (const std::string& id : {a1, a2}) {
    v1::Job j = Get(id);
    EXPECT_EQ(j.state(), v1::JOB_STATE_CANCELLED);
    EXPECT_EQ(j.state_reason(), "cancelled: queue a is closing");
    auto events = store_->jobs().ListEvents(id, 0, 100);
    ASSERT_TRUE(events.ok());
    int cancelled = 0;
    for (const v1::Event& e : *events) cancelled += e.type() == "cancelled";
    EXPECT_EQ(cancelled, 1) << id;
  }
  EXPECT_EQ(Get(b1).state(), v1::JOB_STATE_PENDING);
  EXPECT_EQ(Get(ended).state_reason(), "cancelled: before") << "an ended job is left as it was";

  // A running job: its attempt ends CANCELLED and its ranks are told to stop.
  ids = jobs_->CancelMatching(Filter{"", "", {v1::JOB_STATE_RUNNING}, ""}, "", false);
  ASSERT_TRUE(ids.ok());
  EXPECT_THAT(*ids, ::testing::ElementsAre(running));
  EXPECT_EQ(Get(running).attempts(0).state(), v1::ATTEMPT_STATE_CANCELLED);
  EXPECT_EQ(a_->Stops().size(), 1u);
  EXPECT_EQ(b_->Stops().size(), 1u);
}

TEST_F(JobManagerTest, BadReportsAreRefusedWithReasons) {
  std::string id = RunningJob();
  EXPECT_EQ(Status("b", id, 1, 0, v1::RANK_STATE_RUNNING).code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(Status("a", id, 9, 0, v1::RANK_STATE_RUNNING).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Status("a", id, 1, 7, v1::RANK_STATE_RUNNING).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Status("a", "nope", 1, 0, v1::RANK_STATE_RUNNING).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(Status("a", id, 1, 0, v1::RANK_STATE_ASSIGNED).code(),
            absl::StatusCode::kInvalidArgument);
  v1::RendezvousReport r;
  r.set_job_id(id);
  r.set_attempt(1);
  r.mutable_info()->set_nccl_unique_id(std::string(127, 'x'));
  EXPECT_THAT(std::string(owners_->starter.OnRendezvous("a", r).message()),
              HasSubstr("must be 128 bytes, got 127"));
  v1::JobSpec bad = Spec(1);
  bad.mutable_training()->mutable_optimizer()->set_lr(-1);
  auto s = jobs_->Submit(bad);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.status().message()),
              HasSubstr("training.optimizer.lr: must be > 0, got -1"));
  EXPECT_EQ(Get(id).state(), v1::JOB_STATE_RUNNING) << "nothing changed";
}

TEST_F(JobManagerTest, ListNewestFirstWithPagesAndStates) {
  std::vector<std::string> ids;
  for (int i = 0; i < 5; ++i) ids.push_back(jobs_->Submit(Spec(1))->id());
  ASSERT_TRUE(jobs_->Cancel(ids[1], "").ok());
  v1::ListJobsRequest req;
  req.set_page_size(2);
  auto page1 = owners_->queries.List(req);
  ASSERT_TRUE(page1.ok());
  ASSERT_EQ(page1->jobs_size(), 2);
  EXPECT_EQ(page1->jobs(0).id(), ids[4]);
  req.set_page_token(page1->next_page_token());
  auto page2 = owners_->queries.List(req);
  EXPECT_EQ(page2->jobs(0).id(), ids[2]);
  v1::ListJobsRequest cancelled;
  cancelled.add_states(v1::JOB_STATE_CANCELLED);
  EXPECT_EQ(owners_->queries.List(cancelled)->jobs_size(), 1);
  req.set_page_token("garbage");
  EXPECT_EQ(owners_->queries.List(req).status().code(), absl::StatusCode::kInvalidArgument);
}

// Pages end by bytes as well as by count: no ListJobs response can exceed
// the message limit, and following the tokens returns every job once.
TEST_F(JobManagerTest, ListPagesByBytes) {
  v1::JobSpec big = Spec(1);
  big.mutable_checkpoint()->set_dir("/" + std::string(4000, 'd'));
  constexpr int kJobs = 600;  // ~4 KB each: more than one 2 MiB page
  for (int i = 0; i < kJobs; ++i) ASSERT_TRUE(jobs_->Submit(big).ok());
  v1::ListJobsRequest req;
  req.set_page_size(1000);
  std::set<std::string> seen;
  int pages = 0;
  while (true) {
    auto page = owners_->queries.List(req);
    ASSERT_TRUE(page.ok()) << page.status();
    ++pages;
    EXPECT_LE(page->ByteSizeLong(), size_t{2} << 20);
    for (const auto& j : page->jobs()) EXPECT_TRUE(seen.insert(j.id()).second) << j.id();
    if (page->next_page_token().empty()) break;
    req.set_page_token(page->next_page_token());
  }
  EXPECT_EQ(static_cast<int>(seen.size()), kJobs);
  EXPECT_GE(pages, 2);
}

// Registrations that never come back do not accumulate: a LOST or LEFT
// worker is forgotten after gone_ttl, unless a job still has ranks on it.
TEST_F(JobManagerTest, GoneWorkersAreForgottenAfterTheirTtl) {
  std::string id = RunningJob();
  AddWorker("c", 1);
  clock_.Advance(absl::Seconds(4));  // a, b and c all silent past the lease
  std::vector<std::string> lost = registry_->ExpireLeases();
  ASSERT_EQ(lost.size(), 3u);
  for (const auto& w : lost) owners_->health.OnWorkerLost(w);
  auto holds = [&](const std::string& w) { return !owners_->queries.BusySlots(w).empty(); };
  EXPECT_TRUE(registry_->ForgetGone(holds).empty()) << "not before the TTL";
  clock_.Advance(registry_->options().gone_ttl);
  // The lost workers' ranks ended (lost with them); none holds a slot.
  std::vector<std::string> forgotten = registry_->ForgetGone(holds);
  std::sort(forgotten.begin(), forgotten.end());
  EXPECT_EQ(forgotten, (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_TRUE(registry_->List(/*include_gone=*/true).empty());
  Open();  // and from the database
  EXPECT_TRUE(registry_->List(/*include_gone=*/true).empty());
  // One that returns registers again with its id.
  AddWorker("a", 1);
  EXPECT_EQ(registry_->Find("a")->state(), v1::WORKER_STATE_ALIVE);
  EXPECT_EQ(Get(id).state(), v1::JOB_STATE_RESTARTING);
}

TEST_F(JobManagerTest, RecoveryKeepsJobsAndReconcilesWorkers) {
  std::string id = RunningJob();
  auto pending = jobs_->Submit(Spec(8));
  ASSERT_TRUE(pending.ok());
  v1::Job before = Get(id);
  // "Restart" the coordinator on the same database.
  channels_.clear();
  Open();
  v1::Job after = Get(id);
  EXPECT_EQ(after.state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(after.attempts_size(), before.attempts_size());
  EXPECT_EQ(Get(pending->id()).state(), v1::JOB_STATE_PENDING);
  // a reconnects still running rank 0: kept. b reconnects without rank 1: it vanished.
  v1::RunningRank r0;
  r0.set_job_id(id);
  r0.set_attempt(1);
  r0.set_rank(0);
  FakeChannel* a = AddWorker("a", 1, {r0});
  EXPECT_TRUE(a->Stops().empty());
  EXPECT_EQ(a->Rendezvous(), 1) << "rendezvous data re-sent on reconnect";
  EXPECT_EQ(Get(id).state(), v1::JOB_STATE_RUNNING);
  // A rank the coordinator never placed there is stopped.
  v1::RunningRank stray;
  stray.set_job_id("old-job");
  stray.set_attempt(1);
  stray.set_rank(0);
  FakeChannel* b = AddWorker("b", 1, {stray});
  ASSERT_EQ(b->Stops().size(), 1u);
  EXPECT_EQ(b->Stops()[0].job_id(), "old-job");
  EXPECT_EQ(Get(id).state(), v1::JOB_STATE_RESTARTING);
  EXPECT_THAT(Get(id).attempts(0).reason(), HasSubstr("gone when its worker reconnected"));
}

// Records are the job's, per holder, pruned like the files (keep = 2); a
// restart resumes the newest record rank 0's host holds, and rank 0 moves to
// a host that holds the newest one.

// --- one write per transition, under store faults -------------------------

TEST_F(JobManagerTest, FailedCommitLeavesTheJobUnchangedAndIsRetriedByTick) {
  std::string id = RunningJob();
  const std::string before = Get(id).SerializeAsString();
  const std::vector<std::string> events_before = StoredEvents(id);
  store_->SetWriteFaultForTest([](int64_t, absl::string_view) { return true; });
  absl::Status s = jobs_->OnRankStatus("b", Failed(id, 1, 1, v1::FAILURE_KIND_EXIT, "boom"));
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("injected write fault"));
  EXPECT_EQ(Get(id).SerializeAsString(), before) << "memory is exactly as before the failed write";
  EXPECT_EQ(StoredEvents(id), events_before);
  EXPECT_TRUE(a_->Stops().empty()) << "nothing is acted on before it is stored";
  jobs_->Tick();  // The store still refuses: still nothing.
  EXPECT_EQ(Get(id).SerializeAsString(), before);
  // The store recovers: the next tick applies the rank's end and the
  // attempt's failure together.
  store_->SetWriteFaultForTest(nullptr);
  jobs_->Tick();
  v1::Job j = Get(id);
  EXPECT_EQ(j.state(), v1::JOB_STATE_RESTARTING);
  EXPECT_EQ(j.attempts(0).state(), v1::ATTEMPT_STATE_FAILED);
  EXPECT_EQ(j.attempts(0).failure_kind(), v1::FAILURE_KIND_EXIT);
  EXPECT_EQ(j.attempts(0).reason(), "rank 1 on host-b (worker b) exited with code 1: boom");
  EXPECT_EQ(j.attempts(0).ranks(1).state(), v1::RANK_STATE_FAILED);
  ASSERT_EQ(a_->Stops().size(), 1u);
  jobs_->Tick();
  EXPECT_EQ(StoredEvents(id).size(), events_before.size() + 2) << "applied once";
}

enum class FailurePath { kRankFailed, kWorkerLost, kHang };

// Each write from the failure on fails in turn (the N-th and the one after
// it, so a retry fails too); the job must still end its attempt exactly
// once and go on as if the store had never failed.
class FailurePathUnderFaultsTest
    : public JobManagerTest,
      public ::testing::WithParamInterface<std::tuple<FailurePath, int>> {};

TEST_P(FailurePathUnderFaultsTest, AttemptFailsOnceAndTheJobGoesOn) {
  const auto [path, first_failing] = GetParam();
  std::string id = RunningJob();
  int fired = 0;
  store_->SetWriteFaultForTest([&, n = first_failing](int64_t write_no, absl::string_view) {
    bool fail = write_no == n || write_no == n + 1;
    fired += fail;
    return fail;
  });
  switch (path) {
    case FailurePath::kRankFailed:
      // Refused while the fault lasts, then replayed by Tick.
      jobs_->OnRankStatus("b", Failed(id, 1, 1, v1::FAILURE_KIND_EXIT, "boom")).IgnoreError();
      break;
    case FailurePath::kWorkerLost:
      clock_.Advance(absl::Seconds(2));
      ASSERT_TRUE(registry_->Heartbeat("a", a_).ok());
      clock_.Advance(absl::Seconds(2));
      for (const std::string& w : registry_->ExpireLeases()) owners_->health.OnWorkerLost(w);
      break;
    case FailurePath::kHang:
      clock_.Advance(absl::Seconds(61));
      jobs_->Tick();
      break;
  }
  // Drive it as the coordinator would: ticks, and workers answering stops.
  std::set<std::pair<FakeChannel*, int>> answered;
  for (int i = 0; i < 20; ++i) {
    jobs_->Tick();
    for (auto [ch, worker] : {std::pair{a_, "a"}, std::pair{b_, "b"}}) {
      for (const v1::StopRanks& stop : ch->Stops()) {
        for (int rank : stop.ranks()) {
          if (stop.attempt() != 1 || !answered.insert({ch, rank}).second) continue;
          v1::RankStatus st;
          st.set_job_id(id);
          st.set_attempt(1);
          st.set_rank(rank);
          st.set_state(v1::RANK_STATE_STOPPED);
          jobs_->OnRankStatus(worker, st).IgnoreError();  // Refused ones are replayed by Tick.
        }
      }
    }
  }
  EXPECT_GE(fired, 1) << "the fault hit this path";
  v1::Job j = Get(id);
  const v1::Attempt& a = j.attempts(0);
  EXPECT_EQ(a.state(), v1::ATTEMPT_STATE_FAILED);
  EXPECT_EQ(j.restarts(), 1);
  for (const v1::RankAssignment& r : a.ranks()) EXPECT_TRUE(IsTerminal(r.state())) << r.rank();
  std::string reason;
  switch (path) {
    case FailurePath::kRankFailed:
      reason = "rank 1 on host-b (worker b) exited with code 1: boom";
      EXPECT_EQ(a.failure_kind(), v1::FAILURE_KIND_EXIT);
      break;
    case FailurePath::kWorkerLost:
      reason =
          "rank 1 on host-b (worker b) was lost with its worker: its worker stopped "
          "heartbeating (lease expired)";
      EXPECT_EQ(a.failure_kind(), v1::FAILURE_KIND_WORKER_LOST);
      break;
    case FailurePath::kHang:
      reason =
          "hung: no progress for 1m from rank(s) 0 (host-a, last step 0), 1 (host-b, last step 0)";
      EXPECT_EQ(a.failure_kind(), v1::FAILURE_KIND_HANG);
      break;
  }
  EXPECT_EQ(a.reason(), reason);
  if (path == FailurePath::kWorkerLost) {
    // b is gone: the restart waits for slots.
    EXPECT_EQ(j.state(), v1::JOB_STATE_RESTARTING);
    EXPECT_EQ(j.attempts_size(), 1);
  } else {
    // Every rank stopped, so the restart was placed again.
    EXPECT_EQ(j.state(), v1::JOB_STATE_SCHEDULED);
    ASSERT_EQ(j.attempts_size(), 2);
    EXPECT_EQ(j.attempts(1).state(), v1::ATTEMPT_STATE_STARTING);
  }
  EXPECT_TRUE(owners_->queries.BusySlots("a").empty() || j.attempts_size() == 2);
  int failed_events = 0, restarting_events = 0;
  for (const std::string& e : StoredEvents(id)) {
    failed_events += absl::StartsWith(e, "attempt_failed@1: ");
    restarting_events += absl::StartsWith(e, "restarting@1: ");
  }
  EXPECT_EQ(failed_events, 1);
  EXPECT_EQ(restarting_events, 1);
  // What is stored is what memory says.
  store_->SetWriteFaultForTest(nullptr);
  std::string in_memory = Get(id).SerializeAsString();
  channels_.clear();
  Open();
  v1::Job stored = Get(id);
  EXPECT_EQ(stored.state(), j.state());
  EXPECT_EQ(stored.attempts_size(), j.attempts_size());
  EXPECT_EQ(stored.attempts(0).reason(), reason);
}

std::string FailurePathName(const ::testing::TestParamInfo<std::tuple<FailurePath, int>>& info) {
  static const char* const kNames[] = {"RankFailed", "WorkerLost", "Hang"};
  return absl::StrCat(kNames[static_cast<int>(std::get<0>(info.param))], "_FailWrite",
                      std::get<1>(info.param));
}

INSTANTIATE_TEST_SUITE_P(EveryWrite, FailurePathUnderFaultsTest,
                         ::testing::Combine(::testing::Values(FailurePath::kRankFailed,
                                                              FailurePath::kWorkerLost,
                                                              FailurePath::kHang),
                                            ::testing::Range(1, 4)),
                         FailurePathName);

TEST_F(JobManagerTest, AttemptWithEveryRankEndedIsSettledAfterRecovery) {
  // A store written when a rank's end and the attempt's failure were two
  // writes, and the coordinator died between them.
  std::string id = RunningJob();
  v1::Job j = Get(id);
  v1::Attempt* a = j.mutable_attempts(0);
  a->mutable_ranks(0)->set_state(v1::RANK_STATE_STOPPED);
  a->mutable_ranks(1)->set_state(v1::RANK_STATE_FAILED);
  a->mutable_ranks(1)->mutable_exit()->set_kind(v1::FAILURE_KIND_SIGNAL);
  a->mutable_ranks(1)->mutable_exit()->set_signal(9);
  ASSERT_TRUE(store_->jobs().PutJob(j, 1).ok());
  channels_.clear();
  Open();
  EXPECT_EQ(Get(id).state(), v1::JOB_STATE_RUNNING);
  jobs_->Tick();
  v1::Job after = Get(id);
  EXPECT_EQ(after.restarts(), 1);
  EXPECT_EQ(after.state(), v1::JOB_STATE_SCHEDULED) << "restarted on the recovered workers";
  EXPECT_EQ(after.attempts_size(), 2);
  EXPECT_EQ(after.attempts(0).state(), v1::ATTEMPT_STATE_FAILED);
  EXPECT_EQ(after.attempts(0).reason(), "rank 1 on host-b (worker b) was killed by signal 9");
  EXPECT_EQ(after.attempts(0).failure_kind(), v1::FAILURE_KIND_SIGNAL);
}

TEST_F(JobManagerTest, VanishedRankWhoseWriteFailedIsFailedByTheNextTick) {
  std::string id = RunningJob();
  channels_.clear();
  Open();
  v1::RunningRank r0;
  r0.set_job_id(id);
  r0.set_attempt(1);
  r0.set_rank(0);
  AddWorker("a", 1, {r0});
  // b reconnects without rank 1, and the job's write fails once.
  bool failed_once = false;
  store_->SetWriteFaultForTest([&](int64_t, absl::string_view op) {
    if (failed_once || !absl::StartsWith(op, "PutJob")) return false;
    return failed_once = true;
  });
  AddWorker("b", 1);
  ASSERT_TRUE(failed_once);
  EXPECT_EQ(Get(id).state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(Get(id).attempts(0).ranks(1).state(), v1::RANK_STATE_RUNNING) << "memory untouched";
  jobs_->Tick();
  v1::Job j = Get(id);
  EXPECT_EQ(j.restarts(), 1);
  EXPECT_EQ(j.attempts(0).state(), v1::ATTEMPT_STATE_FAILED);
  EXPECT_EQ(j.attempts(0).failure_kind(), v1::FAILURE_KIND_WORKER_LOST);
  EXPECT_EQ(j.attempts(0).reason(),
            "rank 1 on host-b (worker b) was lost with its worker: the rank process was gone when "
            "its worker reconnected");
}

TEST_F(JobManagerTest, ACheckpointDirBelongsToTheOwnerOfItsFirstJob) {
  Open();
  v1::JobSpec spec = Spec(1);
  spec.mutable_checkpoint()->set_dir("/mnt/ck/team");
  auto alice = jobs_->Submit(spec, "alice", "t-alice");
  ASSERT_TRUE(alice.ok()) << alice.status();
  auto alice2 = jobs_->Submit(spec, "alice", "t-alice");
  ASSERT_TRUE(alice2.ok()) << "one owner's jobs share a directory: " << alice2.status();
  spec.mutable_checkpoint()->set_dir("/mnt/ck/./team/");
  auto bob = jobs_->Submit(spec, "bob", "t-bob");
  EXPECT_EQ(bob.status().code(), absl::StatusCode::kPermissionDenied);
  // The fake clock gives both of alice's jobs one submit time: either may
  // be named as the first.
  const std::string msg(bob.status().message());
  EXPECT_THAT(
      msg, ::testing::AnyOf(HasSubstr("checkpoint.dir: /mnt/ck/./team/ belongs to 'alice' (job " +
                                      alice->id() + "); a job of 'bob' may not write there"),
                            HasSubstr("checkpoint.dir: /mnt/ck/./team/ belongs to 'alice' (job " +
                                      alice2->id() + "); a job of 'bob' may not write there")));
  spec.mutable_checkpoint()->set_dir("/mnt/ck/{job_id}");
  EXPECT_TRUE(jobs_->Submit(spec, "bob", "t-bob").ok()) << "a directory of its own";
}

// A shared directory's record dropped while the worker that reported it is
// away: its DropCheckpoints goes out when that worker registers again.
TEST_F(JobManagerTest, ADropForAnAbsentWorkerIsSentWhenItReturns) {
  Open();
  a_ = AddWorker("a", 1);
  b_ = AddWorker("b", 1);
  std::string id = RunSharedTwoRanks(/*keep=*/1);
  ASSERT_FALSE(id.empty());
  auto path = [&](int64_t epochs) {
    return absl::StrFormat("/mnt/shared/%s/%s.ckpt-epoch-%06d.pt", id, id, epochs);
  };
  ASSERT_TRUE(Checkpoint(*jobs_, "a", id, 1, 0, 1, 10, path(1)).ok());
  registry_->SessionEnded("a", a_, /*left=*/false);
  ASSERT_TRUE(Checkpoint(*jobs_, "b", id, 1, 1, 2, 20, path(2))
                  .ok());  // keep 1: epoch 1's file goes, a is away
  FakeChannel* back = AddWorker("a", 1);
  std::vector<std::string> drops;
  for (const auto& m : back->sent) {
    if (m.has_drop_checkpoints())
      drops.insert(drops.end(), m.drop_checkpoints().paths().begin(),
                   m.drop_checkpoints().paths().end());
  }
  EXPECT_EQ(drops, std::vector<std::string>{path(1)});
}

TEST_F(JobManagerTest, ASharedCheckpointRecordNamesTheWorkerThatReportedIt) {
  Open();
  a_ = AddWorker("a", 1);
  b_ = AddWorker("b", 1);
  std::string id = RunSharedTwoRanks();
  ASSERT_FALSE(id.empty());
  v1::CheckpointReport rep;
  rep.set_job_id(id);
  rep.set_attempt(1);
  rep.set_rank(1);
  rep.mutable_record()->set_epochs_done(1);
  rep.mutable_record()->set_global_step(10);
  rep.mutable_record()->set_path(
      absl::StrCat("/mnt/shared/", id, "/", id, ".ckpt-epoch-000001.pt"));
  ASSERT_TRUE(jobs_->OnCheckpoint("b", rep).ok());
  rep.mutable_record()->set_path("/var/lib/trainctl-worker/worker.key");
  EXPECT_EQ(jobs_->OnCheckpoint("b", rep).code(), absl::StatusCode::kInvalidArgument);
  v1::Job j = Get(id);
  ASSERT_EQ(j.checkpoints_size(), 1);
  EXPECT_TRUE(j.checkpoints(0).shared());
  EXPECT_EQ(j.checkpoints(0).worker_id(), "");
  EXPECT_EQ(j.checkpoints(0).reported_by(), "b")
      << "a fetch asks b, never the first connected worker";
}

}  // namespace
}  // namespace trainctl::coordinator
