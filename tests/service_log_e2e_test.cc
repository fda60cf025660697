// Service logs of the real binaries: one key=value line per event.
//
//  * A worker pointed at a coordinator that is not there says so at once
//    and again at every backoff step, with the reason.
//  * A coordinator logs where it listens, the worker's registration, the
//    job's transitions and a refused request; the worker logs its
//    registration; an idle cluster logs nothing per heartbeat.
#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <unistd.h>
#include <fstream>

#include <regex>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/jobspec/job_spec.h"
#include "tests/support/cluster.h"
#include "tests/support/ports.h"
#include "tests/support/source_dir.h"

namespace trainctl {
namespace {

using ::testing::HasSubstr;
using trainctl::testing::Cluster;
using trainctl::testing::Process;
using trainctl::testing::SourceDir;

int Count(const std::string& text, const std::string& needle) {
  int n = 0;
  for (size_t pos = text.find(needle); pos != std::string::npos; pos = text.find(needle, pos + 1))
    ++n;
  return n;
}

// Waits until `p`'s log holds `needle` at least `times` times.
bool WaitLog(Process* p, const std::string& needle, int times = 1,
             absl::Duration timeout = absl::Seconds(10)) {
  for (absl::Time deadline = absl::Now() + timeout; absl::Now() < deadline;
       absl::SleepFor(absl::Milliseconds(20))) {
    if (Count(p->ReadLog(), needle) >= times) return true;
  }
  return false;
}

TEST(ServiceLogE2ETest, WorkerWithoutACoordinatorSaysSoAtOnceAndAtEveryRetry) {
  Cluster cluster(trainctl::testing::BuildDirOfThisTest(),
                  SourceDir() + "/tests/support/fake_rank.py");
  const std::string address = absl::StrCat("127.0.0.1:", testing::UnusedPort());
  // A worker token (no coordinator will ever check it).
  const std::string token_file = cluster.dir() + "/lonely.token";
  { std::ofstream(token_file) << "tct_t-00000000_" << std::string(64, 'a') << "\n"; }
  Process worker({trainctl::testing::BuildDirOfThisTest() + "/worker/daemon/trainctl-worker",
                  "--coordinator=" + address, "--slots=1",
                  "--work_dir=" + cluster.dir() + "/lonely", "--token_file=" + token_file,
                  "--rank_binary=" + SourceDir() + "/tests/support/fake_rank.py"},
                 cluster.dir() + "/lonely.log");
  const absl::Time start = absl::Now();
  ASSERT_TRUE(worker.Start());
  ASSERT_TRUE(WaitLog(&worker, "WARN worker coordinator_unreachable", 1, absl::Seconds(5)))
      << worker.ReadLog();
  EXPECT_LT(absl::Now() - start, absl::Seconds(3)) << "at once, not after a long timeout";
  // The backoff starts at 100 ms: several retries within seconds, each said.
  ASSERT_TRUE(WaitLog(&worker, "WARN worker coordinator_unreachable", 3, absl::Seconds(5)))
      << worker.ReadLog();
  const std::string log = worker.ReadLog();
  EXPECT_THAT(log, HasSubstr("coordinator=" + address + " reason=\""));
  EXPECT_THAT(log, HasSubstr("attempt=2 retry_in="));
  EXPECT_THAT(log, HasSubstr("Connection refused"));
  worker.Kill(SIGTERM);
  EXPECT_NE(worker.Wait(absl::Seconds(10)), -1);
}

TEST(ServiceLogE2ETest, CoordinatorAndWorkerLogRegistrationTransitionsAndRefusalsButNotHeartbeats) {
  Cluster cluster(trainctl::testing::BuildDirOfThisTest(),
                  SourceDir() + "/tests/support/fake_rank.py");
  ASSERT_TRUE(cluster.StartCoordinator());
  ASSERT_TRUE(cluster.StartWorker("w0", 1));
  ASSERT_TRUE(cluster.WaitWorkers(1));
  Process* coord = cluster.coordinator();
  ASSERT_TRUE(WaitLog(coord, "INFO coordinator worker_registered worker_id=")) << coord->ReadLog();
  EXPECT_THAT(coord->ReadLog(),
              HasSubstr("INFO coordinator listening address=" + cluster.address()));
  ASSERT_TRUE(WaitLog(cluster.worker("w0"), "INFO worker registered worker_id="))
      << cluster.worker("w0")->ReadLog();

  // Idle: heartbeats flow every second, the logs stay still.
  const std::string idle_before = coord->ReadLog() + cluster.worker("w0")->ReadLog();
  absl::SleepFor(absl::Milliseconds(2500));
  EXPECT_EQ(coord->ReadLog() + cluster.worker("w0")->ReadLog(), idle_before)
      << "nothing per heartbeat";

  ParsedJobSpec p = ParseJobSpecYaml(
      "model: {name: mlp, input_dim: 5, classes: 2}\n"
      "data: {train: {format: synthetic, length: 100, size: 5, classes: 2}}\n",
      "log.yaml", {"name=ok", "world_size=1", "training.epochs=1"});
  ASSERT_TRUE(p.ok());
  const std::string id = cluster.Submit(p.spec);
  ASSERT_EQ(cluster.WaitState(id, v1::JOB_STATE_SUCCEEDED, absl::Seconds(30)).state(),
            v1::JOB_STATE_SUCCEEDED);
  ASSERT_TRUE(WaitLog(coord, " to=SUCCEEDED")) << coord->ReadLog();
  const std::string log = coord->ReadLog();
  for (const char* to : {"PENDING", "SCHEDULED", "RUNNING", "SUCCEEDED"}) {
    EXPECT_TRUE(std::regex_search(
        log, std::regex("INFO coordinator job_state job_id=" + id + " from=[A-Z]+ to=" + to)))
        << to << "\n"
        << log;
  }

  EXPECT_TRUE(WaitLog(cluster.worker("w0"),
                      "INFO worker rank_exited job_id=" + id + " attempt=1 rank=0 pid="))
      << cluster.worker("w0")->ReadLog();
  EXPECT_THAT(cluster.worker("w0")->ReadLog(),
              HasSubstr("INFO worker rank_started job_id=" + id + " attempt=1 rank=0"));

  // A refused request: the client's address, how many refusals the line
  // stands for, its method, code and reason (at once, or, after another
  // refusal from this address in the last 10 s, with the count then).
  grpc::ClientContext ctx;
  v1::GetJobRequest req;
  req.set_job_id("no-such-job");
  v1::Job ignored;
  EXPECT_EQ(cluster.jobs()->GetJob(&ctx, req, &ignored).error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_TRUE(WaitLog(coord, "method=GetJob code=NOT_FOUND reason=", 1, absl::Seconds(20)))
      << coord->ReadLog();
  EXPECT_THAT(coord->ReadLog(), HasSubstr("INFO coordinator rpc_refused peer=127.0.0.1 count="));

  // The worker goes away: the coordinator says why.
  cluster.KillWorker("w0", SIGTERM);
  EXPECT_TRUE(WaitLog(coord, "worker_session_ended worker_id=")) << coord->ReadLog();
  EXPECT_THAT(coord->ReadLog(), HasSubstr("reason=\"goodbye (the daemon is shutting down)\""));
}

}  // namespace
}  // namespace trainctl
