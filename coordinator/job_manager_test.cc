// JobManager with a fake clock, an in-memory SQLite store and fake worker
// channels: every transition, leases, restart budget, stale attempts,
// cancel from each state, hang and rendezvous timeouts, recovery.
#include "coordinator/job_manager.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <set>
#include <tuple>
#include <unistd.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/clock.h"
#include "common/jobspec/job_spec.h"

namespace trainctl::coordinator {
namespace {

using ::testing::Contains;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

class FakeChannel : public WorkerChannel {
 public:
  bool Send(const v1::CoordinatorMessage& msg) override {
    if (closed) return false;
    sent.push_back(msg);
    return true;
  }
  void Close(const absl::Status& status) override {
    closed = true;
    close_status = status;
  }
  std::vector<v1::StartRanks> Starts() const {
    std::vector<v1::StartRanks> out;
    for (const auto& m : sent) if (m.has_start_ranks()) out.push_back(m.start_ranks());
    return out;
  }
  std::vector<v1::StopRanks> Stops() const {
    std::vector<v1::StopRanks> out;
    for (const auto& m : sent) if (m.has_stop_ranks()) out.push_back(m.stop_ranks());
    return out;
  }
  int Preflights() const {
    int n = 0;
    for (const auto& m : sent) n += m.has_preflight();
    return n;
  }
  int Rendezvous() const {
    int n = 0;
    for (const auto& m : sent) n += m.has_rendezvous();
    return n;
  }
  std::vector<v1::CoordinatorMessage> sent;
  bool closed = false;
  absl::Status close_status;
};

class RecordingSubscriber : public JobSubscriber {
 public:
  void Offer(const v1::JobUpdate& u) override { updates.push_back(u); }
  void JobEnded() override { ended = true; }
  std::vector<std::string> EventTypes() const {
    std::vector<std::string> out;
    for (const auto& u : updates) if (u.has_event()) out.push_back(u.event().type());
    return out;
  }
  std::vector<v1::JobUpdate> updates;
  bool ended = false;
};

v1::JobSpec Spec(int world_size, int max_restarts = 3) {
  ParsedJobSpec p = ParseJobSpecYaml(
      "name: t\nmodel: {name: mlp, input_dim: 5, classes: 2}\n"
      "data: {train: {format: synthetic, length: 100, size: 5, classes: 2}}\n",
      "t.yaml", {absl::StrCat("world_size=", world_size), absl::StrCat("restart.max_restarts=", max_restarts)});
  EXPECT_TRUE(p.ok());
  return p.spec;
}

class JobManagerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/jm_test_XXXXXX";
    dir_ = mkdtemp(tmpl);
    Open();
  }
  void TearDown() override {
    jobs_.reset();
    registry_.reset();
    store_.reset();
    std::string cmd = "rm -rf " + dir_;
    (void)std::system(cmd.c_str());
  }
  void Open() {
    jobs_.reset();
    registry_.reset();
    store_.reset();
    auto s = StateStore::Open(dir_ + "/state.db");
    ASSERT_TRUE(s.ok()) << s.status();
    store_ = std::move(*s);
    RegistryOptions ro;
    ro.lease_timeout = absl::Seconds(3);
    registry_ = std::make_unique<WorkerRegistry>(store_.get(), &clock_, ro);
    JobManagerOptions jo;
    jo.progress_timeout = absl::Seconds(60);
    jo.rendezvous_timeout = absl::Seconds(30);
    jo.lost_worker_wait = lost_worker_wait_;
    jo.preflight = preflight_;
    jobs_ = std::make_unique<JobManager>(store_.get(), registry_.get(), &hub_, &clock_, jo);
    auto snap = store_->LoadAll();
    ASSERT_TRUE(snap.ok()) << snap.status();
    registry_->Recover(snap->workers);
    ASSERT_TRUE(jobs_->Recover(*snap).ok());
  }

  // Registers worker `id` with `slots` CPU slots on a fresh channel.
  FakeChannel* AddWorker(const std::string& id, int slots,
                         std::vector<v1::RunningRank> running = {}, bool allow_commands = false) {
    auto ch = std::make_unique<FakeChannel>();
    v1::Register reg;
    reg.set_worker_id(id);
    reg.set_hostname("host-" + id);
    for (int i = 0; i < slots; ++i) {
      v1::Slot* s = reg.add_slots();
      s->set_kind(v1::Slot::KIND_CPU);
      s->set_index(i);
    }
    for (auto& r : running) *reg.add_running() = r;
    reg.set_allow_commands(allow_commands);
    auto id_or = registry_->Register(reg, ch.get());
    EXPECT_TRUE(id_or.ok()) << id_or.status();
    jobs_->OnWorkerRegistered(id, reg);
    channels_.push_back(std::move(ch));
    return channels_.back().get();
  }

  absl::Status Status(const std::string& worker, const std::string& job, int attempt, int rank,
                      v1::RankState state, v1::FailureKind kind = v1::FAILURE_KIND_UNSPECIFIED,
                      int exit_code = 0) {
    v1::RankStatus st;
    st.set_job_id(job);
    st.set_attempt(attempt);
    st.set_rank(rank);
    st.set_state(state);
    if (kind != v1::FAILURE_KIND_UNSPECIFIED) {
      st.mutable_exit()->set_kind(kind);
      st.mutable_exit()->set_exit_code(exit_code);
      st.mutable_exit()->set_message("boom");
      st.mutable_exit()->add_last_log_lines("Traceback: boom");
    }
    return jobs_->OnRankStatus(worker, st);
  }

  absl::Status Rendezvous(const std::string& worker, const std::string& job, int attempt) {
    v1::RendezvousReport r;
    r.set_job_id(job);
    r.set_attempt(attempt);
    r.mutable_info()->set_gloo_store_address("127.0.0.1:29500");
    return jobs_->OnRendezvous(worker, r);
  }

  v1::Job Get(const std::string& id) {
    auto j = jobs_->Get(id);
    EXPECT_TRUE(j.ok()) << j.status();
    return *j;
  }

  // Submit a 2-rank job on workers a and b (1 slot each) and bring it to RUNNING.
  std::string RunningJob(int max_restarts = 3) {
    a_ = AddWorker("a", 1);
    b_ = AddWorker("b", 1);
    auto job = jobs_->Submit(Spec(2, max_restarts));
    EXPECT_TRUE(job.ok()) << job.status();
    std::string id = job->id();
    EXPECT_TRUE(Rendezvous("a", id, 1).ok());
    EXPECT_TRUE(Status("a", id, 1, 0, v1::RANK_STATE_RUNNING).ok());
    EXPECT_TRUE(Status("b", id, 1, 1, v1::RANK_STATE_RUNNING).ok());
    EXPECT_EQ(Get(id).state(), v1::JOB_STATE_RUNNING);
    return id;
  }

  // Events of a job as stored, as "type@attempt: message".
  std::vector<std::string> StoredEvents(const std::string& id) {
    auto events = store_->ListEvents(id, 0, 0);
    EXPECT_TRUE(events.ok()) << events.status();
    std::vector<std::string> out;
    for (const auto& e : *events) out.push_back(absl::StrCat(e.type(), "@", e.attempt(), ": ", e.message()));
    return out;
  }

  absl::Duration lost_worker_wait_ = absl::ZeroDuration();
  bool preflight_ = false;
  std::string dir_;
  FakeClock clock_;
  MetricsHub hub_;
  std::unique_ptr<StateStore> store_;
  std::unique_ptr<WorkerRegistry> registry_;
  std::unique_ptr<JobManager> jobs_;
  std::vector<std::unique_ptr<FakeChannel>> channels_;
  FakeChannel* a_ = nullptr;
  FakeChannel* b_ = nullptr;
};

TEST(JobTransitionsTest, OnlyTheLifecycleEdges) {
  using S = v1::JobState;
  EXPECT_TRUE(JobTransitionAllowed(S::JOB_STATE_PENDING, S::JOB_STATE_SCHEDULED));
  EXPECT_TRUE(JobTransitionAllowed(S::JOB_STATE_SCHEDULED, S::JOB_STATE_RUNNING));
  EXPECT_TRUE(JobTransitionAllowed(S::JOB_STATE_RUNNING, S::JOB_STATE_RESTARTING));
  EXPECT_TRUE(JobTransitionAllowed(S::JOB_STATE_RESTARTING, S::JOB_STATE_SCHEDULED));
  EXPECT_FALSE(JobTransitionAllowed(S::JOB_STATE_PENDING, S::JOB_STATE_RUNNING));
  EXPECT_FALSE(JobTransitionAllowed(S::JOB_STATE_SUCCEEDED, S::JOB_STATE_RUNNING));
  EXPECT_FALSE(JobTransitionAllowed(S::JOB_STATE_CANCELLED, S::JOB_STATE_PENDING));
  EXPECT_FALSE(JobTransitionAllowed(S::JOB_STATE_FAILED, S::JOB_STATE_RESTARTING));
  EXPECT_FALSE(JobTransitionAllowed(S::JOB_STATE_RESTARTING, S::JOB_STATE_RUNNING));
}

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
  ASSERT_TRUE(jobs_->OnMetrics("a", batch).ok());
  v1::Job j = Get(id);
  EXPECT_EQ(j.progress().step(), 2) << "the slowest rank";
  EXPECT_EQ(j.progress().samples_seen(), 128);
  EXPECT_DOUBLE_EQ(j.progress().samples_per_sec(), 128);
  EXPECT_GT(j.progress().eta_seconds(), 0);
  EXPECT_DOUBLE_EQ(j.progress().last_eval().accuracy(), 0.75);
  auto stored = store_->ListMetrics(id, 100);
  ASSERT_TRUE(stored.ok());
  EXPECT_EQ(stored->size(), 3u);
  EXPECT_EQ(j.metric_summary().train_points(), 2);
  EXPECT_DOUBLE_EQ(j.metric_summary().mean_samples_per_sec(), 128) << "both ranks together";
  EXPECT_DOUBLE_EQ(j.metric_summary().last_loss(), 0.5);
  EXPECT_DOUBLE_EQ(j.metric_summary().best_eval().accuracy(), 0.75);

  // Rank 0's final model: only rank 0, only an absolute path; shown once
  // the job SUCCEEDED.
  v1::FinalModelReport model;
  model.set_job_id(id);
  model.set_attempt(1);
  model.set_rank(1);
  model.set_path("/ckpt/model.pt");
  EXPECT_EQ(jobs_->OnFinalModel("a", model).code(), absl::StatusCode::kInvalidArgument);
  model.set_rank(0);
  model.set_path("relative/model.pt");
  EXPECT_EQ(jobs_->OnFinalModel("a", model).code(), absl::StatusCode::kInvalidArgument);
  model.set_path("/ckpt/model.pt");
  ASSERT_TRUE(jobs_->OnFinalModel("a", model).ok());
  EXPECT_EQ(Get(id).final_model(), "");

  ASSERT_TRUE(Status("a", id, 1, 0, v1::RANK_STATE_SUCCEEDED).ok());
  EXPECT_EQ(Get(id).state(), v1::JOB_STATE_RUNNING);
  ASSERT_TRUE(Status("a", id, 1, 1, v1::RANK_STATE_SUCCEEDED).ok());
  EXPECT_EQ(Get(id).state(), v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(Get(id).final_model(), "/ckpt/model.pt");
  EXPECT_EQ(Get(id).final_model_worker(), "a");
  // Stored with the job: a restarted coordinator still knows it.
  auto snapshot = store_->LoadAll();
  ASSERT_TRUE(snapshot.ok());
  EXPECT_EQ(snapshot->jobs.back().final_model(), "/ckpt/model.pt");
  EXPECT_EQ(snapshot->jobs.back().metric_summary().train_points(), 2);
  EXPECT_TRUE(Get(id).has_end_time());
  EXPECT_TRUE(sub.ended);
  EXPECT_THAT(sub.EventTypes(), ::testing::ElementsAre("running", "epoch_end", "succeeded"));
  auto events = store_->ListEvents(id, 0, 100);
  ASSERT_TRUE(events.ok());
  std::vector<std::string> types;
  for (const auto& e : *events) types.push_back(e.type());
  EXPECT_THAT(types, ::testing::ElementsAre("submitted", "scheduled", "running", "epoch_end", "succeeded"));
  EXPECT_TRUE(jobs_->BusySlots("a").empty());
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
  for (const auto& w : lost) jobs_->OnWorkerLost(w);
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
  jobs_->OnWorkerLost("b");
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
  EXPECT_EQ(jobs_->BusySlots("a").size(), 1u);
  ASSERT_TRUE(Status("a", id, 1, 0, v1::RANK_STATE_STOPPED).ok());
  EXPECT_TRUE(jobs_->BusySlots("a").empty());
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

TEST_F(JobManagerTest, HangIsDetectedAndRestarted) {
  std::string id = RunningJob();
  v1::RankProgress p;
  p.set_job_id(id);
  p.set_attempt(1);
  for (int i = 1; i <= 3; ++i) {
    clock_.Advance(absl::Seconds(40));
    p.set_rank(0);
    p.set_step(i);
    ASSERT_TRUE(jobs_->OnProgress("a", p).ok());
    p.set_rank(1);
    ASSERT_TRUE(jobs_->OnProgress("b", p).ok());
    jobs_->Tick();
    ASSERT_EQ(Get(id).state(), v1::JOB_STATE_RUNNING) << "progressing is not hung";
  }
  clock_.Advance(absl::Seconds(40));
  p.set_rank(0);
  p.set_step(4);
  ASSERT_TRUE(jobs_->OnProgress("a", p).ok());
  clock_.Advance(absl::Seconds(30));  // rank 1 silent 70 s > 60 s.
  jobs_->Tick();
  v1::Job j = Get(id);
  EXPECT_EQ(j.state(), v1::JOB_STATE_RESTARTING);
  EXPECT_THAT(j.attempts(0).reason(), HasSubstr("hung: no progress for 1m from rank(s) 1 (host-b, last step 3)"));
}

// A heartbeat of an engine rank in its training steps.
v1::RankProgress Heartbeat(const std::string& id, int rank, int64_t step, int64_t seq, int64_t waiting_seq,
                           double compute_ms = 10) {
  v1::RankProgress p;
  p.set_job_id(id);
  p.set_attempt(1);
  p.set_rank(rank);
  p.set_step(step);
  p.set_has_heartbeat(true);
  p.set_phase(v1::RANK_PHASE_TRAIN);
  p.set_collective_seq(seq);
  p.set_waiting_seq(waiting_seq);
  p.set_op(v1::COLLECTIVE_OP_ALL_REDUCE);
  p.set_op_step(step + 1);
  p.set_op_bucket(0);
  p.set_p99_step_ms(100);
  p.set_compute_ms(compute_ms);
  p.set_pid(500 + rank);
  return p;
}

TEST_F(JobManagerTest, HeartbeatsBlameTheStoppedRankAndOnHangFailEndsTheJob) {
  a_ = AddWorker("a", 1);
  b_ = AddWorker("b", 1);
  v1::JobSpec spec = Spec(2);
  spec.mutable_restart()->set_on_hang(v1::HANG_POLICY_FAIL);
  auto job = jobs_->Submit(spec);
  ASSERT_TRUE(job.ok()) << job.status();
  const std::string id = job->id();
  ASSERT_TRUE(Rendezvous("a", id, 1).ok());
  ASSERT_TRUE(Status("a", id, 1, 0, v1::RANK_STATE_RUNNING).ok());
  ASSERT_TRUE(Status("b", id, 1, 1, v1::RANK_STATE_RUNNING).ok());
  for (int s = 1; s <= 3; ++s) {
    ASSERT_TRUE(jobs_->OnProgress("a", Heartbeat(id, 0, s, 2 * s, 0)).ok());
    ASSERT_TRUE(jobs_->OnProgress("b", Heartbeat(id, 1, s, 2 * s, 0)).ok());
    clock_.Advance(absl::Seconds(1));
    jobs_->Tick();
  }
  // Rank 1 goes silent; rank 0 waits in all-reduce #8 and says so each second.
  for (int s = 1; s <= 5; ++s) {
    ASSERT_TRUE(jobs_->OnProgress("a", Heartbeat(id, 0, 3, 8, 8)).ok());
    clock_.Advance(absl::Seconds(1));
    jobs_->Tick();
    ASSERT_EQ(Get(id).state(), v1::JOB_STATE_RUNNING) << s << " s: within the 5 s bound";
  }
  ASSERT_TRUE(jobs_->OnProgress("a", Heartbeat(id, 0, 3, 8, 8)).ok());
  clock_.Advance(absl::Milliseconds(500));
  jobs_->Tick();
  v1::Job j = Get(id);
  EXPECT_EQ(j.state(), v1::JOB_STATE_FAILED);
  EXPECT_EQ(j.attempts(0).failure_kind(), v1::FAILURE_KIND_HANG);
  EXPECT_THAT(j.attempts(0).reason(),
              HasSubstr("hung: rank 1 (worker b, pid 501) stopped before all-reduce #8 (step 4, bucket 0); "
                        "rank 0 waiting in it for"));
  EXPECT_THAT(j.state_reason(), HasSubstr("(restart.on_hang: fail)"));
  EXPECT_THAT(StoredEvents(id), ::testing::Contains(HasSubstr("hang@1: rank 1 (worker b, pid 501) stopped before")));
}

TEST_F(JobManagerTest, ConsistentlySlowRankRaisesOneStragglerEvent) {
  std::string id = RunningJob();
  for (int s = 1; s <= 8; ++s) {
    ASSERT_TRUE(jobs_->OnProgress("a", Heartbeat(id, 0, s, s, 0, 10)).ok());
    ASSERT_TRUE(jobs_->OnProgress("b", Heartbeat(id, 1, s, s, 0, 25)).ok());
    clock_.Advance(absl::Seconds(1));
    jobs_->Tick();
  }
  std::vector<std::string> stragglers;
  for (const std::string& e : StoredEvents(id)) {
    if (absl::StartsWith(e, "straggler@")) stragglers.push_back(e);
  }
  ASSERT_EQ(stragglers.size(), 1u);
  EXPECT_THAT(stragglers[0], HasSubstr("straggler@1: rank 1 (worker b, host host-b) is a straggler: 25.0 ms of "
                                       "compute per step, 150% slower than the median of the other ranks (10.0 ms)"));
  EXPECT_EQ(Get(id).state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(jobs_->Gauges().straggler_events, 1);
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
    ASSERT_TRUE(jobs_->OnProgress("a", Heartbeat(id, 0, s, s, 0, 10)).ok());
    ASSERT_TRUE(jobs_->OnProgress("b", Heartbeat(id, 1, s, s, 0, 30)).ok());
    clock_.Advance(absl::Seconds(1));
    jobs_->Tick();
  }
  EXPECT_THAT(StoredEvents(id), ::testing::Contains(HasSubstr("the next attempt avoids worker b if it can")));
  // Rank 1 crashes: b's slot is free again, and b would be the first choice.
  ASSERT_TRUE(Status("b", id, 1, 1, v1::RANK_STATE_FAILED, v1::FAILURE_KIND_EXIT, 1).ok());
  j = Get(id);
  ASSERT_EQ(j.attempts_size(), 2) << v1::JobState_Name(j.state()) << " " << j.state_reason();
  EXPECT_EQ(j.attempts(1).ranks(0).worker_id(), "c");
  EXPECT_EQ(j.attempts(1).ranks(1).worker_id(), "d");
}

v1::JobSpec CommandSpec(int world_size, const std::string& extra = "") {
  ParsedJobSpec p = ParseJobSpecYaml(absl::StrCat("name: c\ncommand: {argv: [python3, train.py]}\n", extra), "c.yaml",
                                     {absl::StrCat("world_size=", world_size)});
  EXPECT_TRUE(p.ok()) << p.errors[0].ToString();
  return p.spec;
}

TEST_F(JobManagerTest, CommandJobsRunOnlyOnWorkersThatAllowThem) {
  FakeChannel* plain = AddWorker("a", 2);
  auto cmd = jobs_->Submit(CommandSpec(1));
  ASSERT_TRUE(cmd.ok()) << cmd.status();
  EXPECT_EQ(Get(cmd->id()).state(), v1::JOB_STATE_PENDING);
  EXPECT_EQ(Get(cmd->id()).state_reason(), "no worker allows commands (start trainctl-worker with --allow-commands)");
  EXPECT_TRUE(plain->Starts().empty());

  // An engine job takes the allowing worker's only slot in the same pass:
  // the command job waits for a slot there, not on the plain worker.
  auto engine = jobs_->Submit(Spec(3));
  ASSERT_TRUE(engine.ok());
  FakeChannel* allowing = AddWorker("c", 1, {}, /*allow_commands=*/true);
  EXPECT_EQ(Get(engine->id()).state(), v1::JOB_STATE_SCHEDULED);
  EXPECT_EQ(Get(cmd->id()).state(), v1::JOB_STATE_PENDING);
  EXPECT_THAT(Get(cmd->id()).state_reason(), ::testing::StartsWith("on workers that allow commands: needs 1 cpu slots"));

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
  auto dry = jobs_->DryRun(CommandSpec(2));
  ASSERT_TRUE(dry.ok());
  EXPECT_TRUE(dry->planned().empty());
  EXPECT_THAT(dry->pending_reason(), ::testing::StartsWith("on workers that allow commands: "));
}

TEST_F(JobManagerTest, CommandJobIsCheckedForHangsOnlyWhenItSetsATimeout) {
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
  EXPECT_EQ(Get(quiet->id()).state(), v1::JOB_STATE_RUNNING) << "a script that never reports is not hung";
  v1::Job j = Get(watched->id());
  EXPECT_EQ(j.state(), v1::JOB_STATE_RESTARTING);
  EXPECT_THAT(j.attempts(0).reason(), HasSubstr("hung: no progress for 2m"));
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

TEST_F(JobManagerTest, BadReportsAreRefusedWithReasons) {
  std::string id = RunningJob();
  EXPECT_EQ(Status("b", id, 1, 0, v1::RANK_STATE_RUNNING).code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(Status("a", id, 9, 0, v1::RANK_STATE_RUNNING).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Status("a", id, 1, 7, v1::RANK_STATE_RUNNING).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Status("a", "nope", 1, 0, v1::RANK_STATE_RUNNING).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(Status("a", id, 1, 0, v1::RANK_STATE_ASSIGNED).code(), absl::StatusCode::kInvalidArgument);
  v1::RendezvousReport r;
  r.set_job_id(id);
  r.set_attempt(1);
  r.mutable_info()->set_nccl_unique_id(std::string(127, 'x'));
  EXPECT_THAT(std::string(jobs_->OnRendezvous("a", r).message()), HasSubstr("must be 128 bytes, got 127"));
  v1::JobSpec bad = Spec(1);
  bad.mutable_training()->mutable_optimizer()->set_lr(-1);
  auto s = jobs_->Submit(bad);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.status().message()), HasSubstr("training.optimizer.lr: must be > 0, got -1"));
  EXPECT_EQ(Get(id).state(), v1::JOB_STATE_RUNNING) << "nothing changed";
}

TEST_F(JobManagerTest, ListNewestFirstWithPagesAndStates) {
  std::vector<std::string> ids;
  for (int i = 0; i < 5; ++i) ids.push_back(jobs_->Submit(Spec(1))->id());
  ASSERT_TRUE(jobs_->Cancel(ids[1], "").ok());
  v1::ListJobsRequest req;
  req.set_page_size(2);
  auto page1 = jobs_->List(req);
  ASSERT_TRUE(page1.ok());
  ASSERT_EQ(page1->jobs_size(), 2);
  EXPECT_EQ(page1->jobs(0).id(), ids[4]);
  req.set_page_token(page1->next_page_token());
  auto page2 = jobs_->List(req);
  EXPECT_EQ(page2->jobs(0).id(), ids[2]);
  v1::ListJobsRequest cancelled;
  cancelled.add_states(v1::JOB_STATE_CANCELLED);
  EXPECT_EQ(jobs_->List(cancelled)->jobs_size(), 1);
  req.set_page_token("garbage");
  EXPECT_EQ(jobs_->List(req).status().code(), absl::StatusCode::kInvalidArgument);
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
    auto page = jobs_->List(req);
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
  for (const auto& w : lost) jobs_->OnWorkerLost(w);
  auto holds = [&](const std::string& w) { return !jobs_->BusySlots(w).empty(); };
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

// --- checkpoint records ---------------------------------------------------------

absl::Status Checkpoint(JobManager& jobs, const std::string& worker, const std::string& job, int attempt,
                        int rank, int64_t epochs, int64_t step, const std::string& path) {
  v1::CheckpointReport rep;
  rep.set_job_id(job);
  rep.set_attempt(attempt);
  rep.set_rank(rank);
  rep.mutable_record()->set_epochs_done(epochs);
  rep.mutable_record()->set_global_step(step);
  rep.mutable_record()->set_path(path);
  rep.mutable_record()->set_checksum("crc32:0000abcd");
  rep.mutable_record()->set_size_bytes(100);
  return jobs.OnCheckpoint(worker, rep);
}

// Records are the job's, per holder, pruned like the files (keep = 2); a
// restart resumes the newest record rank 0's host holds, and rank 0 moves to
// a host that holds the newest one.
TEST_F(JobManagerTest, CheckpointRecordsDecideWhereAndFromWhatARestartResumes) {
  std::string id = RunningJob();
  // Only the assigned worker may report a rank's checkpoint, with an absolute path.
  EXPECT_EQ(Checkpoint(*jobs_, "b", id, 1, 0, 1, 10, "/w/a/ck1").code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(Checkpoint(*jobs_, "a", id, 1, 0, 1, 10, "relative/ck1").code(), absl::StatusCode::kInvalidArgument);
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
  EXPECT_EQ(paths, (std::vector<std::string>{"/w/a/ck2", "/w/a/ck3", "/w/b/ck2"}));

  // Worker a (holding the newest) is lost; the restart runs on b and c.
  clock_.Advance(absl::Seconds(2));
  ASSERT_TRUE(registry_->Heartbeat("b", b_).ok());
  clock_.Advance(absl::Seconds(2));  // a silent for 4 s > 3 s lease.
  ASSERT_EQ(registry_->ExpireLeases(), std::vector<std::string>{"a"});
  jobs_->OnWorkerLost("a");
  ASSERT_EQ(Get(id).state(), v1::JOB_STATE_RESTARTING);
  ASSERT_TRUE(Status("b", id, 1, 1, v1::RANK_STATE_STOPPED).ok());
  FakeChannel* c = AddWorker("c", 1);
  j = Get(id);
  ASSERT_EQ(j.attempts_size(), 2);
  const v1::Attempt& a2 = j.attempts(1);
  EXPECT_EQ(a2.ranks(0).worker_id(), "b") << "rank 0 moves to the host with a copy";
  ASSERT_TRUE(a2.has_resume());
  EXPECT_EQ(a2.resume().path(), "/w/b/ck2");
  EXPECT_EQ(a2.resume().global_step(), 20);
  ASSERT_FALSE(b_->Starts().empty());
  EXPECT_EQ(b_->Starts().back().resume().path(), "/w/b/ck2");
  EXPECT_EQ(b_->Starts().back().resume().checksum(), "crc32:0000abcd");
  EXPECT_TRUE(b_->Starts().back().produce_rendezvous());
  ASSERT_FALSE(c->Starts().empty());
  EXPECT_EQ(c->Starts().back().resume().path(), "/w/b/ck2") << "every rank learns the same record";
  bool said = false;
  auto events = store_->ListEvents(id, 0, 1000);
  ASSERT_TRUE(events.ok());
  for (const auto& e : *events) {
    if (e.type() == "scheduled" && e.attempt() == 2) {
      said = true;
      EXPECT_THAT(e.message(), HasSubstr("resuming from the checkpoint of job " + id + " at epoch 2 (step 20) on worker b"));
      EXPECT_THAT(e.message(), HasSubstr("the newer the checkpoint of job " + id + " at epoch 3 (step 30) on worker a is unreachable (worker a is not alive)"));
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
  auto job = jobs_->Submit(spec);
  ASSERT_TRUE(job.ok()) << job.status();
  const std::string id = job->id();
  ASSERT_TRUE(Rendezvous("a", id, 1).ok());
  ASSERT_TRUE(Status("a", id, 1, 0, v1::RANK_STATE_RUNNING).ok());
  ASSERT_TRUE(Status("b", id, 1, 1, v1::RANK_STATE_RUNNING).ok());
  ASSERT_TRUE(Checkpoint(*jobs_, "a", id, 1, 0, 0, 5, "/w/a/ck-0-5").ok()) << "inside the first epoch";

  // b is lost; a's rank stops. One slot is free: the job waits for two.
  clock_.Advance(absl::Seconds(2));
  ASSERT_TRUE(registry_->Heartbeat("a", a_).ok());
  clock_.Advance(absl::Seconds(2));
  ASSERT_EQ(registry_->ExpireLeases(), std::vector<std::string>{"b"});
  jobs_->OnWorkerLost("b");
  ASSERT_TRUE(Status("a", id, 1, 0, v1::RANK_STATE_STOPPED).ok());
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
  EXPECT_EQ(j.attempts(1).resume().path(), "/w/a/ck-0-5");
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
  EXPECT_EQ(j.attempts(2).resume().path(), "/w/a/ck-1");
  ASSERT_FALSE(c->Starts().empty());

  std::vector<std::string> events = StoredEvents(id);
  std::vector<std::string> sized;
  for (const std::string& e : events) {
    if (absl::StartsWith(e, "resiz")) sized.push_back(e);
  }
  ASSERT_EQ(sized.size(), 3u) << absl::StrJoin(events, "\n");
  EXPECT_THAT(sized[0], HasSubstr("resized@2: world size 2 -> 1 (no replacement within elastic.replace_timeout_s = 10 s"));
  EXPECT_THAT(sized[1], HasSubstr("resizing@2: elastic: growing from 1 to 2 ranks (1 slot(s) free) at the checkpoint of step 12"));
  EXPECT_THAT(sized[2], HasSubstr("resized@3: world size 1 -> 2 (slots freed up"));
}

TEST_F(JobManagerTest, RestartWithoutAReachableCheckpointSaysItStartsFromScratch) {
  std::string id = RunningJob();
  ASSERT_TRUE(Checkpoint(*jobs_, "a", id, 1, 0, 1, 10, "/w/a/ck1").ok());
  clock_.Advance(absl::Seconds(2));
  ASSERT_TRUE(registry_->Heartbeat("b", b_).ok());
  clock_.Advance(absl::Seconds(2));  // a silent for 4 s > 3 s lease.
  ASSERT_EQ(registry_->ExpireLeases(), std::vector<std::string>{"a"});
  jobs_->OnWorkerLost("a");
  ASSERT_TRUE(Status("b", id, 1, 1, v1::RANK_STATE_STOPPED).ok());
  AddWorker("c", 1);
  v1::Job j = Get(id);
  ASSERT_EQ(j.attempts_size(), 2);
  EXPECT_FALSE(j.attempts(1).has_resume());
  auto events = store_->ListEvents(id, 0, 1000);
  ASSERT_TRUE(events.ok());
  std::string scheduled;
  for (const auto& e : *events) {
    if (e.type() == "scheduled" && e.attempt() == 2) scheduled = e.message();
  }
  EXPECT_THAT(scheduled, HasSubstr("starting from scratch: the checkpoint of job " + id +
                                   " at epoch 1 (step 10) on worker a is unreachable (worker a is not alive)"));
}

TEST_F(JobManagerTest, ResumeFromAnotherJobChecksStateAndCompatibility) {
  std::string id = RunningJob();
  v1::JobSpec cont = Spec(2);
  cont.mutable_training()->set_epochs(3);
  cont.mutable_resume_from()->set_job(id);
  EXPECT_EQ(jobs_->Submit(cont).status().code(), absl::StatusCode::kFailedPrecondition) << "still running";
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
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("training.epochs: 1, but job " + id));
  v1::JobSpec missing = cont;
  missing.mutable_resume_from()->set_job("no-such-job");
  EXPECT_THAT(std::string(jobs_->Submit(missing).status().message()), HasSubstr("resume_from.job: no job"));

  auto next = jobs_->Submit(cont);
  ASSERT_TRUE(next.ok()) << next.status();
  v1::Job j = Get(next->id());
  ASSERT_EQ(j.attempts_size(), 1);
  ASSERT_TRUE(j.attempts(0).has_resume());
  EXPECT_EQ(j.attempts(0).resume().job_id(), id);
  EXPECT_EQ(j.attempts(0).ranks(0).worker_id(), "a");
  EXPECT_EQ(a_->Starts().back().resume().path(), "/w/a/ck1");
}

// --- one write per transition, under store faults -------------------------

v1::RankStatus Failed(const std::string& job, int attempt, int rank, v1::FailureKind kind,
                      const std::string& message) {
  v1::RankStatus st;
  st.set_job_id(job);
  st.set_attempt(attempt);
  st.set_rank(rank);
  st.set_state(v1::RANK_STATE_FAILED);
  st.mutable_exit()->set_kind(kind);
  st.mutable_exit()->set_exit_code(1);
  st.mutable_exit()->set_message(message);
  return st;
}

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
      for (const std::string& w : registry_->ExpireLeases()) jobs_->OnWorkerLost(w);
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
      reason = "rank 1 on host-b (worker b) was lost with its worker: its worker stopped "
               "heartbeating (lease expired)";
      EXPECT_EQ(a.failure_kind(), v1::FAILURE_KIND_WORKER_LOST);
      break;
    case FailurePath::kHang:
      reason = "hung: no progress for 1m from rank(s) 0 (host-a, last step 0), 1 (host-b, last step 0)";
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
  EXPECT_TRUE(jobs_->BusySlots("a").empty() || j.attempts_size() == 2);
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

INSTANTIATE_TEST_SUITE_P(
    EveryWrite, FailurePathUnderFaultsTest,
    ::testing::Combine(::testing::Values(FailurePath::kRankFailed, FailurePath::kWorkerLost,
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
  ASSERT_TRUE(store_->PutJob(j, 1).ok());
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

// --- a lost worker is named as the cause ---------------------------------

TEST_F(JobManagerTest, CollectiveFailureAfterAPeersStreamBrokeBlamesThePeer) {
  std::string id = RunningJob();
  // b's daemon is killed: its stream breaks; its lease has not expired yet.
  registry_->SessionEnded("b", b_, /*left=*/false);
  ASSERT_EQ(registry_->Find("b")->state(), v1::WORKER_STATE_ALIVE);
  ASSERT_TRUE(jobs_->OnRankStatus(
      "a", Failed(id, 1, 0, v1::FAILURE_KIND_COLLECTIVE, "Connection reset by peer")).ok());
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
  ASSERT_TRUE(jobs_->OnRankStatus(
      "a", Failed(id, 1, 0, v1::FAILURE_KIND_COLLECTIVE, "Connection reset by peer")).ok());
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
  for (const std::string& w : registry_->ExpireLeases()) jobs_->OnWorkerLost(w);
  EXPECT_EQ(Get(id).attempts(0).ranks(1).exit().kind(), v1::FAILURE_KIND_WORKER_LOST);
  EXPECT_EQ(Get(id).restarts(), 1);
}

TEST_F(JobManagerTest, HeldCollectiveFailureWithHealthyPeersFailsAfterTheWait) {
  lost_worker_wait_ = absl::Seconds(1);
  Open();
  std::string id = RunningJob();
  ASSERT_TRUE(jobs_->OnRankStatus(
      "a", Failed(id, 1, 0, v1::FAILURE_KIND_COLLECTIVE, "Gloo timeout")).ok());
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
  ASSERT_TRUE(jobs_->OnRankStatus(
      "a", Failed(job->id(), 1, 0, v1::FAILURE_KIND_COLLECTIVE, "Gloo timeout")).ok());
  EXPECT_EQ(Get(job->id()).state(), v1::JOB_STATE_RESTARTING) << "no peer worker to wait for";
}

// Which classes restart (docs/failures.md): one row per class.
TEST_F(JobManagerTest, EachFailureClassHasItsAction) {
  struct Row {
    v1::FailureKind kind;
    bool restarts;
  };
  const std::vector<Row> rows = {
      {v1::FAILURE_KIND_CONFIG, false},        {v1::FAILURE_KIND_DATA, false},
      {v1::FAILURE_KIND_OUT_OF_MEMORY, false}, {v1::FAILURE_KIND_PREFLIGHT, false},
      {v1::FAILURE_KIND_EXIT, true},           {v1::FAILURE_KIND_SIGNAL, true},
      {v1::FAILURE_KIND_COLLECTIVE, true},     {v1::FAILURE_KIND_RENDEZVOUS, true},
      {v1::FAILURE_KIND_LAUNCH, true},         {v1::FAILURE_KIND_USER_CODE, true},
      {v1::FAILURE_KIND_HANG, true},           {v1::FAILURE_KIND_DISK_FULL, true},
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
    EXPECT_EQ(j.attempts_size(), row.restarts ? 2 : 1);
    // NaN rollbacks have their own budget.
    EXPECT_EQ(j.restarts(), row.restarts && row.kind != v1::FAILURE_KIND_NAN ? 1 : 0);
  }
}

TEST_F(JobManagerTest, OutOfMemoryFailsAtOnceAndSaysWhy) {
  std::string id = RunningJob();
  ASSERT_TRUE(Status("b", id, 1, 1, v1::RANK_STATE_FAILED, v1::FAILURE_KIND_OUT_OF_MEMORY, -1).ok());
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
  EXPECT_THAT(StoredEvents(id),
              Contains("rollback@1: NaN/Inf at step 57: rolling back to the checkpoint at step 40 and skipping "
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

absl::Status PreflightReport(JobManager& jobs, const std::string& worker, const std::string& job, int attempt,
                             std::vector<std::string> problems) {
  v1::PreflightReport r;
  r.set_job_id(job);
  r.set_attempt(attempt);
  for (auto& p : problems) r.add_problems(p);
  return jobs.OnPreflightReport(worker, r);
}

TEST_F(JobManagerTest, PreflightProblemOnOneWorkerFailsTheAttemptBeforeAnyRankStarts) {
  preflight_ = true;
  Open();
  a_ = AddWorker("a", 1);
  b_ = AddWorker("b", 1);
  auto job = jobs_->Submit(Spec(2));
  ASSERT_TRUE(job.ok()) << job.status();
  const std::string id = job->id();
  EXPECT_EQ(a_->Preflights(), 1);
  EXPECT_EQ(b_->Preflights(), 1);
  EXPECT_TRUE(a_->Starts().empty()) << "no StartRanks before every worker passed";
  // Only the attempt's workers may answer, for the current attempt.
  AddWorker("c", 1);
  EXPECT_EQ(PreflightReport(*jobs_, "c", id, 1, {}).code(), absl::StatusCode::kPermissionDenied);
  ASSERT_TRUE(PreflightReport(*jobs_, "a", id, 1, {}).ok());
  EXPECT_EQ(Get(id).state(), v1::JOB_STATE_SCHEDULED) << "waits for b";
  ASSERT_TRUE(PreflightReport(*jobs_, "b", id, 1, {"data.train.path /x/train.csv: no such file"}).ok());
  v1::Job j = Get(id);
  EXPECT_EQ(j.state(), v1::JOB_STATE_FAILED);
  EXPECT_EQ(j.attempts(0).failure_kind(), v1::FAILURE_KIND_PREFLIGHT);
  EXPECT_EQ(j.attempts(0).reason(), "pre-flight failed: b: data.train.path /x/train.csv: no such file");
  EXPECT_TRUE(a_->Starts().empty());
  EXPECT_TRUE(b_->Starts().empty());
  EXPECT_TRUE(a_->Stops().empty()) << "nothing started, nothing to stop";
  for (const auto& r : j.attempts(0).ranks()) EXPECT_EQ(r.state(), v1::RANK_STATE_STOPPED);
  int failures = 0;
  for (const std::string& e : StoredEvents(id)) {
    if (absl::StartsWith(e, "attempt_failed@1: ")) {
      ++failures;
      EXPECT_EQ(e, "attempt_failed@1: pre-flight failed: b: data.train.path /x/train.csv: no such file");
    }
  }
  EXPECT_EQ(failures, 1);
  // The slots are free again: the next job is placed (and checked) at once.
  auto next = jobs_->Submit(Spec(2));
  ASSERT_TRUE(next.ok());
  EXPECT_EQ(Get(next->id()).state(), v1::JOB_STATE_SCHEDULED);
}

TEST_F(JobManagerTest, PreflightPassedOnEveryWorkerStartsTheRanks) {
  preflight_ = true;
  Open();
  a_ = AddWorker("a", 1);
  b_ = AddWorker("b", 1);
  auto job = jobs_->Submit(Spec(2));
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_TRUE(PreflightReport(*jobs_, "b", job->id(), 1, {}).ok());
  EXPECT_TRUE(b_->Starts().empty());
  ASSERT_TRUE(PreflightReport(*jobs_, "a", job->id(), 1, {}).ok());
  ASSERT_EQ(a_->Starts().size(), 1u);
  ASSERT_EQ(b_->Starts().size(), 1u);
  EXPECT_TRUE(a_->Starts()[0].produce_rendezvous());
  // A late duplicate changes nothing.
  ASSERT_TRUE(PreflightReport(*jobs_, "a", job->id(), 1, {"late"}).ok());
  EXPECT_EQ(a_->Starts().size(), 1u);
  EXPECT_EQ(Get(job->id()).state(), v1::JOB_STATE_SCHEDULED);
}

}  // namespace
}  // namespace trainctl::coordinator
