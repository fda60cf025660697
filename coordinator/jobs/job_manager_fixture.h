// The JobManager test fixture: a fake clock, a SQLite store in a temporary
// directory, a real WorkerRegistry and fake worker channels, the job owners
// wired as the coordinator wires them (JobOwners), plus the report
// builders the tests share (job_manager_test, job_health_test,
// job_placement_test, job_failure_classes_test).
#pragma once

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <unistd.h>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/clock.h"
#include "common/jobspec/job_spec.h"
#include "coordinator/jobs/job_owners.h"
#include "coordinator/jobs/rank_progress_testing.h"

namespace trainctl::coordinator {

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
  bool Unhandled() const override { return unhandled; }
  std::vector<v1::StartRanks> Starts() const {
    std::vector<v1::StartRanks> out;
    for (const auto& m : sent)
      if (m.has_start_ranks()) out.push_back(m.start_ranks());
    return out;
  }
  std::vector<v1::StopRanks> Stops() const {
    std::vector<v1::StopRanks> out;
    for (const auto& m : sent)
      if (m.has_stop_ranks()) out.push_back(m.stop_ranks());
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
  // Messages read off the stream wait for the loop (WorkerChannel::Unhandled).
  bool unhandled = false;
};

class RecordingSubscriber : public JobSubscriber {
 public:
  void Offer(const v1::JobUpdate& u) override { updates.push_back(u); }
  void JobEnded() override { ended = true; }
  std::vector<std::string> EventTypes() const {
    std::vector<std::string> out;
    for (const auto& u : updates)
      if (u.has_event()) out.push_back(u.event().type());
    return out;
  }
  std::vector<v1::JobUpdate> updates;
  bool ended = false;
};

inline v1::JobSpec Spec(int world_size, int max_restarts = 3) {
  ParsedJobSpec p = ParseJobSpecYaml(
      "name: t\nmodel: {name: mlp, input_dim: 5, classes: 2}\n"
      "data: {train: {format: synthetic, length: 100, size: 5, classes: 2}}\n",
      "t.yaml",
      {absl::StrCat("world_size=", world_size),
       absl::StrCat("restart.max_restarts=", max_restarts)});
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
    jobs_ = nullptr;
    owners_.reset();
    registry_.reset();
    store_.reset();
    std::string cmd = "rm -rf " + dir_;
    (void)std::system(cmd.c_str());
  }
  void Open() {
    jobs_ = nullptr;
    owners_.reset();
    registry_.reset();
    store_.reset();
    auto s = StateStore::Open(dir_ + "/state.db");
    ASSERT_TRUE(s.ok()) << s.status();
    store_ = std::move(*s);
    RegistryOptions ro;
    ro.lease_timeout = absl::Seconds(3);
    ro.max_heartbeats_per_sec = max_heartbeats_per_sec_;
    registry_ = std::make_unique<WorkerRegistry>(store_.get(), &clock_, ro);
    JobManagerOptions jo;
    jo.progress_timeout = absl::Seconds(60);
    jo.rendezvous_timeout = absl::Seconds(30);
    jo.lost_worker_wait = lost_worker_wait_;
    jo.preflight = preflight_;
    jo.restart_backoff = restart_backoff_;
    jo.refuse_unschedulable = refuse_unschedulable_;
    owners_ = std::make_unique<JobOwners>(store_.get(), registry_.get(), &hub_, &clock_, jo);
    jobs_ = &owners_->manager;
    auto snap = store_->LoadAll();
    ASSERT_TRUE(snap.ok()) << snap.status();
    registry_->Recover(snap->workers);
    ASSERT_TRUE(jobs_->Recover(*snap).ok());
  }

  // Registers worker `id` with `slots` CPU slots on a fresh channel.
  FakeChannel* AddWorker(const std::string& id, int slots,
                         std::vector<v1::RunningRank> running = {}, bool allow_commands = false) {
    v1::Register reg = CpuWorker(id, slots);
    for (auto& r : running) *reg.add_running() = r;
    reg.set_allow_commands(allow_commands);
    return RegisterWorker(reg);
  }
  // What worker `id` with `slots` CPU slots sends first (host "host-<id>").
  static v1::Register CpuWorker(const std::string& id, int slots) {
    v1::Register reg;
    reg.set_worker_id(id);
    reg.set_hostname("host-" + id);
    for (int i = 0; i < slots; ++i) {
      v1::Slot* s = reg.add_slots();
      s->set_kind(v1::Slot::KIND_CPU);
      s->set_index(i);
    }
    return reg;
  }
  // Registers `reg` on a fresh channel, as the worker service does.
  FakeChannel* RegisterWorker(const v1::Register& reg) {
    auto ch = std::make_unique<FakeChannel>();
    auto id_or = registry_->Register(reg, ch.get());
    EXPECT_TRUE(id_or.ok()) << id_or.status();
    jobs_->OnWorkerRegistered(reg.worker_id(), reg);
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
    return owners_->starter.OnRendezvous(worker, r);
  }

  v1::Job Get(const std::string& id) {
    auto j = owners_->queries.Get(id);
    EXPECT_TRUE(j.ok()) << j.status();
    return *j;
  }

  // Submit a 2-rank job on workers a and b (1 slot each) and bring it to RUNNING.
  std::string RunningJob(int max_restarts = 3) {
    a_ = AddWorker("a", 1);
    b_ = AddWorker("b", 1);
    return RunTwoRanks(Spec(2, max_restarts));
  }

  // With pre-flight on: workers a and b, and a 2-rank job submitted (its
  // id; "" when the submission fails).
  std::string SubmitWithPreflight() {
    preflight_ = true;
    Open();
    a_ = AddWorker("a", 1);
    b_ = AddWorker("b", 1);
    auto job = jobs_->Submit(Spec(2));
    EXPECT_TRUE(job.ok()) << job.status();
    return job.ok() ? job->id() : "";
  }

  // Submits `spec` (2 ranks, on workers a and b) and brings it to RUNNING;
  // "" when the submission fails.
  // Two ranks on a and b (registered first) with one shared checkpoint
  // directory, /mnt/shared/<job id>; keep 0 = the default.
  std::string RunSharedTwoRanks(int keep = 0) {
    v1::JobSpec spec = Spec(2);
    spec.mutable_checkpoint()->set_dir("/mnt/shared/{job_id}");
    spec.mutable_checkpoint()->set_shared(true);
    if (keep > 0) spec.mutable_checkpoint()->set_keep(keep);
    return RunTwoRanks(spec);
  }

  std::string RunTwoRanks(const v1::JobSpec& spec) {
    auto job = jobs_->Submit(spec);
    EXPECT_TRUE(job.ok()) << job.status();
    if (!job.ok()) return "";
    std::string id = job->id();
    EXPECT_TRUE(Rendezvous("a", id, 1).ok());
    EXPECT_TRUE(Status("a", id, 1, 0, v1::RANK_STATE_RUNNING).ok());
    EXPECT_TRUE(Status("b", id, 1, 1, v1::RANK_STATE_RUNNING).ok());
    EXPECT_EQ(Get(id).state(), v1::JOB_STATE_RUNNING);
    return id;
  }

  // Worker `lost` goes silent past its 3 s lease while `alive` (its channel
  // `alive_ch`) heartbeats, and is lost; then `alive`'s rank `alive_rank` of
  // attempt 1 of `job` reports its stop.
  void LoseWorker(const std::string& lost, const std::string& alive, FakeChannel* alive_ch,
                  const std::string& job, int alive_rank) {
    clock_.Advance(absl::Seconds(2));
    ASSERT_TRUE(registry_->Heartbeat(alive, alive_ch).ok());
    clock_.Advance(absl::Seconds(2));  // `lost` silent for 4 s > 3 s lease.
    ASSERT_EQ(registry_->ExpireLeases(), std::vector<std::string>{lost});
    owners_->health.OnWorkerLost(lost);
    ASSERT_TRUE(Status(alive, job, 1, alive_rank, v1::RANK_STATE_STOPPED).ok());
  }

  // Events of a job as stored, as "type@attempt: message".
  std::vector<std::string> StoredEvents(const std::string& id) {
    auto events = store_->jobs().ListEvents(id, 0, 0);
    EXPECT_TRUE(events.ok()) << events.status();
    std::vector<std::string> out;
    for (const auto& e : *events)
      out.push_back(absl::StrCat(e.type(), "@", e.attempt(), ": ", e.message()));
    return out;
  }

  absl::Duration lost_worker_wait_ = absl::ZeroDuration();
  bool preflight_ = false;
  absl::Duration restart_backoff_ = absl::ZeroDuration();
  bool refuse_unschedulable_ = false;
  int max_heartbeats_per_sec_ = RegistryOptions().max_heartbeats_per_sec;
  std::string dir_;
  FakeClock clock_;
  MetricsHub hub_;
  std::unique_ptr<StateStore> store_;
  std::unique_ptr<WorkerRegistry> registry_;
  std::unique_ptr<JobOwners> owners_;
  JobManager* jobs_ = nullptr;  // &owners_->manager
  std::vector<std::unique_ptr<FakeChannel>> channels_;
  FakeChannel* a_ = nullptr;
  FakeChannel* b_ = nullptr;
};

// A heartbeat of an engine rank in its training steps.
inline v1::RankProgress Heartbeat(const std::string& id, int rank, int64_t step, int64_t seq,
                                  int64_t waiting_seq, double compute_ms = 10) {
  v1::RankProgress p = TrainHeartbeat(rank, step, seq, waiting_seq, compute_ms);
  p.set_job_id(id);
  return p;
}

inline v1::JobSpec CommandSpec(int world_size, const std::string& extra = "") {
  ParsedJobSpec p =
      ParseJobSpecYaml(absl::StrCat("name: c\ncommand: {argv: [python3, train.py]}\n", extra),
                       "c.yaml", {absl::StrCat("world_size=", world_size)});
  EXPECT_TRUE(p.ok()) << p.errors[0].ToString();
  return p.spec;
}

inline v1::RankStatus Failed(const std::string& job, int attempt, int rank, v1::FailureKind kind,
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

// Where a worker whose work dir is `place` keeps `job`'s checkpoint after
// `epochs` (the default checkpoint dir, with the job's file name).
inline std::string CkPath(const std::string& place, const std::string& job, int64_t epochs) {
  return absl::StrFormat("%s/jobs/%s/checkpoints/%s.ckpt-epoch-%06d.pt", place, job, job, epochs);
}

// A checkpoint report of `worker` for a rank of `job`, at CkPath(`place`)
// (a relative `place` is reported as it is).
inline absl::Status Checkpoint(JobManager& jobs, const std::string& worker, const std::string& job,
                               int attempt, int rank, int64_t epochs, int64_t step,
                               const std::string& place) {
  v1::CheckpointReport rep;
  rep.set_job_id(job);
  rep.set_attempt(attempt);
  rep.set_rank(rank);
  rep.mutable_record()->set_epochs_done(epochs);
  rep.mutable_record()->set_global_step(step);
  // `place`: a worker's root (absolute), a whole file path ("....pt"), or
  // any other (refused) text.
  const bool root = !place.empty() && place[0] == '/' && !absl::EndsWith(place, ".pt");
  rep.mutable_record()->set_path(root ? CkPath(place, job, epochs) : place);
  rep.mutable_record()->set_checksum("crc32:0000abcd");
  rep.mutable_record()->set_size_bytes(100);
  return jobs.OnCheckpoint(worker, rep);
}

}  // namespace trainctl::coordinator
