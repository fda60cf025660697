// Liveness on the monotonic clock with real processes (#30 finding 3): the
// coordinator runs under libfaketime (Debian `faketime`) with only its wall
// clock faked (FAKETIME_DONT_FAKE_MONOTONIC), and the test steps it while a
// job trains with Gloo on loopback:
//  * +120 s: no worker is LOST, no hang is declared, the attempt runs on;
//  * then -120 s (a 240 s step back): a rank stopped with SIGSTOP is still
//    detected as hung within the usual bound (it took ~118 s when the
//    timers ran on the wall clock), and the job restarts from its
//    checkpoint and SUCCEEDS.
// Worker daemons are not run under libfaketime here: their ranks inherit it,
// and libfaketime cannot fake the kernel's clock for futex waits that
// abseil (Debian's 20220623) takes with absolute CLOCK_REALTIME deadlines,
// so a faked step back ends every wait of a rank at once, which no real
// clock step does. The daemon's timers are tested with FakeClock::StepWall.
// Skipped when libfaketime is not installed.
#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "common/jobspec/job_spec.h"
#include "tests/support/cluster.h"

namespace trainctl {
namespace {

using ::testing::HasSubstr;
using trainctl::testing::Cluster;

constexpr char kLibFaketime[] = "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1";

v1::JobSpec Classic(int epochs, const std::string& ckpt_dir, int length) {
  std::string src = std::getenv("TRAINCTL_SOURCE_DIR") ? std::getenv("TRAINCTL_SOURCE_DIR") : ".";
  ParsedJobSpec p =
      ParseJobSpecFile(src + "/examples/mlp-synthetic.yaml",
                       {absl::StrCat("training.epochs=", epochs), "checkpoint.dir=" + ckpt_dir,
                        "checkpoint.shared=true", absl::StrCat("data.train.length=", length)});
  EXPECT_TRUE(p.ok());
  return p.spec;
}

class ClockE2ETest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!std::filesystem::exists(kLibFaketime))
      GTEST_SKIP() << kLibFaketime << " is not installed (faketime)";
    std::string build = trainctl::testing::BuildDirOfThisTest();
    cluster_ = std::make_unique<Cluster>(build, build + "/worker/trainer/trainctl-rank");
    offset_file_ = cluster_->dir() + "/faketime-offset";
    SetOffset("+0");
    // Only the wall clock is faked, re-read from the file at every call.
    cluster_->set_command_prefix({"/usr/bin/env", absl::StrCat("LD_PRELOAD=", kLibFaketime),
                                  "FAKETIME_TIMESTAMP_FILE=" + offset_file_, "FAKETIME_NO_CACHE=1",
                                  "FAKETIME_DONT_FAKE_MONOTONIC=1"});
    ASSERT_TRUE(cluster_->StartCoordinator());
    cluster_->set_command_prefix({});  // the workers run on the real clock
  }

  void SetOffset(const std::string& offset) {
    std::ofstream out(offset_file_ + ".tmp");
    out << offset << "\n";
    out.close();
    std::filesystem::rename(offset_file_ + ".tmp", offset_file_);
  }

  std::unique_ptr<Cluster> cluster_;
  std::string offset_file_;
};

TEST_F(ClockE2ETest, WallClockStepsOfTwoMinutesNeitherLoseWorkersNorHideAHang) {
  // 3 ms of compute per step: epochs of at least 3 s, steps sub-second.
  setenv("TRAINCTL_TEST_STEP_SLEEP_MS", "3", 1);
  const bool started = cluster_->StartWorker("w0") && cluster_->StartWorker("w1");
  unsetenv("TRAINCTL_TEST_STEP_SLEEP_MS");
  ASSERT_TRUE(started);
  ASSERT_TRUE(cluster_->WaitWorkers(2));
  const std::string id = cluster_->Submit(Classic(4, cluster_->dir() + "/ckpt", 60000));
  ASSERT_FALSE(id.empty());
  v1::Job j = cluster_->WaitFor(id, [](const v1::Job& x) {
    return x.checkpoints_size() > 0 || x.state() >= v1::JOB_STATE_SUCCEEDED;
  });
  ASSERT_EQ(j.state(), v1::JOB_STATE_RUNNING) << j.state_reason();

  // +120 s on the coordinator: every lease and hang timer would have expired
  // on the wall clock.
  SetOffset("+120");
  absl::SleepFor(absl::Seconds(4));
  j = cluster_->Get(id);
  EXPECT_EQ(j.state(), v1::JOB_STATE_RUNNING) << j.state_reason();
  EXPECT_EQ(j.attempts_size(), 1);
  grpc::ClientContext ctx;
  v1::ListWorkersRequest req;
  v1::ListWorkersResponse workers;
  ASSERT_TRUE(cluster_->workers_stub()->ListWorkers(&ctx, req, &workers).ok());
  for (const v1::Worker& w : workers.workers())
    EXPECT_EQ(w.state(), v1::WORKER_STATE_ALIVE) << w.id();

  // -120 s (240 s back): a stopped rank is still found hung within the bound.
  SetOffset("-120");
  absl::SleepFor(absl::Seconds(1));
  std::vector<pid_t> pids =
      Cluster::ProcessesMatching(absl::StrCat("/jobs/", id, "/attempt-1/rank-1"));
  ASSERT_FALSE(pids.empty()) << "job " << cluster_->Get(id).ShortDebugString().substr(0, 3000);
  ASSERT_EQ(kill(pids.front(), SIGSTOP), 0);
  const absl::Time stopped = absl::Now();
  j = cluster_->WaitFor(
      id, [](const v1::Job& x) { return x.attempts(0).state() == v1::ATTEMPT_STATE_FAILED; },
      absl::Seconds(60));
  const absl::Duration detected = absl::Now() - stopped;
  std::cerr << "hang detected " << absl::FormatDuration(detected)
            << " after SIGSTOP under a -240 s step\n";
  ASSERT_EQ(j.attempts(0).state(), v1::ATTEMPT_STATE_FAILED) << j.state_reason();
  EXPECT_EQ(j.attempts(0).failure_kind(), v1::FAILURE_KIND_HANG) << j.attempts(0).reason();
  EXPECT_LT(detected, absl::Seconds(30)) << "the wall clock's step delayed the detection";

  j = cluster_->WaitState(id, v1::JOB_STATE_SUCCEEDED, absl::Seconds(180));
  EXPECT_EQ(j.state(), v1::JOB_STATE_SUCCEEDED) << j.state_reason();
}

}  // namespace
}  // namespace trainctl
