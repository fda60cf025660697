// Worker daemons with a --coordinator list, end to end: a real
// trainctl-coordinator and real trainctl-worker processes on loopback, and
// the standby contract's stand-in (tests/support/standby_stand_in.h; swap
// in a real standby once it is on this branch). A worker listed with the
// standby first, or with an unreachable address first, registers with the
// active coordinator and runs a command job to SUCCEEDED; one whose
// coordinator goes away mid-job goes round the list, is pointed back by
// the standby, and its reports (the job's end, its log) reach the
// coordinator when it is back.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <atomic>
#include <fstream>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/jobspec/job_spec.h"
#include "tests/support/cluster.h"
#include "tests/support/ports.h"
#include "tests/support/standby_stand_in.h"

namespace trainctl {
namespace {

using ::testing::HasSubstr;
using trainctl::testing::Cluster;
using trainctl::testing::StandbyStandIn;

constexpr char kSession[] = "/trainctl.v1.WorkerService/Session";

class FailoverE2ETest : public ::testing::Test {
 protected:
  void SetUp() override {
    cluster_ = std::make_unique<Cluster>(trainctl::testing::BuildDirOfThisTest(), "/bin/false");
    ASSERT_TRUE(cluster_->StartCoordinator());
    standby_ = std::make_unique<StandbyStandIn>(cluster_->address());
    ASSERT_FALSE(standby_->address().empty());
  }

  // A one-rank command job running `script` with /bin/sh.
  v1::JobSpec ShellJob(const std::string& script) {
    std::string yaml = absl::StrCat(
        "name: failover\nworld_size: 1\ndevice: cpu\ncommand:\n  argv: [/bin/sh, -c, \"", script,
        "\"]\n  working_dir: ", cluster_->dir(), "\n");
    ParsedJobSpec p = ParseJobSpecYaml(yaml, "job.yaml");
    EXPECT_TRUE(p.ok()) << (p.errors.empty() ? "" : p.errors[0].ToString());
    return p.spec;
  }

  std::unique_ptr<Cluster> cluster_;
  std::unique_ptr<StandbyStandIn> standby_;
};

TEST_F(FailoverE2ETest, WorkerListingTheStandbyFirstRegistersWithTheActiveAndRunsAJob) {
  ASSERT_TRUE(cluster_->StartWorker(
      "w0", 1, false,
      {"--allow_commands", "--coordinator=" + standby_->address() + "," + cluster_->address()}));
  ASSERT_TRUE(cluster_->WaitWorkers(1, absl::Seconds(30))) << cluster_->worker("w0")->ReadLog();
  EXPECT_GE(standby_->calls(kSession), 1) << "the standby was tried first";
  EXPECT_THAT(cluster_->worker("w0")->ReadLog(), HasSubstr("coordinator_standby"));

  std::string id = cluster_->Submit(ShellJob("echo failover-ok"));
  ASSERT_FALSE(id.empty());
  v1::Job j = cluster_->WaitState(id, v1::JOB_STATE_SUCCEEDED, absl::Seconds(60));
  ASSERT_EQ(j.state(), v1::JOB_STATE_SUCCEEDED) << j.state_reason();
  EXPECT_THAT(cluster_->RankLog(id, 1, 0), HasSubstr("failover-ok"));
}

TEST_F(FailoverE2ETest, WorkerListingAnUnreachableAddressFirstRegistersWithTheNext) {
  const std::string dead = absl::StrCat("127.0.0.1:", trainctl::testing::UnusedPort());
  ASSERT_TRUE(cluster_->StartWorker(
      "w0", 1, false, {"--allow_commands", "--coordinator=" + dead + "," + cluster_->address()}));
  ASSERT_TRUE(cluster_->WaitWorkers(1, absl::Seconds(30))) << cluster_->worker("w0")->ReadLog();
  std::string id = cluster_->Submit(ShellJob("echo next-ok"));
  ASSERT_FALSE(id.empty());
  v1::Job j = cluster_->WaitState(id, v1::JOB_STATE_SUCCEEDED, absl::Seconds(60));
  ASSERT_EQ(j.state(), v1::JOB_STATE_SUCCEEDED) << j.state_reason();
}

TEST_F(FailoverE2ETest, ReportsHeldWhileTheCoordinatorIsAwayReachItThroughTheList) {
  // The active coordinator is listed second: after it goes away the worker
  // tries the standby, which names it, until it answers again.
  ASSERT_TRUE(cluster_->StartWorker(
      "w0", 1, false,
      {"--allow_commands", "--coordinator=" + standby_->address() + "," + cluster_->address()}));
  ASSERT_TRUE(cluster_->WaitWorkers(1, absl::Seconds(30))) << cluster_->worker("w0")->ReadLog();
  const std::string go = cluster_->dir() + "/go";
  // The rank waits for the file, then says so and ends: its end and its
  // line are reported while the coordinator is down.
  std::string id = cluster_->Submit(ShellJob(
      absl::StrCat("while [ ! -e ", go, " ]; do sleep 0.05; done; echo after-the-outage")));
  ASSERT_FALSE(id.empty());
  v1::Job running = cluster_->WaitState(id, v1::JOB_STATE_RUNNING, absl::Seconds(60));
  ASSERT_EQ(running.state(), v1::JOB_STATE_RUNNING) << running.state_reason();
  const int64_t standby_before = standby_->calls(kSession);

  cluster_->KillCoordinator(SIGKILL);
  ASSERT_TRUE(std::system(absl::StrCat("touch ", go).c_str()) == 0);
  // Wait until the worker has gone round the list to the standby at least
  // once (it holds the rank's end meanwhile), then bring the coordinator back.
  absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (standby_->calls(kSession) == standby_before && absl::Now() < deadline)
    absl::SleepFor(absl::Milliseconds(20));
  ASSERT_GT(standby_->calls(kSession), standby_before) << cluster_->worker("w0")->ReadLog();
  ASSERT_TRUE(cluster_->StartCoordinator());

  v1::Job j = cluster_->WaitState(id, v1::JOB_STATE_SUCCEEDED, absl::Seconds(60));
  ASSERT_EQ(j.state(), v1::JOB_STATE_SUCCEEDED) << j.state_reason() << "\n"
                                                << cluster_->worker("w0")->ReadLog();
  EXPECT_THAT(cluster_->RankLog(id, 1, 0), HasSubstr("after-the-outage"));
}

// The CLI retries UNAVAILABLE, "connection refused" included, until its
// --timeout, for every verb (docs/cli.md): 20 clients submit in a loop
// while the coordinator is SIGKILLed and started again 2 s later on the same
// port and database. Not one submit fails, and each is stored once (a
// submit whose answer was lost is retried with its request id).
TEST_F(FailoverE2ETest, ACoordinatorRestartDuringASubmitStormFailsNoSubmit) {
  constexpr int kClients = 20;
  const std::string build = trainctl::testing::BuildDirOfThisTest();
  const std::string yaml = cluster_->dir() + "/storm.yaml";
  {
    std::ofstream out(yaml);
    out << "name: storm\nmodel: {name: mlp, input_dim: 5, classes: 2}\n"
           "data: {train: {format: synthetic, length: 100, size: 5, classes: 2}}\n"
           "scheduling: {wait_for_capacity: true}\n";
  }
  std::atomic<int> ok{0}, failed{0};
  std::atomic<bool> back{false};
  std::mutex mu;
  std::string first_failure;  // guarded by mu
  auto client = [&](int c) {
    int after = 0;
    for (int n = 0; after < 3 && n < 200; ++n) {
      trainctl::testing::Process submit(
          {build + "/client/trainctl", "--coordinator", cluster_->address(), "--token-file",
           cluster_->AdminTokenFile(), "--timeout", "30", "submit", yaml},
          absl::StrCat(cluster_->dir(), "/storm-", c, "-", n, ".log"));
      if (!submit.Start()) {
        ++failed;
        return;
      }
      const int status = submit.Wait(absl::Seconds(60));
      if (status >= 0 && WIFEXITED(status) && WEXITSTATUS(status) == 0) {
        ++ok;
      } else {
        ++failed;
        std::lock_guard<std::mutex> lock(mu);
        if (first_failure.empty())
          first_failure = absl::StrCat("status ", status, ": ", submit.ReadLog());
      }
      if (back) ++after;
    }
  };
  std::vector<std::thread> clients;
  for (int c = 0; c < kClients; ++c) clients.emplace_back(client, c);
  // Mid-storm: every client has submitted.
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  while (ok + failed < 2 * kClients && absl::Now() < deadline)
    absl::SleepFor(absl::Milliseconds(10));
  cluster_->KillCoordinator(SIGKILL);
  const int before_restart = ok + failed;
  absl::SleepFor(absl::Seconds(2));  // the restart's downtime (what is ridden out)
  ASSERT_TRUE(cluster_->StartCoordinator()) << cluster_->coordinator()->ReadLog();
  back = true;
  for (std::thread& t : clients) t.join();
  std::cerr << ok << " submits (" << before_restart << " before the kill), " << failed
            << " failed\n";
  EXPECT_EQ(failed, 0) << first_failure;
  EXPECT_GE(ok, 4 * kClients);
  // Each acknowledged submit is one stored job: none lost, none doubled.
  grpc::ClientContext ctx;
  v1::ListJobsRequest req;
  req.set_page_size(1000);
  v1::ListJobsResponse list;
  ASSERT_TRUE(cluster_->jobs()->ListJobs(&ctx, req, &list).ok());
  EXPECT_EQ(list.jobs_size(), ok.load());
}

TEST(FailoverE2EFlagsTest, ABadListEntryIsAConfigurationErrorNamingTheFlag) {
  const std::string dir = trainctl::testing::BuildDirOfThisTest();
  trainctl::testing::Process worker(
      {dir + "/worker/daemon/trainctl-worker", "--coordinator=127.0.0.1:7070,coord", "--slots=1",
       "--token_file=/nonexistent"},
      ::testing::TempDir() + "/bad-list.log");
  ASSERT_TRUE(worker.Start());
  int status = worker.Wait(absl::Seconds(30));
  ASSERT_TRUE(WIFEXITED(status)) << status;
  EXPECT_EQ(WEXITSTATUS(status), 2) << worker.ReadLog();
  EXPECT_THAT(worker.ReadLog(), HasSubstr("--coordinator: 'coord': expected HOST:PORT (no port)"));
}

// Over TLS each address of the list is verified for its own name: a worker
// given an unreachable address first joins the coordinator at the next
// (its certificate names 127.0.0.1) with the cluster CA.
TEST(FailoverE2ETlsTest, WorkerWithAListVerifiesTheCoordinatorItReaches) {
  Cluster cluster(trainctl::testing::BuildDirOfThisTest(), "/bin/false");
  ASSERT_TRUE(cluster.InitTls());
  ASSERT_TRUE(cluster.StartCoordinator());
  const std::string dead = absl::StrCat("127.0.0.1:", trainctl::testing::UnusedPort());
  ASSERT_TRUE(
      cluster.StartWorker("w0", 1, false, {"--coordinator=" + dead + "," + cluster.address()}));
  ASSERT_TRUE(cluster.WaitWorkers(1, absl::Seconds(30))) << cluster.worker("w0")->ReadLog();
}

}  // namespace
}  // namespace trainctl
