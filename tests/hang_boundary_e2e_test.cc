// Hang detection at the phase boundaries of an epoch (issue 32), with real
// processes: a coordinator, two worker daemons (one rank each) and
// trainctl-rank training a small MLP with Gloo on loopback.
//
// A rank whose heartbeat is missing for longer than the hang bound is hung
// whatever the phase: each case SIGSTOPs rank 1 at a boundary and expects
// the attempt to fail as HANG within 10 s (the bound, 5 s, plus a missed
// heartbeat, a worker heartbeat and a check), with a `hang` event naming
// rank 1:
//  * right after `epoch_end` (as a user would: the first epoch_end event);
//  * at the next epoch's start, before its first step (the window the
//    stall rule alone could not see: the rank's last word was "init");
//  * during evaluation;
//  * during a resume's checkpoint broadcast (after a restart);
//  * during rank 0's checkpoint write (rank 0 stopped there).
// And a checkpoint write longer than the bound, with the heartbeat running,
// is no hang. The phases are held open by TRAINCTL_TEST_PHASE_SLEEP
// (worker/trainer/test_hooks.h), which logs "test hook: sleeping" first.
//
// HangBoundaryE2ETest.StoppedRightAfterEpochEndIsNamed also runs 20 times
// in a row as hang_boundary_loop_test (ctest -L long).
#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <cstdlib>
#include <iostream>
#include <regex>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/jobspec/job_spec.h"
#include "tests/support/cluster.h"

namespace trainctl {
namespace {

using ::testing::HasSubstr;
using trainctl::testing::Cluster;

// The classic example's MLP on `length` synthetic samples, 2 ranks, a
// checkpoint (rank 0 writes it: shared directory) after every epoch.
v1::JobSpec Spec(int epochs, int length, const std::string& ckpt_dir, bool eval) {
  const std::string yaml = absl::StrCat(
      "name: boundary\nworld_size: 2\ndevice: auto\nbackend: auto\n",
      "model: {name: mlp, input_dim: 5, hidden: [16], classes: 2}\n",
      "data:\n  train: {format: synthetic, length: ", length, ", size: 5, classes: 2, seed: 0}\n",
      eval ? "  eval: {format: synthetic, length: 600, size: 5, classes: 2, seed: 1}\n" : "",
      "  batch_size: 30\n  shuffle: true\n", "training: {epochs: ", epochs,
      ", loss: cross_entropy, optimizer: {name: adam, lr: 0.001}}\n", "checkpoint: {dir: '",
      ckpt_dir, "', shared: true}\n", "metrics: {every_steps: 10}\n");
  ParsedJobSpec p = ParseJobSpecYaml(yaml, "boundary.yaml");
  EXPECT_TRUE(p.ok()) << (p.errors.empty() ? "" : p.errors.front().message);
  return p.spec;
}

class HangBoundaryE2ETest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string build = trainctl::testing::BuildDirOfThisTest();
    cluster_ = std::make_unique<Cluster>(build, build + "/worker/trainer/trainctl-rank");
    ASSERT_TRUE(cluster_->StartCoordinator());
  }

  // Workers w0 and w1 (one slot each) with the test hooks in their
  // environment (their ranks inherit it). A collective timeout well past
  // the hang bound, so that the waiting rank never fails first.
  void StartWorkers(const std::string& phase_sleep, int step_sleep_ms) {
    if (!phase_sleep.empty()) setenv("TRAINCTL_TEST_PHASE_SLEEP", phase_sleep.c_str(), 1);
    if (step_sleep_ms > 0)
      setenv("TRAINCTL_TEST_STEP_SLEEP_MS", absl::StrCat(step_sleep_ms).c_str(), 1);
    const bool started = cluster_->StartWorker("w0", 1, false, {"--rank_timeout_s=60"}) &&
                         cluster_->StartWorker("w1", 1, false, {"--rank_timeout_s=60"});
    unsetenv("TRAINCTL_TEST_PHASE_SLEEP");
    unsetenv("TRAINCTL_TEST_STEP_SLEEP_MS");
    ASSERT_TRUE(started);
    ASSERT_TRUE(cluster_->WaitWorkers(2));
  }

  // The pid of `rank` of `attempt`, waiting up to 60 s for it to exist.
  pid_t RankPid(const std::string& id, int attempt, int rank) {
    const absl::Time deadline = absl::Now() + absl::Seconds(60);
    do {
      for (const std::string name : {"w0", "w1"}) {
        std::vector<pid_t> pids = Cluster::ProcessesMatching(
            absl::StrCat("/worker-", name, "/jobs/", id, "/attempt-", attempt, "/rank-", rank));
        if (!pids.empty()) return pids.front();
      }
      absl::SleepFor(absl::Milliseconds(50));
    } while (absl::Now() < deadline);
    return 0;
  }

  // Waits until `rank` of `attempt` logged that its test hook sleeps in `phase`.
  bool WaitHook(const std::string& id, int attempt, int rank, const std::string& phase) {
    const absl::Time deadline = absl::Now() + absl::Seconds(90);
    do {
      if (absl::StrContains(cluster_->RankLog(id, attempt, rank),
                            absl::StrCat("ms in ", phase, "\n")))
        return true;
      absl::SleepFor(absl::Milliseconds(100));
    } while (absl::Now() < deadline);
    return false;
  }

  // The first event of `type` about `attempt`, waiting up to `timeout`.
  std::optional<v1::Event> WaitEvent(const std::string& id, const std::string& type, int attempt,
                                     absl::Duration timeout) {
    const absl::Time deadline = absl::Now() + timeout;
    do {
      for (const v1::Event& e : cluster_->Events(id)) {
        if (e.type() == type && (attempt == 0 || e.attempt() == attempt)) return e;
      }
      absl::SleepFor(absl::Milliseconds(25));
    } while (absl::Now() < deadline);
    return std::nullopt;
  }

  // SIGSTOPs `pid` (rank `rank` of `attempt`) and expects the attempt to
  // fail as HANG within 10 s, with a `hang` event naming the rank (and its
  // pid). Resumes the process afterwards (its daemon kills it). Returns the
  // hang event's message ("" on failure).
  std::string StopAndExpectHang(const std::string& id, int attempt, int rank, pid_t pid) {
    EXPECT_EQ(kill(pid, SIGSTOP), 0);
    const absl::Time stopped = absl::Now();
    v1::Job j = cluster_->WaitFor(
        id,
        [&](const v1::Job& job) {
          return job.attempts_size() >= attempt &&
                 job.attempts(attempt - 1).state() == v1::ATTEMPT_STATE_FAILED;
        },
        absl::Seconds(60));
    const absl::Duration detected = absl::Now() - stopped;
    kill(pid, SIGCONT);  // never leave a process stopped
    if (j.attempts_size() < attempt ||
        j.attempts(attempt - 1).state() != v1::ATTEMPT_STATE_FAILED) {
      ADD_FAILURE() << "attempt " << attempt
                    << " did not fail within 60 s of the SIGSTOP: " << v1::JobState_Name(j.state())
                    << " " << j.state_reason();
      return "";
    }
    const v1::Attempt& a = j.attempts(attempt - 1);
    EXPECT_EQ(a.failure_kind(), v1::FAILURE_KIND_HANG) << a.reason();
    EXPECT_LE(detected, absl::Seconds(10)) << a.reason();
    std::cerr << "hang detected " << absl::FormatDuration(detected)
              << " after SIGSTOP: " << a.reason() << "\n";
    std::optional<v1::Event> hang = WaitEvent(id, "hang", attempt, absl::Seconds(5));
    if (!hang.has_value()) {
      ADD_FAILURE() << "no hang event for attempt " << attempt;
      return "";
    }
    EXPECT_EQ(hang->rank(), rank);
    EXPECT_THAT(hang->message(),
                HasSubstr(absl::StrCat("rank ", rank, " (worker ", a.ranks(rank).worker_id(),
                                       ", pid ", pid, ") stopped")));
    EXPECT_THAT(hang->message(), HasSubstr(absl::StrCat("no heartbeat from rank ", rank, " for ")));
    return hang->message();
  }

  void Cancel(const std::string& id) {
    grpc::ClientContext ctx;
    v1::CancelJobRequest req;
    req.set_job_id(id);
    v1::Job cancelled;
    EXPECT_TRUE(cluster_->jobs()->CancelJob(&ctx, req, &cancelled).ok());
  }

  std::unique_ptr<Cluster> cluster_;
};

// The trial: SIGSTOP rank 1 as soon as the first epoch_end event
// appears. Where the stop lands varies (the checkpoint, the next epoch's
// start, its first steps); every place must be detected in time.
TEST_F(HangBoundaryE2ETest, StoppedRightAfterEpochEndIsNamed) {
  // 2 ms of compute per step: epochs of about 1000 steps take seconds.
  StartWorkers("", 2);
  const std::string id = cluster_->Submit(Spec(4, 60000, cluster_->dir() + "/ckpt", false));
  const pid_t pid = RankPid(id, 1, 1);
  ASSERT_GT(pid, 0);
  ASSERT_TRUE(WaitEvent(id, "epoch_end", 1, absl::Seconds(120)).has_value())
      << cluster_->Get(id).state_reason();
  StopAndExpectHang(id, 1, 1, pid);
  Cancel(id);
}

// Rank 1 stopped at the start of epoch 2, before its first step: its last
// heartbeat says "init", rank 0 waits in the epoch's first all-reduce.
TEST_F(HangBoundaryE2ETest, StoppedAtTheNextEpochsStartIsNamed) {
  StartWorkers("epoch_start:30000", 0);
  const std::string id = cluster_->Submit(Spec(3, 3000, cluster_->dir() + "/ckpt", false));
  ASSERT_TRUE(WaitHook(id, 1, 1, "epoch_start")) << cluster_->Get(id).state_reason();
  const std::string message = StopAndExpectHang(id, 1, 1, RankPid(id, 1, 1));
  EXPECT_THAT(message, HasSubstr("in its epoch start phase (epoch 2,")) << message;
  Cancel(id);
}

TEST_F(HangBoundaryE2ETest, StoppedDuringEvaluationIsNamed) {
  StartWorkers("eval:30000", 0);
  const std::string id = cluster_->Submit(Spec(2, 3000, cluster_->dir() + "/ckpt", true));
  ASSERT_TRUE(WaitHook(id, 1, 1, "eval")) << cluster_->Get(id).state_reason();
  const std::string message = StopAndExpectHang(id, 1, 1, RankPid(id, 1, 1));
  EXPECT_THAT(message, HasSubstr("in its eval phase (epoch 1,")) << message;
  Cancel(id);
}

// Rank 0 (the checkpoint writer) stopped inside its write; rank 1 goes on
// to the next epoch and waits for it there.
TEST_F(HangBoundaryE2ETest, StoppedDuringACheckpointWriteIsNamed) {
  StartWorkers("checkpoint:30000", 0);
  const std::string id = cluster_->Submit(Spec(2, 3000, cluster_->dir() + "/ckpt", false));
  ASSERT_TRUE(WaitHook(id, 1, 0, "checkpoint")) << cluster_->Get(id).state_reason();
  const std::string message = StopAndExpectHang(id, 1, 0, RankPid(id, 1, 0));
  EXPECT_THAT(message, HasSubstr("in its checkpoint phase (epoch 1,")) << message;
  Cancel(id);
}

// After a restart, rank 1 stopped between the broadcasts of the resume
// checkpoint's size and bytes (the attempt is still starting).
TEST_F(HangBoundaryE2ETest, StoppedDuringResumesCheckpointBroadcastIsNamed) {
  StartWorkers("resume:30000", 2);
  const std::string id = cluster_->Submit(Spec(4, 24000, cluster_->dir() + "/ckpt", false));
  v1::Job j = cluster_->WaitFor(
      id, [](const v1::Job& job) { return job.checkpoints_size() > 0; }, absl::Seconds(120));
  ASSERT_GT(j.checkpoints_size(), 0) << j.state_reason();
  // Kill rank 1: the attempt fails (a crash) and the next one resumes.
  const pid_t first = RankPid(id, 1, 1);
  ASSERT_GT(first, 0);
  ASSERT_EQ(kill(first, SIGKILL), 0);
  ASSERT_TRUE(WaitHook(id, 2, 1, "resume")) << cluster_->Get(id).state_reason();
  j = cluster_->Get(id);
  ASSERT_EQ(j.attempts_size(), 2);
  EXPECT_TRUE(j.attempts(1).has_resume());
  const std::string message = StopAndExpectHang(id, 2, 1, RankPid(id, 2, 1));
  EXPECT_THAT(message, HasSubstr("in its start-up phase")) << message;
  Cancel(id);
}

// Rank 0's checkpoint writes take 7 s each, longer than the 5 s bound,
// while rank 1 waits for it; the heartbeat keeps running: no hang.
TEST_F(HangBoundaryE2ETest, ACheckpointWriteLongerThanTheBoundIsNoHang) {
  StartWorkers("checkpoint:7000", 0);
  const std::string id = cluster_->Submit(Spec(2, 3000, cluster_->dir() + "/ckpt", false));
  v1::Job j = cluster_->WaitState(id, v1::JOB_STATE_SUCCEEDED, absl::Seconds(180));
  ASSERT_EQ(j.state(), v1::JOB_STATE_SUCCEEDED) << j.state_reason();
  EXPECT_EQ(j.attempts_size(), 1);
  EXPECT_GE(j.checkpoints_size(), 1);
  EXPECT_THAT(cluster_->RankLog(id, 1, 0), HasSubstr("test hook: sleeping 7000 ms in checkpoint"));
  for (const v1::Event& e : cluster_->Events(id)) EXPECT_NE(e.type(), "hang") << e.message();
}

}  // namespace
}  // namespace trainctl
