// Coordinator + worker daemons as real processes on loopback, with a
// stand-in rank process (tests/support/fake_rank.py) that speaks the rank
// protocol without LibTorch: the daemon's behaviour in every scenario of
// the worker issue — success with metrics at a watcher, cancel leaving no
// process, a SIGKILLed daemon, a crashed rank, a SIGKILLed coordinator, a
// job waiting for slots, a config error, a flood of log lines.
#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

#include <fstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/jobspec/job_spec.h"
#include "tests/support/cluster.h"
#include "tests/support/source_dir.h"

namespace trainctl {
namespace {

using ::testing::HasSubstr;
using trainctl::testing::Cluster;
using trainctl::testing::SourceDir;

v1::JobSpec Spec(const std::string& name, int world_size, int epochs, int max_restarts = 3) {
  ParsedJobSpec p = ParseJobSpecYaml(
      "model: {name: mlp, input_dim: 5, classes: 2}\n"
      "data: {train: {format: synthetic, length: 100, size: 5, classes: 2}}\n",
      "e2e.yaml",
      {"name=" + name, absl::StrCat("world_size=", world_size),
       absl::StrCat("training.epochs=", epochs),
       absl::StrCat("restart.max_restarts=", max_restarts)});
  EXPECT_TRUE(p.ok()) << (p.errors.empty() ? "" : p.errors[0].ToString());
  return p.spec;
}

class WorkerE2ETest : public ::testing::Test {
 protected:
  void SetUp() override {
    cluster_ = std::make_unique<Cluster>(trainctl::testing::BuildDirOfThisTest(),
                                         SourceDir() + "/tests/support/fake_rank.py");
    ASSERT_TRUE(cluster_->StartCoordinator());
  }
  void StartWorkers(int n) {
    for (int i = 0; i < n; ++i) ASSERT_TRUE(cluster_->StartWorker(absl::StrCat("w", i)));
    ASSERT_TRUE(cluster_->WaitWorkers(n));
  }
  std::string Describe(const v1::Job& j) {
    std::string s = absl::StrCat("state ", j.state(), " reason: ", j.state_reason());
    for (const auto& a : j.attempts())
      absl::StrAppend(&s, "\n attempt ", a.number(), " ", a.state(), " ", a.reason());
    return s;
  }
  std::unique_ptr<Cluster> cluster_;
};

TEST_F(WorkerE2ETest, ClassicJobSucceedsWithMetricsAtAWatcher) {
  StartWorkers(2);
  std::string id = cluster_->Submit(Spec("fake-ok", 2, 3));
  ASSERT_FALSE(id.empty());
  grpc::ClientContext ctx;
  v1::WatchJobRequest req;
  req.set_job_id(id);
  req.set_include_history(true);
  auto reader = cluster_->jobs()->WatchJob(&ctx, req);
  std::map<int, int> epoch_ends_per_rank;
  v1::JobState last = v1::JOB_STATE_UNSPECIFIED;
  v1::JobUpdate u;
  while (reader->Read(&u)) {
    for (const auto& p : u.metrics().points()) {
      if (p.kind() == v1::MetricPoint::KIND_EPOCH_END) ++epoch_ends_per_rank[p.rank()];
    }
    if (u.has_job()) last = u.job().state();
  }
  EXPECT_TRUE(reader->Finish().ok());
  EXPECT_EQ(last, v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(epoch_ends_per_rank[0], 3);
  EXPECT_EQ(epoch_ends_per_rank[1], 3);
  v1::Job j = cluster_->Get(id);
  ASSERT_EQ(j.attempts_size(), 1);
  EXPECT_NE(j.attempts(0).ranks(0).worker_id(), j.attempts(0).ranks(1).worker_id());
  EXPECT_DOUBLE_EQ(j.progress().last_eval().accuracy(), 0.8);
  // Logs of both ranks reached the coordinator.
  grpc::ClientContext lctx;
  v1::GetLogsRequest lreq;
  lreq.set_job_id(id);
  auto logs = cluster_->jobs()->GetLogs(&lctx, lreq);
  std::set<int> ranks_with_logs;
  v1::LogChunk c;
  while (logs->Read(&c)) {
    for (const auto& l : c.lines()) {
      if (absl::StrContains(l.text(), "epoch 2 done")) ranks_with_logs.insert(c.rank());
    }
  }
  EXPECT_EQ(ranks_with_logs, (std::set<int>{0, 1}));
}

// `trainctl-worker --work_dir w --rank_binary ./bin/trainctl-rank` typed by
// hand: rank processes run in their own directories, so the daemon must hand
// them absolute paths (a relative --work_dir failed every rank with "rank
// config ...: cannot read").
TEST_F(WorkerE2ETest, RelativeWorkDirAndRankBinary) {
  ASSERT_TRUE(cluster_->StartWorker("rel", 2, /*relative_paths=*/true));
  ASSERT_TRUE(cluster_->WaitWorkers(1));
  std::string id = cluster_->Submit(Spec("fake-relative", 2, 1));
  ASSERT_FALSE(id.empty());
  v1::Job j = cluster_->WaitState(id, v1::JOB_STATE_SUCCEEDED, absl::Seconds(30));
  EXPECT_EQ(j.state(), v1::JOB_STATE_SUCCEEDED) << Describe(j);
}

TEST_F(WorkerE2ETest, CancelLeavesNoRankProcess) {
  StartWorkers(2);
  std::string id = cluster_->Submit(Spec("fake-stubborn", 2, 1));
  cluster_->WaitState(id, v1::JOB_STATE_RUNNING, absl::Seconds(20));
  EXPECT_EQ(Cluster::ProcessesMatching("/jobs/" + id + "/").size(), 2u);
  grpc::ClientContext ctx;
  v1::CancelJobRequest req;
  req.set_job_id(id);
  v1::Job job;
  ASSERT_TRUE(cluster_->jobs()->CancelJob(&ctx, req, &job).ok());
  EXPECT_EQ(job.state(), v1::JOB_STATE_CANCELLED);
  // Ranks ignore SIGTERM; the daemons SIGKILL them after the grace period.
  absl::Time deadline = absl::Now() + absl::Seconds(20);
  while (!Cluster::ProcessesMatching("/jobs/" + id + "/").empty() && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(50));
  }
  EXPECT_TRUE(Cluster::ProcessesMatching("/jobs/" + id + "/").empty());
  // The coordinator saw them stop: their slots are free for the next job.
  std::string next = cluster_->Submit(Spec("fake-ok", 2, 1));
  EXPECT_EQ(cluster_->WaitState(next, v1::JOB_STATE_SUCCEEDED).state(), v1::JOB_STATE_SUCCEEDED);
  v1::Job cancelled = cluster_->Get(id);
  for (const auto& r : cancelled.attempts(0).ranks()) EXPECT_EQ(r.state(), v1::RANK_STATE_STOPPED);
}

TEST_F(WorkerE2ETest, KilledDaemonRestartsTheJobWhichSucceeds) {
  StartWorkers(2);
  std::string id = cluster_->Submit(Spec("fake-slow", 2, 4));
  cluster_->WaitState(id, v1::JOB_STATE_RUNNING, absl::Seconds(20));
  absl::SleepFor(absl::Milliseconds(1500));  // Past epoch 0: rank 0 has checkpointed.
  cluster_->KillWorker("w1", SIGKILL);
  // Its rank dies with it (no orphan holding the slot).
  absl::SleepFor(absl::Milliseconds(300));
  EXPECT_TRUE(Cluster::ProcessesMatching("/worker-w1/jobs/" + id).empty());
  v1::Job j = cluster_->WaitState(id, v1::JOB_STATE_RESTARTING, absl::Seconds(20));
  ASSERT_EQ(j.state(), v1::JOB_STATE_RESTARTING) << Describe(j);
  ASSERT_TRUE(cluster_->StartWorker("w1"));
  j = cluster_->WaitState(id, v1::JOB_STATE_SUCCEEDED, absl::Seconds(60));
  ASSERT_EQ(j.state(), v1::JOB_STATE_SUCCEEDED) << Describe(j);
  EXPECT_EQ(j.restarts(), 1);
  int lost = 0;
  for (const auto& r : j.attempts(0).ranks())
    lost += r.exit().kind() == v1::FAILURE_KIND_WORKER_LOST;
  EXPECT_EQ(lost, 1) << Describe(j);
  EXPECT_THAT(j.attempts(0).reason(), HasSubstr("lost with its worker"));
}

TEST_F(WorkerE2ETest, CrashedRankRestartsAndBudgetIsRespected) {
  StartWorkers(2);
  std::string id = cluster_->Submit(Spec("fake-crash", 2, 3));
  v1::Job j = cluster_->WaitState(id, v1::JOB_STATE_SUCCEEDED, absl::Seconds(60));
  ASSERT_EQ(j.state(), v1::JOB_STATE_SUCCEEDED) << Describe(j);
  ASSERT_EQ(j.attempts_size(), 2);
  const v1::RankAssignment& crashed = j.attempts(0).ranks(1);
  EXPECT_EQ(crashed.exit().kind(), v1::FAILURE_KIND_SIGNAL);
  EXPECT_EQ(crashed.exit().signal(), SIGSEGV);
  EXPECT_THAT(j.attempts(0).reason(), HasSubstr("killed by signal 11"));
  EXPECT_THAT(j.attempts(0).reason(), HasSubstr("about to crash"));
  // The checkpoint lines reached the coordinator as records of this job, the
  // last one (epoch 3) before the rank's end.
  int64_t newest = 0;
  for (const auto& r : j.checkpoints()) {
    EXPECT_EQ(r.job_id(), id);
    EXPECT_FALSE(r.worker_id().empty());
    newest = std::max(newest, r.epochs_done());
  }
  EXPECT_EQ(newest, 3) << Describe(j);
  // With no restarts allowed the same crash fails the job.
  std::string id2 = cluster_->Submit(Spec("fake-crash", 2, 3, /*max_restarts=*/0));
  j = cluster_->WaitState(id2, v1::JOB_STATE_FAILED, absl::Seconds(60));
  ASSERT_EQ(j.state(), v1::JOB_STATE_FAILED) << Describe(j);
  EXPECT_THAT(j.state_reason(), HasSubstr("no restarts left"));
}

TEST_F(WorkerE2ETest, SigkilledRankProcessIsAFaultThatRestarts) {
  StartWorkers(2);
  std::string id = cluster_->Submit(Spec("fake-slow", 2, 3));
  cluster_->WaitState(id, v1::JOB_STATE_RUNNING, absl::Seconds(20));
  std::vector<pid_t> pids = Cluster::ProcessesMatching("/worker-w1/jobs/" + id + "/attempt-1/");
  ASSERT_EQ(pids.size(), 1u);
  kill(pids[0], SIGKILL);
  v1::Job j = cluster_->WaitState(id, v1::JOB_STATE_SUCCEEDED, absl::Seconds(60));
  ASSERT_EQ(j.state(), v1::JOB_STATE_SUCCEEDED) << Describe(j);
  int killed = 0;
  for (const auto& r : j.attempts(0).ranks())
    killed += r.exit().signal() == SIGKILL && r.state() == v1::RANK_STATE_FAILED;
  EXPECT_EQ(killed, 1) << Describe(j);
  EXPECT_EQ(j.restarts(), 1);
}

TEST_F(WorkerE2ETest, SigkilledCoordinatorResumesTheRunningJob) {
  StartWorkers(2);
  std::string id = cluster_->Submit(Spec("fake-slow", 2, 4));
  cluster_->WaitState(id, v1::JOB_STATE_RUNNING, absl::Seconds(20));
  cluster_->KillCoordinator(SIGKILL);
  absl::SleepFor(absl::Milliseconds(500));
  ASSERT_TRUE(cluster_->StartCoordinator());
  // Both workers are back within the reconnect budget (2 s after the
  // coordinator answers; the bound adds margin for a loaded machine but
  // stays far below the 15 s recovery grace they would otherwise be lost at).
  const absl::Time answering = absl::Now();
  absl::Duration back = absl::InfiniteDuration();
  while (absl::Now() - answering < absl::Seconds(20)) {
    grpc::ClientContext ctx;
    v1::ListWorkersResponse resp;
    int reconnected = 0;
    if (cluster_->workers_stub()->ListWorkers(&ctx, v1::ListWorkersRequest(), &resp).ok()) {
      for (const v1::Worker& w : resp.workers()) {
        reconnected +=
            w.last_heartbeat_time().seconds() * 1000 + w.last_heartbeat_time().nanos() / 1000000 >=
            absl::ToUnixMillis(answering);
      }
    }
    if (reconnected == 2) {
      back = absl::Now() - answering;
      break;
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_LE(back, absl::Seconds(6)) << "workers took this long to reconnect";
  v1::Job j = cluster_->WaitState(id, v1::JOB_STATE_SUCCEEDED, absl::Seconds(60));
  ASSERT_EQ(j.state(), v1::JOB_STATE_SUCCEEDED) << Describe(j);
  EXPECT_EQ(j.attempts_size(), 1) << "the ranks kept running through the coordinator restart\n"
                                  << Describe(j);
}

// --max-heartbeats-per-sec: the cluster's workers heartbeat every 200 ms; a
// bound of 5 a second holds one of them, and with the second the terms grow
// to 400 ms (lease 3 s). The second daemon registers on them, the first is
// told in a heartbeat's answer, and both keep to them and stay ALIVE.
TEST_F(WorkerE2ETest, AFleetPastTheHeartbeatBoundIsToldLongerTermsAndKeepsThem) {
  cluster_->KillCoordinator(SIGTERM);
  ASSERT_TRUE(cluster_->StartCoordinator({"--max-heartbeats-per-sec=5"}));
  ASSERT_TRUE(cluster_->StartWorker("w0", 1, false, {"--log-level=debug"}));
  ASSERT_TRUE(cluster_->WaitWorkers(1));
  ASSERT_TRUE(cluster_->StartWorker("w1", 1, false, {"--log-level=debug"}));
  ASSERT_TRUE(cluster_->WaitWorkers(2));
  auto said = [&](const std::string& worker, const std::string& line) {
    const absl::Time deadline = absl::Now() + absl::Seconds(20);
    while (absl::Now() < deadline) {
      for (absl::string_view l : absl::StrSplit(cluster_->worker(worker)->ReadLog(), '\n')) {
        if (absl::StrContains(l, line) && absl::StrContains(l, "heartbeat=400ms")) return true;
      }
      absl::SleepFor(absl::Milliseconds(50));
    }
    return false;
  };
  EXPECT_TRUE(said("w0", "heartbeat_interval_changed")) << cluster_->worker("w0")->ReadLog();
  EXPECT_TRUE(said("w1", " registered ")) << cluster_->worker("w1")->ReadLog();
  // Two of the first terms' leases later, both are still ALIVE.
  absl::SleepFor(absl::Seconds(3));
  grpc::ClientContext ctx;
  v1::ListWorkersResponse resp;
  ASSERT_TRUE(cluster_->workers_stub()->ListWorkers(&ctx, v1::ListWorkersRequest(), &resp).ok());
  ASSERT_EQ(resp.workers_size(), 2);
  for (const v1::Worker& w : resp.workers()) {
    EXPECT_EQ(w.state(), v1::WORKER_STATE_ALIVE) << w.ShortDebugString();
  }
}

TEST_F(WorkerE2ETest, FollowOutlivesACoordinatorRestart) {
  StartWorkers(2);
  const std::string yaml = cluster_->dir() + "/follow.yaml";
  {
    std::ofstream f(yaml);
    f << "name: fake-slow\nworld_size: 2\ntraining: {epochs: 5}\n"
         "model: {name: mlp, input_dim: 5, classes: 2}\n"
         "data: {train: {format: synthetic, length: 100, size: 5, classes: 2}}\n";
  }
  trainctl::testing::Process follow(
      {trainctl::testing::BuildDirOfThisTest() + "/client/trainctl", "--coordinator",
       cluster_->address(), "--token-file", cluster_->AdminTokenFile(), "submit", yaml, "--follow"},
      cluster_->dir() + "/follow.log", cluster_->dir());
  ASSERT_TRUE(follow.Start());
  // Kill the coordinator once the job runs (its first epoch_end is on the
  // follower's screen), bring it back a second later.
  absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (!absl::StrContains(follow.ReadLog(), "epoch_end") && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(50));
  }
  ASSERT_THAT(follow.ReadLog(), HasSubstr("epoch_end"));
  cluster_->KillCoordinator(SIGKILL);
  absl::SleepFor(absl::Seconds(1));
  ASSERT_TRUE(cluster_->StartCoordinator());
  const int status = follow.Wait(absl::Seconds(60));
  const std::string out = follow.ReadLog();
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status << "\n" << out;
  EXPECT_THAT(out, HasSubstr("the stream broke"));
  EXPECT_THAT(out, HasSubstr("SUCCEEDED"));
  // Every event once: what happened during the break came after it, and
  // what was seen before it did not come again.
  for (const std::string epoch :
       {"epoch_end  epoch 1/", "epoch_end  epoch 2/", "epoch_end  epoch 3/", "epoch_end  epoch 4/",
        "epoch_end  epoch 5/"}) {
    size_t count = 0;
    for (size_t at = out.find(epoch); at != std::string::npos; at = out.find(epoch, at + 1))
      ++count;
    EXPECT_EQ(count, 1u) << epoch << "\n" << out;
  }
}

TEST_F(WorkerE2ETest, JobWaitsForSlotsUntilAWorkerJoins) {
  StartWorkers(1);
  v1::JobSpec spec = Spec("fake-ok", 2, 1);
  {
    // Two ranks on a one-slot cluster: refused at submit unless it waits.
    grpc::Status s = cluster_->TrySubmit(spec);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
    EXPECT_THAT(s.error_message(),
                HasSubstr("can never run this job: needs 2 cpu slots, the cluster has 1"));
  }
  spec.mutable_scheduling()->set_wait_for_capacity(true);
  std::string id = cluster_->Submit(spec);
  absl::SleepFor(absl::Seconds(1));
  v1::Job j = cluster_->Get(id);
  EXPECT_EQ(j.state(), v1::JOB_STATE_PENDING);
  EXPECT_THAT(j.state_reason(), HasSubstr("needs 2"));
  ASSERT_TRUE(cluster_->StartWorker("w1"));
  EXPECT_EQ(cluster_->WaitState(id, v1::JOB_STATE_SUCCEEDED).state(), v1::JOB_STATE_SUCCEEDED);
}

TEST_F(WorkerE2ETest, ConfigErrorFailsAtOnceWithTheReason) {
  StartWorkers(2);
  std::string id = cluster_->Submit(Spec("fake-config", 2, 1));
  v1::Job j = cluster_->WaitState(id, v1::JOB_STATE_FAILED, absl::Seconds(30));
  ASSERT_EQ(j.state(), v1::JOB_STATE_FAILED) << Describe(j);
  EXPECT_EQ(j.attempts_size(), 1);
  EXPECT_THAT(j.state_reason(), HasSubstr("data.train.images: /nope/images.gz: no such file"));
  EXPECT_THAT(j.state_reason(), HasSubstr("bad data file"));
  EXPECT_THAT(j.state_reason(), HasSubstr("not restarted"));
}

TEST_F(WorkerE2ETest, LogFloodIsRateLimited) {
  StartWorkers(1);
  std::string id = cluster_->Submit(Spec("fake-spam", 1, 1));
  ASSERT_EQ(cluster_->WaitState(id, v1::JOB_STATE_SUCCEEDED).state(), v1::JOB_STATE_SUCCEEDED);
  grpc::ClientContext ctx;
  v1::GetLogsRequest req;
  req.set_job_id(id);
  auto logs = cluster_->jobs()->GetLogs(&ctx, req);
  int lines = 0;
  bool dropped_note = false;
  v1::LogChunk c;
  while (logs->Read(&c)) {
    lines += c.lines_size();
    for (const auto& l : c.lines())
      dropped_note |= absl::StrContains(l.text(), "log lines dropped");
  }
  EXPECT_TRUE(dropped_note);
  EXPECT_LT(lines, 3000) << "a second of printing in a loop is cut to the rate limit";
}

}  // namespace
}  // namespace trainctl
