// Hang and straggler detection with real processes: a coordinator, two
// worker daemons and trainctl-rank training the classic example with Gloo
// on loopback, all with default settings.
//  * SIGSTOP one rank mid-training: within 10 s a `hang` event names that
//    rank, its worker and pid, and the collective (with its sequence number)
//    the other rank waits in; the attempt fails as HANG, the job restarts
//    from its checkpoint and SUCCEEDS.
//  * A worker whose ranks are slowed by the test hook
//    (TRAINCTL_TEST_STEP_SLEEP_MS): a `straggler` event names its rank
//    and worker.
#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <cstdlib>
#include <regex>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/jobspec/job_spec.h"
#include "tests/support/cluster.h"
#include "tests/support/metrics_page.h"

namespace trainctl {
namespace {

using trainctl::testing::Cluster;

v1::JobSpec Classic(int epochs, const std::string& ckpt_dir, int length) {
  std::string src = std::getenv("TRAINCTL_SOURCE_DIR") ? std::getenv("TRAINCTL_SOURCE_DIR") : ".";
  ParsedJobSpec p =
      ParseJobSpecFile(src + "/examples/mlp-synthetic.yaml",
                       {absl::StrCat("training.epochs=", epochs), "checkpoint.dir=" + ckpt_dir,
                        "checkpoint.shared=true", absl::StrCat("data.train.length=", length)});
  EXPECT_TRUE(p.ok());
  return p.spec;
}

class HangE2ETest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string build = trainctl::testing::BuildDirOfThisTest();
    cluster_ = std::make_unique<Cluster>(build, build + "/worker/trainer/trainctl-rank");
    ASSERT_TRUE(cluster_->StartCoordinator({"--http_listen=127.0.0.1:0"}));
  }

  // The value of an unlabelled sample on the coordinator's /metrics (NaN
  // when absent).
  double CoordinatorMetric(const std::string& name) {
    return trainctl::testing::PromSample(
        trainctl::testing::CoordinatorMetricsPage(*cluster_, cluster_->admin_token()), name);
  }

  std::vector<v1::Event> Events(const std::string& id) { return cluster_->Events(id); }

  std::optional<v1::Event> WaitEvent(const std::string& id, const std::string& type,
                                     absl::Duration timeout) {
    const absl::Time deadline = absl::Now() + timeout;
    do {
      for (const v1::Event& e : Events(id)) {
        if (e.type() == type) return e;
      }
      absl::SleepFor(absl::Milliseconds(100));
    } while (absl::Now() < deadline);
    return std::nullopt;
  }

  // Pid of `rank` of attempt 1 and the name of its worker.
  std::pair<pid_t, std::string> RankProcess(const std::string& id, int rank) {
    for (const std::string name : {"w0", "w1"}) {
      std::vector<pid_t> pids = Cluster::ProcessesMatching(
          absl::StrCat("/worker-", name, "/jobs/", id, "/attempt-1/rank-", rank));
      if (!pids.empty()) return {pids.front(), name};
    }
    return {0, ""};
  }

  std::unique_ptr<Cluster> cluster_;
};

TEST_F(HangE2ETest, StoppedRankIsNamedWithItsCollectiveWithinTenSecondsAndTheJobResumes) {
  // 3 ms of compute per step on every rank: epochs of at least 3 s (1000
  // steps), long enough to stop a rank mid-epoch; steps stay sub-second.
  setenv("TRAINCTL_TEST_STEP_SLEEP_MS", "3", 1);
  const bool started = cluster_->StartWorker("w0") && cluster_->StartWorker("w1");
  unsetenv("TRAINCTL_TEST_STEP_SLEEP_MS");
  ASSERT_TRUE(started);
  ASSERT_TRUE(cluster_->WaitWorkers(2));
  const std::string ckpt = cluster_->dir() + "/ckpt";
  const std::string id = cluster_->Submit(Classic(3, ckpt, 60000));
  // After rank 0's first checkpoint (so that the restart resumes), and a
  // second into the next epoch.
  absl::Time deadline = absl::Now() + absl::Seconds(90);
  v1::Job j = cluster_->Get(id);
  while (j.checkpoints_size() == 0 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(50));
    j = cluster_->Get(id);
  }
  ASSERT_GT(j.checkpoints_size(), 0) << j.state_reason();
  ASSERT_EQ(j.state(), v1::JOB_STATE_RUNNING);
  absl::SleepFor(absl::Seconds(1));
  auto [pid, worker] = RankProcess(id, 1);
  ASSERT_GT(pid, 0);
  ASSERT_EQ(kill(pid, SIGSTOP), 0);
  const absl::Time stopped = absl::Now();

  // The attempt fails as HANG; the reason names the stopped rank.
  deadline = stopped + absl::Seconds(60);
  j = cluster_->Get(id);
  while (j.attempts_size() < 2 && j.attempts(0).state() != v1::ATTEMPT_STATE_FAILED &&
         absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(50));
    j = cluster_->Get(id);
  }
  const absl::Duration detected = absl::Now() - stopped;
  kill(pid, SIGCONT);  // the daemon has SIGKILLed it by now or will; never leave it stopped
  ASSERT_EQ(j.attempts(0).state(), v1::ATTEMPT_STATE_FAILED) << j.state_reason();
  EXPECT_EQ(j.attempts(0).failure_kind(), v1::FAILURE_KIND_HANG) << j.attempts(0).reason();
  EXPECT_LE(detected, absl::Seconds(10)) << j.attempts(0).reason();
  std::cerr << "hang detected " << absl::FormatDuration(detected)
            << " after SIGSTOP: " << j.attempts(0).reason() << "\n";

  std::optional<v1::Event> hang = WaitEvent(id, "hang", absl::Seconds(5));
  ASSERT_TRUE(hang.has_value());
  EXPECT_EQ(hang->rank(), 1);
  const std::string worker_id = j.attempts(0).ranks(1).worker_id();
  // "rank 1 (worker W, pid P) stopped before all-reduce #N (step S, bucket B); rank 0 waiting in it
  // for X s"
  const std::regex want(
      absl::StrCat("^rank 1 \\(worker ", worker_id, ", pid ", pid,
                   "\\) stopped (before|in) (all-reduce|broadcast|barrier) #[0-9]+.*; rank 0 "
                   "waiting in it for [0-9.]+ s.*no heartbeat from rank 1"));
  EXPECT_TRUE(std::regex_search(hang->message(), want)) << hang->message();

  EXPECT_EQ(CoordinatorMetric("trainctl_hangs_detected_total"), 1);

  j = cluster_->WaitState(id, v1::JOB_STATE_SUCCEEDED, absl::Seconds(180));
  ASSERT_EQ(j.state(), v1::JOB_STATE_SUCCEEDED) << j.state_reason();
  ASSERT_EQ(j.attempts_size(), 2);
  EXPECT_TRUE(j.attempts(1).has_resume());
}

TEST_F(HangE2ETest, SlowedRankRaisesAStragglerEventNamingItsWorker) {
  ASSERT_TRUE(cluster_->StartWorker("w0"));
  // Only w1's ranks are slowed: 15 ms of extra compute per step.
  setenv("TRAINCTL_TEST_STEP_SLEEP_MS", "15", 1);
  const bool started = cluster_->StartWorker("w1");
  unsetenv("TRAINCTL_TEST_STEP_SLEEP_MS");
  ASSERT_TRUE(started);
  ASSERT_TRUE(cluster_->WaitWorkers(2));
  const std::string id = cluster_->Submit(Classic(2, cluster_->dir() + "/ckpt", 60000));
  std::optional<v1::Event> st = WaitEvent(id, "straggler", absl::Seconds(90));
  v1::Job j = cluster_->Get(id);
  ASSERT_TRUE(st.has_value()) << v1::JobState_Name(j.state()) << " " << j.state_reason();
  ASSERT_GE(st->rank(), 0);
  ASSERT_LT(st->rank(), j.attempts(0).ranks_size());
  const v1::RankAssignment& r = j.attempts(0).ranks(st->rank());
  EXPECT_EQ(RankProcess(id, st->rank()).second, "w1") << st->message();
  EXPECT_THAT(st->message(),
              ::testing::HasSubstr(absl::StrCat("rank ", st->rank(), " (worker ", r.worker_id())))
      << st->message();
  EXPECT_THAT(st->message(), ::testing::HasSubstr("is a straggler"));
  EXPECT_EQ(CoordinatorMetric("trainctl_straggler_events_total"), 1);
  // A warning only: the job keeps running.
  EXPECT_EQ(j.state(), v1::JOB_STATE_RUNNING) << j.state_reason();
  grpc::ClientContext ctx;
  v1::CancelJobRequest creq;
  creq.set_job_id(id);
  v1::Job cancelled;
  EXPECT_TRUE(cluster_->jobs()->CancelJob(&ctx, creq, &cancelled).ok());
}

}  // namespace
}  // namespace trainctl
